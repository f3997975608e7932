"""Idempotency keys: one key per logical call, for servers the user declares to deduplicate by it.

MCP has no idempotency key for ``tools/call``. A server may still take one, in an argument or in the
request's ``_meta``; the user says so when registering it (`IdempotencyKeys`). Each call of a tool that
may mutate on such a server then carries a key that is the same on every attempt and across
reconnects (it is computed once, when the call is queued), differs between calls, and cannot be
guessed outside this dispatcher: an HMAC-SHA256, under a secret drawn for each dispatcher, of the
call's identity (its batch's number, its place and id in the batch, its server and tool). No model
chooses a key: on a server that takes it in an argument, that argument is the dispatcher's on every
call (whatever the model put there is dropped, on reads too, or a call queued while its tool was
read-only would carry the model's key once the tool turned into a write).

A key taken in an argument reaches only a tool that declares that argument in its input schema: the
SDK's servers drop arguments a tool does not declare, so a key sent to such a tool would be
silently lost, and the retry it allowed would repeat the write (`takes_key`). A key taken in ``_meta``
reaches every tool, task-augmented calls included.

A trusted server declared to honour keys deduplicates repeated attempts, so its non-idempotent tools
that carry the key become retryable on transient failures (`_retry.eligible`). For an untrusted server
the key is still sent, and nothing else changes: its claim to deduplicate is not believed.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import ConfigurationError

__all__ = ["IdempotencyKeys", "call_key", "takes_key"]

# A `_meta` key as the MCP specification writes it: an optional prefix of dot-separated labels ending
# in "/", then a name that begins and ends with a letter or digit.
_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_META_KEY = re.compile(rf"(?:((?:{_LABEL}\.)*{_LABEL})/)?([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
# Prefixes with one of these labels are reserved for MCP (the spec's rule, and "io.modelcontextprotocol/"
# that the SDK stamps on every 2026-07-28 request).
_RESERVED_LABELS = frozenset({"modelcontextprotocol", "mcp"})
# Names without a prefix that the SDK writes into a request's `_meta` itself: its progress token, and
# the W3C trace context it injects. A key under one of them would overwrite it, or be overwritten.
_SDK_NAMES = frozenset({"progressToken", "traceparent", "tracestate", "baggage"})


@dataclass(frozen=True, kw_only=True, slots=True)
class IdempotencyKeys:
    """How a server takes an idempotency key, given to `Dispatcher.connect` or `add_mcp_server`.

    Give exactly one of the two.

    Args:
        argument: The name of the tool argument that carries the key. Only tools that declare it in
            their input schema get a key (and become retryable); the dispatcher owns the argument on
            every call of the server, the model's value is never sent.
        meta: The key of the request's ``_meta`` entry that carries it (e.g.
            ``"io.example/idempotency-key"``), in MCP's format for ``_meta`` keys and outside the
            names MCP and its SDK use (``io.modelcontextprotocol/...``, ``progressToken``).

    Raises:
        ConfigurationError: Neither or both are given, one is not a non-empty string, or the `_meta`
            key is malformed or reserved.
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
        if self.meta is not None:
            _check_meta_key(self.meta)


def _check_meta_key(name: str) -> None:
    """Refuse a `_meta` key the spec's format does not allow, or that MCP or the SDK uses."""
    found = _META_KEY.fullmatch(name)
    if found is None:
        raise ConfigurationError(
            f"IdempotencyKeys(meta={name!r}) is not a _meta key in MCP's format: an optional prefix of "
            "dot-separated labels ending in '/', then a name that starts and ends with a letter or digit "
            "(such as 'io.example/idempotency-key')"
        )
    prefix = found.group(1)
    if prefix is not None and _RESERVED_LABELS & {label.lower() for label in prefix.split(".")}:
        raise ConfigurationError(
            f"IdempotencyKeys(meta={name!r}) uses a _meta prefix MCP reserves for itself; use one of your own "
            "(such as 'io.example/idempotency-key')"
        )
    if prefix is None and name in _SDK_NAMES:
        raise ConfigurationError(
            f"IdempotencyKeys(meta={name!r}) is a _meta key the MCP SDK writes itself; use one of your own "
            "(such as 'io.example/idempotency-key')"
        )


def takes_key(keys: IdempotencyKeys, input_schema: Mapping[str, Any]) -> bool:
    """Whether a tool can carry its server's key: in `_meta` any can; as an argument, one that declares it."""
    if keys.argument is None:
        return True
    properties = input_schema.get("properties")
    return isinstance(properties, Mapping) and keys.argument in properties


def call_key(secret: bytes, batch: int, position: int, call_id: str, server: str, tool: str) -> str:
    """The key of one logical call: stable for the call, unguessable without `secret`."""
    identity = f"{batch}\x00{position}\x00{call_id}\x00{server}\x00{tool}".encode("utf-8", "surrogatepass")
    return hmac.new(secret, identity, hashlib.sha256).hexdigest()[:32]
