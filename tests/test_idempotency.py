"""Idempotency keys declared per server: one key per logical call; retries for a trusted server that honours them."""

from __future__ import annotations

import json
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
    ToolEntry,
)
from dispatcher.examples import Workspace
from dispatcher.formats import anthropic_tools, openai_chat_tools, openai_responses_tools, tool_schema
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


def _required_key_server() -> tuple[MCPServer[Any], list[str]]:
    """A server whose `charge` write requires the key argument, and whose `balance` read declares it too."""
    server: MCPServer[Any] = MCPServer("ledger")
    seen: list[str] = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False))
    async def charge(amount: int, idempotency_key: str) -> str:
        seen.append(idempotency_key)
        return "charged"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def balance(idempotency_key: str | None = None) -> str:
        return "0"

    return server, seen


async def test_the_key_argument_is_not_shown_to_the_model_in_any_tool_list() -> None:
    """The formats' tool lists and the integrations' tools leave the key argument out; the call still gets it."""
    server, seen = _required_key_server()
    async with Dispatcher() as d:
        await d.connect("ledger", server, trusted=True, idempotency=KEYED)
        entries = {entry.tool: entry for entry in d.tools()}
        charge = entries["charge"]
        assert "idempotency_key" in charge.input_schema["properties"]  # the server's own schema is kept
        assert charge.filled_arguments == {"idempotency_key"}
        shown = [
            *(tool_schema(entry) for entry in entries.values()),
            *(tool["input_schema"] for tool in anthropic_tools(entries.values())),
            *(tool["function"]["parameters"] for tool in openai_chat_tools(entries.values())),
            *(tool["parameters"] for tool in openai_responses_tools(entries.values())),
            *_integration_schemas(d),
        ]
        assert len(shown) in (8, 12)
        for schema in shown:
            assert "idempotency_key" not in schema.get("properties", {}), schema
            assert "idempotency_key" not in schema.get("required", []), schema
        assert any("amount" in schema["properties"] for schema in shown)
        # A model that never saw the argument, or sends one anyway: the dispatcher's key goes in either way.
        results = await d.dispatch(
            [
                ToolCall("c1", "charge", {"amount": 1}),
                ToolCall("c2", "charge", {"amount": 2, "idempotency_key": "model-chosen"}),
            ]
        )
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK], [r.error for r in results]
    assert len(seen) == 2 and "model-chosen" not in seen and all(len(key) == 32 for key in seen), seen
    assert seen[0] != seen[1]


def _integration_schemas(d: Dispatcher) -> list[dict[str, Any]]:
    """The schemas two integrations give their frameworks (none when their extras are not installed)."""
    try:
        from agents import FunctionTool

        from dispatcher.integrations.langgraph import DispatcherToolNode
        from dispatcher.integrations.openai_agents import DispatcherTools
    except ImportError:
        return []
    return [
        *(tool["function"]["parameters"] for tool in DispatcherToolNode(d).tool_schemas()),
        *(tool.params_json_schema for tool in DispatcherTools(d).tools if isinstance(tool, FunctionTool)),
    ]


async def test_without_keys_the_argument_is_the_models() -> None:
    """A server not declared to take keys: an argument of that name is an ordinary one, shown and sent."""
    server, seen = _required_key_server()
    async with Dispatcher() as d:
        await d.connect("ledger", server, trusted=True)
        entry = next(entry for entry in d.tools() if entry.tool == "charge")
        assert entry.filled_arguments == frozenset()
        assert "idempotency_key" in tool_schema(entry)["required"]
        [result] = await d.dispatch([ToolCall("c", "charge", {"amount": 1, "idempotency_key": "mine"})])
    assert result.ok and seen == ["mine"], result.error


def test_the_key_argument_is_hidden_where_else_the_schema_declares_or_requires_it() -> None:
    """A schema that declares or requires the key in allOf/anyOf/oneOf, if/then/else or dependentRequired
    (twice, nested): the model's schema mentions it nowhere, and every other argument stays."""
    key = {"type": "string"}
    branch = {"properties": {"idempotency_key": key, "note": key}, "required": ["idempotency_key", "idempotency_key"]}
    schema = {
        "type": "object",
        "properties": {"amount": {"type": "integer"}, "idempotency_key": key},
        "required": ["amount", "idempotency_key", "idempotency_key"],
        "allOf": [branch, {"anyOf": [branch, {"oneOf": [branch]}]}],
        "if": branch,
        "then": branch,
        "else": {"required": ["idempotency_key"]},
        "dependentRequired": {"amount": ["idempotency_key", "note"], "idempotency_key": ["amount"]},
    }
    entry = ToolEntry(
        "charge",
        "ledger",
        "charge",
        ToolAnnotations(),
        trusted=True,
        input_schema=schema,
        filled_arguments=frozenset({"idempotency_key"}),
    )
    shown = [
        tool_schema(entry),
        anthropic_tools([entry])[0]["input_schema"],
        openai_chat_tools([entry])[0]["function"]["parameters"],
        openai_responses_tools([entry])[0]["parameters"],
    ]
    for each in shown:
        assert "idempotency_key" not in json.dumps(each), each
        assert each["required"] == ["amount"] and each["dependentRequired"] == {"amount": ["note"]}, each
        assert each["allOf"][0]["properties"] == {"note": key}, each
    assert "idempotency_key" in json.dumps(entry.input_schema)  # the server's own schema is kept
