"""Attacks on unknown outcomes, idempotency keys and fail-fast (issue 23), each by the adversary it fears.

A hostile or broken server (one that answers with an error after doing the work, answers twice, never
answers, loses its connection after the request), a model that picks odd keys, a configuration that
cannot work, a batch cancelled mid-send. For every call the effect claimed must be true: NEVER_RAN only
when the request provably never left, RAN only when the server answered, UNKNOWN otherwise; and no retry
repeats a write whose outcome is unknown unless its key makes the repeat harmless. The tests that found
a hole fail on the code before their fix (each docstring says which).
"""

from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, ConfigurationError, Dispatcher, Effect, IdempotencyKeys, RetryPolicy, ToolCall
from dispatcher._driver._coordination import Lease
from dispatcher.examples import Workspace
from dispatcher.examples._http import serve_http
from dispatcher.testing import inject_faults

from .chaos.harness import DroppingProxy
from .ledger import Entry, Ledger
from .task_server import TaskScript
from .test_effects import check_effects, started, workspace_command

if TYPE_CHECKING:
    import pathlib
    from collections.abc import AsyncIterator, Callable, Collection, Hashable

pytestmark = pytest.mark.anyio

KEYED = IdempotencyKeys(argument="idempotency_key")
RETRY = RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.002, jitter=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)


# Keys --------------------------------------------------------------------------------------------


async def test_a_task_call_carries_its_meta_key_on_every_attempt() -> None:
    """A write run as a task on a server that takes keys in `_meta`: each attempt carries the call's key.

    Before the fix a task's request carried no `_meta` of ours, yet the call counted as keyed and was
    retried: the server saw the same write twice with nothing to tell them apart.
    """
    script = TaskScript(poll_interval=50, finish_after=0, call_errors=1, tool_annotations={"readOnlyHint": False})
    async with Dispatcher(retry=RETRY) as d:
        await d.connect(
            "tasks", script.client, trusted=True, idempotency=IdempotencyKeys(meta="io.example/idempotency-key")
        )
        [result] = await d.dispatch([ToolCall("t", "slow", {})])
    assert result.ok and result.attempts == 2, result.error
    keys = [call.get("_meta", {}).get("io.example/idempotency-key") for call in script.calls]
    assert len(keys) == 2 and keys[0] is not None and keys[0] == keys[1], script.calls


def _appender(*, declares_key: bool) -> tuple[MCPServer[Any], list[str]]:
    """A server with one non-idempotent write, which takes the key argument only if `declares_key`."""
    server: MCPServer[Any] = MCPServer("appender")
    applied: list[str] = []
    answers: dict[str, str] = {}

    if declares_key:

        @server.tool(name="append", annotations=WRITE)
        async def append_keyed(text: str, idempotency_key: str | None = None) -> str:
            if idempotency_key in answers:
                return answers[idempotency_key]
            applied.append(text)
            answers[str(idempotency_key)] = "appended"
            return "appended"

    else:

        @server.tool(name="append", annotations=WRITE)
        async def append(text: str) -> str:
            applied.append(text)
            return "appended"

    return server, applied


async def test_a_tool_that_does_not_declare_the_key_argument_is_not_retried() -> None:
    """A keyed server's write whose schema has no key argument gets no key and is not repeated.

    Before the fix the key was added anyway; the SDK's server drops arguments a tool does not declare,
    so the retried write (its answer lost after it ran) was applied twice.
    """
    server, applied = _appender(declares_key=False)
    faults = inject_faults(server, rate=0.0)
    faults.fail_next("append", "drop", strike="after")
    async with Dispatcher(retry=RETRY) as d:
        await d.connect("a", server, trusted=True, idempotency=KEYED)
        [result] = await d.dispatch([ToolCall("w", "append", {"text": "x"})])
    assert result.attempts == 1 and result.effect is Effect.UNKNOWN, (result.attempts, result.error)
    assert applied == ["x"], "a write was applied twice"
    assert "idempotency_key" not in faults.ledger[0].arguments


async def test_a_tool_that_declares_the_key_argument_is_retried_and_applied_once() -> None:
    """The same write on a tool that declares the key: retried with its key, applied once (the oracle's other side)."""
    server, applied = _appender(declares_key=True)
    faults = inject_faults(server, rate=0.0)
    faults.fail_next("append", "drop", strike="after")
    async with Dispatcher(retry=RETRY) as d:
        await d.connect("a", server, trusted=True, idempotency=KEYED)
        [result] = await d.dispatch([ToolCall("w", "append", {"text": "x"})])
    assert result.ok and result.attempts == 2
    assert applied == ["x"]


async def test_the_model_never_chooses_the_key_argument() -> None:
    """On a keyed server the key argument is the dispatcher's on every call: a read gets none of the model's.

    Before the fix only writes had the model's value replaced; a read (or a call queued while its tool
    was read-only and run after it turned into a write) passed the model's key on to the server.
    """
    server: MCPServer[Any] = MCPServer("lookup")
    seen: list[object] = []

    @server.tool(annotations=READ)
    async def lookup(name: str, idempotency_key: str | None = None) -> str:
        seen.append(idempotency_key)
        return "found"

    async with Dispatcher() as d:
        await d.connect("l", server, trusted=True, idempotency=KEYED)
        [result] = await d.dispatch([ToolCall("r", "lookup", {"name": "a", "idempotency_key": "chosen-by-the-model"})])
    assert result.ok
    assert seen == [None]


async def test_odd_keys_from_the_model_never_reach_a_write() -> None:
    """A model's key of any type or size, or one a server echoed back earlier, is replaced by the call's own.

    The echoed one replays the key the server showed for an earlier write (a result that quotes it):
    taken, a new payment would read as a repeat of the first and be dropped.
    """
    server: MCPServer[Any] = MCPServer("payments")
    applied: dict[str, int] = {}

    @server.tool(annotations=WRITE)
    async def pay(amount: int, idempotency_key: str | None = None) -> str:
        if idempotency_key in applied:
            return f"already paid under {idempotency_key}"
        applied[str(idempotency_key)] = amount
        return f"paid {amount} under {idempotency_key}"

    async with Dispatcher() as d:
        await d.connect("p", server, trusted=True, idempotency=KEYED)
        [first] = await d.dispatch([ToolCall("p0", "pay", {"amount": 0})])
        assert first.result is not None
        echoed = str(getattr(first.result.content[0], "text", "")).rsplit(" ", 1)[-1]
        odd: list[object] = [echoed, 12345, None, {"$ne": ""}, "k" * 100_000]
        for i, key in enumerate(odd, start=1):
            [result] = await d.dispatch([ToolCall(f"p{i}", "pay", {"amount": i, "idempotency_key": key})])
            assert result.ok and result.result is not None, key
            assert str(getattr(result.result.content[0], "text", "")).startswith("paid"), key
    assert sorted(applied.values()) == list(range(len(odd) + 1)), "a payment was taken for another"
    assert all(len(k) == 32 and k.isalnum() for k in applied)  # the dispatcher's keys, one per call


@pytest.mark.parametrize(
    "name",
    [
        "progressToken",
        "traceparent",
        "io.modelcontextprotocol/protocolVersion",
        "modelcontextprotocol.io/key",
        "dev.mcp/key",
        "bad name",
        "-key",
        "io.example/",
        "a..b/key",
    ],
)
def test_meta_names_mcp_reserves_or_forbids_are_refused(name: str) -> None:
    """A `_meta` name that MCP or the SDK uses, or that breaks the spec's key format, is refused up front.

    Before the fix `meta="progressToken"` was taken, and the SDK's progress token then overwrote or
    was overwritten by the key.
    """
    with pytest.raises(ConfigurationError, match="_meta"):
        IdempotencyKeys(meta=name)


@pytest.mark.parametrize("name", ["io.example/idempotency-key", "idempotencyKey", "com.example.api/Idempotency-Key"])
def test_meta_names_of_the_users_own_are_taken(name: str) -> None:
    """Names in the spec's format, outside MCP's reserved prefixes, are accepted."""
    assert IdempotencyKeys(meta=name).meta == name


# Fail-fast ---------------------------------------------------------------------------------------


async def test_a_write_skipped_as_it_is_submitted_stops_only_what_conflicts_with_it() -> None:
    """Streamed calls: a write skipped on arrival keeps its keys, so an independent read after it runs.

    Before the fix a call skipped as it was submitted kept no keys (the root key, which conflicts with
    everything), and every later call of the batch was skipped behind it.
    """
    ran: list[tuple[str, str]] = []

    async def write(path: str) -> str:
        ran.append(("write", path))
        if path.startswith("bad"):
            raise RuntimeError(f"cannot write {path}")
        return "written"

    async def read(path: str) -> str:
        ran.append(("read", path))
        return "content"

    async with Dispatcher(fail_fast=True) as d:
        for tool, hints in ((write, WRITE), (read, READ)):
            d.add_function(tool, annotations=hints, domain="files", keys=lambda arguments: str(arguments["path"]))
        async with d.batch() as batch:
            await batch.submit(ToolCall("c0", "write", {"path": "bad"})).wait()
            batch.submit(ToolCall("c1", "write", {"path": "bad"}))  # depends on c0: skipped on arrival
            batch.submit(ToolCall("c2", "read", {"path": "bad"}))  # depends on c1 (and c0)
            batch.submit(ToolCall("c3", "read", {"path": "other"}))  # independent
        results = batch.results()
    assert [r.status for r in results] == [CallStatus.TOOL_ERROR, CallStatus.FAILED, CallStatus.FAILED, CallStatus.OK]
    assert ran == [("write", "bad"), ("read", "other")]


# Fleet holds -------------------------------------------------------------------------------------


class _ExpiredLeases:
    """A coordinator whose every hold is already past its lease: the check before the send fails."""

    @asynccontextmanager
    async def hold(
        self,
        *,
        server: str,
        exclusive: bool,
        keys: Collection[Hashable] = (),
        on_lost: Callable[[str], None],
    ) -> AsyncIterator[Lease | None]:
        lease = Lease(server, on_lost)
        lease.valid_until = anyio.current_time() - 1.0
        yield lease

    def retry_budget(self, server: str, capacity: float, refill: float) -> None:
        return None


@pytest.mark.parametrize("owner", ["user", "dispatcher"])
async def test_a_hold_lost_before_the_send_never_ran_whoever_owns_the_client(owner: str) -> None:
    """A write whose fleet hold fails its check before the send reads NEVER_RAN, and its text does not say it may run.

    Before the fix a user's `mcp.Client` marked the send before the check: the call read UNKNOWN, and
    both kinds told the model it "may still be running on the server", though nothing was sent.
    """
    workspace = Workspace()
    call = ToolCall("w", "append_note", {"name": "a", "text": "x"})
    async with Dispatcher(coordinator=_ExpiredLeases()) as d:
        if owner == "user":
            async with Client(workspace.server) as client:
                await d.add_mcp_server("ws", client, trusted=True)
                [result] = await d.dispatch([call])
        else:
            await d.connect("ws", workspace.server, trusted=True)
            [result] = await d.dispatch([call])
    assert workspace.ledger == ()
    assert result.status is CallStatus.FAILED and result.effect is Effect.NEVER_RAN, (result.effect, result.error)
    assert "may still be running" not in str(result.error)


# Hostile answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("keyed", [True, False], ids=["keys", "no-keys"])
async def test_a_write_that_answers_only_after_the_deadline(keyed: bool) -> None:
    """A write that does its work and answers only after the call timeout: UNKNOWN; keyed, retried and applied once."""
    workspace = Workspace(idempotency_key="idempotency_key" if keyed else None)
    faults = inject_faults(workspace.server, rate=0.0)
    faults.fail_next("append_note", "hang", strike="after")
    async with Dispatcher(retry=RETRY, call_timeout=0.2) as d:
        await d.connect("ws", workspace.server, trusted=True, idempotency=KEYED if keyed else None)
        [result] = await d.dispatch([ToolCall("w", "append_note", {"name": "log", "text": "paid"})])
    assert workspace.notes == {"log": "paid"}, "applied once"
    if keyed:
        assert result.ok and result.attempts == 2 and result.effect is Effect.RAN
    else:
        assert result.status is CallStatus.TIMEOUT and result.attempts == 1 and result.effect is Effect.UNKNOWN


class _Twice:
    """A scripted MCP server (raw JSON-RPC over memory streams) that answers each `tools/call` twice.

    The first answer is an error (-32603, after the work was done) and the second a result, for the
    same request id. What counts is the first answer to a pending request.
    """

    def __init__(self) -> None:
        self.executed: list[str] = []

    def client(self) -> Client:
        return Client(self._transport(), mode="legacy")

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        from mcp.shared.message import SessionMessage
        from mcp.types import ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse

        to_client, client_read = anyio.create_memory_object_stream[SessionMessage | Exception](100)
        client_write, from_client = anyio.create_memory_object_stream[SessionMessage](100)
        tools = [
            {"name": "pay", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": False}},
            {"name": "ping", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        ]

        async def answer(request_id: Any, result: dict[str, Any]) -> None:
            await to_client.send(SessionMessage(JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)))

        async def serve() -> None:
            async with to_client, from_client:
                async for item in from_client:
                    message = item.message
                    if not isinstance(message, JSONRPCRequest):
                        continue
                    if message.method == "initialize":
                        await answer(
                            message.id,
                            {
                                "protocolVersion": "2025-11-25",
                                "capabilities": {"tools": {}},
                                "serverInfo": {"name": "twice", "version": "1"},
                            },
                        )
                    elif message.method == "tools/list":
                        await answer(message.id, {"tools": tools})
                    elif message.method == "tools/call":
                        name = (message.params or {}).get("name")
                        self.executed.append(str(name))
                        text = {"content": [{"type": "text", "text": f"{name} done"}]}
                        if name == "pay":
                            error = ErrorData(code=-32603, message="failed, honest")
                            reply = JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
                            await to_client.send(SessionMessage(reply))
                            await answer(message.id, text)
                        else:
                            await answer(message.id, text)
                    else:
                        await answer(message.id, {})

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            try:
                yield client_read, client_write
            finally:
                tg.cancel_scope.cancel()


async def test_a_server_that_answers_twice() -> None:
    """The first answer counts (an error after the work: UNKNOWN, not retried); the second reaches no other call."""
    server = _Twice()
    async with Dispatcher(retry=RETRY) as d:
        await d.connect("twice", server.client, trusted=True)
        results = await d.dispatch([ToolCall("p", "pay", {}), ToolCall("q", "ping", {})])
    pay, ping = results
    assert pay.status is CallStatus.FAILED and pay.effect is Effect.UNKNOWN and pay.attempts == 1
    assert ping.ok and ping.effect is Effect.RAN
    assert ping.result is not None and getattr(ping.result.content[0], "text", "") == "ping done"
    assert server.executed == ["pay", "ping"]


# Over the wire: cancellation mid-send, connections cut after the request -------------------------


@asynccontextmanager
async def _http(workspace: Workspace) -> AsyncIterator[DroppingProxy]:
    """The workspace over streamable HTTP (in process, its own thread) behind a proxy that can cut answers."""
    async with serve_http(workspace.server, shutdown_timeout=0.5) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with DroppingProxy(port) as proxy:
            yield proxy


async def _wait_for(condition: Callable[[], bool]) -> None:
    """Until `condition` holds (polled: the server runs on another thread or in another process)."""
    with anyio.fail_after(20):
        while not condition():  # noqa: ASYNC110  # another thread or process changes it: no event to wait on
            await anyio.sleep(0.01)


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.subprocess
async def test_cancelling_a_batch_mid_send(transport: str, tmp_path: pathlib.Path) -> None:
    """Over stdio and HTTP: the write the server runs reads UNKNOWN, the write queued behind it NEVER_RAN."""
    calls = [
        ToolCall("w1", "append_note", {"name": "a", "text": "x"}),
        ToolCall("w2", "set_note", {"name": "b", "text": "y"}),
    ]
    async with contextlib.AsyncExitStack() as stack:
        if transport == "stdio":
            ledger = tmp_path / "ledger.jsonl"
            target: Any = workspace_command(ledger, "--latency", "30")

            def executed() -> list[str]:
                return started(ledger)
        else:
            workspace = Workspace(latency_by_tool={"append_note": 30.0})
            target = (await stack.enter_async_context(_http(workspace))).url()

            def executed() -> list[str]:
                return [run.tool for run in workspace.ledger]

        d = await stack.enter_async_context(Dispatcher())
        await d.connect("ws", target, trusted=True)
        batch = d.batch()
        batch.submit_all(calls)
        await _wait_for(lambda: executed() == ["append_note"])
        batch.cancel()
        results = await batch.wait()
    assert [r.status for r in results] == [CallStatus.CANCELLED, CallStatus.CANCELLED]
    assert [r.effect for r in results] == [Effect.UNKNOWN, Effect.NEVER_RAN]
    check_effects(results, executed())


async def test_the_oracle_catches_a_key_sent_to_a_tool_that_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every write of a keyed server taken as carrying the key, the undeclared one is applied twice: caught."""
    from dispatcher._driver import _execution

    monkeypatch.setattr(_execution, "takes_key", lambda keys, schema: True)
    server, applied = _appender(declares_key=False)
    faults = inject_faults(server, rate=0.0)
    faults.fail_next("append", "drop", strike="after")
    async with Dispatcher(retry=RETRY) as d:
        await d.connect("a", server, trusted=True, idempotency=KEYED)
        [result] = await d.dispatch([ToolCall("w", "append", {"text": "x"})])
    assert result.attempts == 2
    assert applied == ["x", "x"]  # what the test above checks never happens


@pytest.mark.subprocess
async def test_a_key_survives_a_server_process_killed_mid_write(tmp_path: pathlib.Path) -> None:
    """Over stdio, a keyed write whose server process is killed while it runs is retried on a fresh process
    with the same key (the ledgers of both processes show it)."""
    import os
    import signal

    ledger = tmp_path / "ledger.jsonl"

    def starts() -> list[Entry]:
        return [entry for entry in Ledger(ledger).entries() if entry.tool == "append_note"]

    command = workspace_command(ledger, "--latency", "30", "--idempotency-key", "idempotency_key")
    async with Dispatcher(retry=RETRY, call_timeout=60) as d:
        await d.connect("ws", command, trusted=True, idempotency=KEYED)
        batch = d.batch()
        batch.submit(ToolCall("w", "append_note", {"name": "log", "text": "paid"}))
        await _wait_for(lambda: len(starts()) == 1)
        os.kill(starts()[0].pid, signal.SIGKILL)
        await _wait_for(lambda: len(starts()) == 2)  # the retry, on a process started for it
        batch.cancel()
        [result] = await batch.wait()
    first, second = starts()
    assert first.pid != second.pid
    assert first.arguments["idempotency_key"] == second.arguments["idempotency_key"]
    assert len(first.arguments["idempotency_key"]) == 32
    assert result.attempts == 2 and result.effect is Effect.UNKNOWN
