"""Idempotency keys declared per server: one key per logical call; retries for a trusted server that honours them."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

from dispatcher import (
    CallStatus,
    ConfigurationError,
    Dispatcher,
    Effect,
    IdempotencyKeys,
    RetryPolicy,
    ToolCall,
)
from dispatcher.examples import Workspace
from dispatcher.testing import inject_faults

pytestmark = pytest.mark.anyio

KEYED = IdempotencyKeys(argument="idempotency_key")
FAST_RETRY = RetryPolicy(attempts=3, wait_initial=0.01, wait_max=0.02, jitter=False)
APPEND = ToolCall("a", "append_note", {"name": "log", "text": "paid"})


def recording_server() -> tuple[MCPServer[Any], list[tuple[str, Any]]]:
    """A server whose `pay` tool records the key each attempt got, in its argument or its `_meta`."""
    server: MCPServer[Any] = MCPServer("payments")
    seen: list[tuple[str, Any]] = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False))
    async def pay(amount: int, ctx: Context, idempotency_key: str | None = None) -> str:
        meta = ctx.request_context.meta
        from_meta = None if meta is None else dict(meta).get("io.example/key")
        seen.append((str(amount), idempotency_key or from_meta))
        return "paid"

    return server, seen


def test_idempotency_keys_are_checked() -> None:
    """Exactly one of argument= and meta=, a non-empty name; anything else says what to pass."""
    with pytest.raises(ConfigurationError, match="exactly one"):
        IdempotencyKeys()
    with pytest.raises(ConfigurationError, match="exactly one"):
        IdempotencyKeys(argument="k", meta="m")
    with pytest.raises(ConfigurationError, match="non-empty"):
        IdempotencyKeys(argument="")


async def test_every_attempt_carries_the_same_key_and_the_model_cannot_choose_it() -> None:
    """Attempts of one call share one key; two calls have two; a model's value for the argument is replaced."""
    server, seen = recording_server()
    faults = inject_faults(server, rate=0.0)
    faults.fail_next("pay", "drop", strike="after")  # the first attempt runs, and its answer is lost
    async with Dispatcher(retry=FAST_RETRY) as d:
        await d.connect("pay", server, trusted=True, idempotency=KEYED)
        results = await d.dispatch(
            [ToolCall("p1", "pay", {"amount": 1}), ToolCall("p2", "pay", {"amount": 2, "idempotency_key": "mine"})]
        )
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK]
    assert results[0].attempts == 2 and results[0].effect is Effect.RAN
    keys = [key for _, key in seen]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2]
    assert "mine" not in keys and all(key is not None and len(key) == 32 for key in keys)


async def test_keys_differ_between_dispatchers() -> None:
    """The same call in another dispatcher (another session) gets another key: keys cannot be guessed."""
    keys = []
    for _ in range(2):
        server, seen = recording_server()
        async with Dispatcher() as d:
            await d.connect("pay", server, trusted=True, idempotency=KEYED)
            await d.dispatch([ToolCall("p1", "pay", {"amount": 1})])
        keys.append(seen[0][1])
    assert keys[0] != keys[1]


async def test_a_key_in_meta() -> None:
    """`IdempotencyKeys(meta=...)` sends the key as a `_meta` entry, the arguments unchanged."""
    server, seen = recording_server()
    async with Dispatcher() as d:
        await d.connect("pay", server, trusted=True, idempotency=IdempotencyKeys(meta="io.example/key"))
        [result] = await d.dispatch([ToolCall("p1", "pay", {"amount": 1})])
    assert result.ok
    assert seen[0][1] is not None and len(seen[0][1]) == 32


async def test_a_key_honouring_workspace_applies_a_retried_write_once() -> None:
    """A non-idempotent write whose answer is lost after it ran is retried with its key and applied once."""
    workspace = Workspace(idempotency_key="idempotency_key")
    faults = inject_faults(workspace.server, rate=0.0)
    faults.fail_next("append_note", "drop", strike="after")
    async with Dispatcher(retry=FAST_RETRY) as d:
        await d.connect("ws", workspace.server, trusted=True, idempotency=KEYED)
        [result] = await d.dispatch([APPEND])
    assert result.ok and result.attempts == 2 and result.effect is Effect.RAN
    assert workspace.notes == {"log": "paid"}  # appended once
    assert list(workspace.applied_by_key.values()) == [1]


async def test_without_keys_or_trust_nothing_changes() -> None:
    """The same lost answer: a trusted server without keys, or an untrusted one with keys, is not retried."""
    for trusted, idempotency in ((True, None), (False, KEYED)):
        workspace = Workspace(idempotency_key="idempotency_key")
        faults = inject_faults(workspace.server, rate=0.0)
        faults.fail_next("append_note", "drop", strike="after")
        async with Dispatcher(retry=FAST_RETRY) as d:
            await d.connect("ws", workspace.server, trusted=trusted, idempotency=idempotency)
            [result] = await d.dispatch([APPEND])
        assert result.status is CallStatus.FAILED and result.attempts == 1, (trusted, idempotency)
        assert result.effect is Effect.UNKNOWN
        assert workspace.notes == {"log": "paid"}


async def test_the_oracle_catches_a_server_that_ignores_keys() -> None:
    """Declared keyed but not deduplicating, a retried write is applied twice: the count the tests check catches it."""
    server: MCPServer[Any] = MCPServer("forgetful")
    applied: list[str] = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=False))
    async def append(text: str, idempotency_key: str | None = None) -> str:
        applied.append(text)
        return "ok"

    faults = inject_faults(server, rate=0.0)
    faults.fail_next("append", "drop", strike="after")
    async with Dispatcher(retry=FAST_RETRY) as d:
        await d.connect("f", server, trusted=True, idempotency=KEYED)
        [result] = await d.dispatch([ToolCall("a", "append", {"text": "x"})])
    assert result.ok and result.attempts == 2
    assert applied == ["x", "x"]  # what a key-honouring server must prevent, and the workspace test checks


async def test_reads_carry_no_key_and_keep_their_rules() -> None:
    """A read-only tool of a keyed server gets no key, and is retried only as any read is."""
    server: MCPServer[Any] = MCPServer("reads")
    seen: list[dict[str, Any]] = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(ctx: Context, key: str) -> str:
        seen.append(dict(ctx.request_context.meta or {}))
        return key

    faults = inject_faults(server, rate=0.0)
    faults.fail_next("lookup", "drop", strike="after")
    async with Dispatcher(retry=RetryPolicy(attempts=3, wait_initial=0.01, retry_read_only=False)) as d:
        await d.connect("r", server, trusted=True, idempotency=IdempotencyKeys(meta="io.example/key"))
        [result] = await d.dispatch([ToolCall("l", "lookup", {"key": "k"})])
    assert result.status is CallStatus.FAILED and result.attempts == 1  # not made repeatable by the key rule
    assert len(seen) == 1 and "io.example/key" not in seen[0]
