"""Idempotency keys: one key per logical call, for servers the user declares to deduplicate by it.

MCP has no idempotency key for ``tools/call``. A server may still take one, in an argument or in the
request's ``_meta``; the user says so when registering it (`IdempotencyKeys`). Each call of a tool that
may mutate on such a server then carries a key that is the same on every attempt and across
reconnects (it is computed once, when the call is queued), differs between calls, and cannot be
guessed outside this dispatcher: an HMAC-SHA256, under a secret drawn for each dispatcher, of the
call's identity (its batch's number, its place and id in the batch, its server and tool). Whatever the
model put under the key's name is replaced: no model chooses a key.

A trusted server declared to honour keys deduplicates repeated attempts, so its non-idempotent tools
become retryable on transient failures (`_retry.eligible`). For an untrusted server the key is still
sent, and nothing else changes: its claim to deduplicate is not believed.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from ._errors import ConfigurationError

__all__ = ["IdempotencyKeys", "call_key"]


@dataclass(frozen=True, kw_only=True, slots=True)
class IdempotencyKeys:
    """How a server takes an idempotency key, given to `Dispatcher.connect` or `add_mcp_server`.

    Give exactly one of the two.

    Args:
        argument: The name of the tool argument that carries the key (the server's tools declare it).
        meta: The key of the request's ``_meta`` entry that carries it (e.g.
            ``"io.example/idempotency-key"``).

    Raises:
        ConfigurationError: Neither or both are given, or one is not a non-empty string.
    """

    argument: str | None = None
    meta: str | None = None

    def __post_init__(self) -> None:
        given = [value for value in (self.argument, self.meta) if value is not None]
        if len(given) != 1:
            raise ConfigurationError(
                "IdempotencyKeys takes exactly one of argument= (the tool argument that carries the key) "
                "or meta= (the _meta entry that carries it)"
            )
        if not isinstance(given[0], str) or not given[0]:
            raise ConfigurationError(f"IdempotencyKeys needs a non-empty name, got {given[0]!r}")


def call_key(secret: bytes, batch: int, position: int, call_id: str, server: str, tool: str) -> str:
    """The key of one logical call: stable for the call, unguessable without `secret`."""
    identity = f"{batch}\x00{position}\x00{call_id}\x00{server}\x00{tool}".encode("utf-8", "surrogatepass")
    return hmac.new(secret, identity, hashlib.sha256).hexdigest()[:32]
