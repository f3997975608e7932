"""The pydantic-ai adapter under pydantic-ai's own `Agent.run` and `FunctionModel`: conflict keys are kept.

A tool with a conflict domain is not turned into a global ``sequential`` barrier, so writes to
different keys overlap as with the other adapters, while writes to one key keep the model's order.
Two real in-process MCP servers: a keyed notes server (domain ``notes``, keyed by ``key``) and a
log server with no domain. pydantic-ai runs agents on asyncio only, so these tests do too; each
run is bounded by `anyio.fail_after`, so a serialization that makes the test wait fails it.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from dispatcher import ConfigurationError, Dispatcher

from .recording import WRITE, Recorder, recording_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from dispatcher.integrations.pydantic_ai import DispatcherToolset

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

BOUND = 10


def _log_server(recorder: Recorder) -> MCPServer:
    server = MCPServer("log")

    @server.tool(annotations=WRITE)
    async def log(key: str, hold: str = "") -> str:
        """Append a line to the log (records its execution)."""
        return await recorder.run("log", "log", key, True, hold, 1)

    return server


def _by_key(arguments: Any) -> str:
    # The recorded `key` names the call; `slot`, when given, is the state it writes.
    return f"key:{arguments.get('slot') or arguments['key']}"


@asynccontextmanager
async def _dispatcher(recorder: Recorder, keyed: bool = True) -> AsyncIterator[Dispatcher]:
    async with (
        Client(recording_server(recorder)) as notes,
        Client(_log_server(recorder)) as log,
        Dispatcher() as dispatcher,
    ):
        if keyed:
            await dispatcher.add_mcp_server("notes", notes, trusted=True, domain="notes", keys={"write": _by_key})
        else:
            await dispatcher.add_mcp_server("notes", notes, trusted=True)
        await dispatcher.add_mcp_server("log", log, trusted=True)
        yield dispatcher


def _model(turn: list[tuple[str, str, dict[str, Any]]]) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=i) for i, name, args in turn])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


async def _release_when_started(recorder: Recorder, keys: list[str], gate: str) -> None:
    for key in keys:
        await recorder.started_event(key).wait()
    recorder.gate(gate).set()


async def test_writes_to_different_keys_overlap() -> None:
    """Two writes to different keys of one domain both start before either ends: no global barrier."""
    recorder = Recorder()
    turn = [
        ("a", "write", {"key": "a", "hold": "both"}),
        ("b", "write", {"key": "b", "hold": "both"}),
    ]
    async with _dispatcher(recorder) as dispatcher:
        toolset = DispatcherToolset(dispatcher)
        async with anyio.create_task_group() as tg:
            # Each write holds until both have started: serialized, the second never starts.
            tg.start_soon(_release_when_started, recorder, ["a", "b"], "both")
            with anyio.fail_after(BOUND):
                result = await Agent(_model(turn), toolsets=[toolset]).run("go")
    assert result.output == "done"
    assert recorder.max_active == 2


async def test_writes_to_one_key_keep_the_model_order_and_unkeyed_writes_stay_barriers() -> None:
    """Same-key writes run one after the other in model order; the domain-less log write runs alone."""
    recorder = Recorder()
    turn = [
        ("a1", "write", {"key": "a1", "slot": "a", "hold": "first"}),
        ("b", "write", {"key": "b", "hold": "first"}),
        ("a2", "write", {"key": "a2", "slot": "a"}),
        ("l", "log", {"key": "l"}),
        ("a3", "write", {"key": "a3", "slot": "a"}),
    ]
    async with _dispatcher(recorder) as dispatcher:
        toolset = DispatcherToolset(dispatcher)
        async with anyio.create_task_group() as tg:
            # a1 and b overlap (different keys); a2 must wait for a1 although b does not.
            tg.start_soon(_release_when_started, recorder, ["a1", "b"], "first")
            with anyio.fail_after(BOUND):
                await Agent(_model(turn), toolsets=[toolset]).run("go")
    runs = {e.key: e for e in recorder.executions}
    order = [e.key for e in sorted(recorder.executions, key=lambda e: e.start)]
    assert sorted(order[:2]) == ["a1", "b"] and order[2:] == ["a2", "l", "a3"]
    for first, second in [("a1", "a2"), ("a2", "a3")]:
        end = runs[first].end
        assert end is not None and end < runs[second].start  # one key: one after the other, in model order
    log = runs["l"]
    for other in recorder.executions:
        if other is not log:  # the domain-less write runs alone
            assert (other.end or 0) < log.start or (log.end or 0) < other.start


async def test_the_oracle_catches_a_global_barrier() -> None:
    """Without a domain the writes are barriers, and the overlap check of the first test fails (times out)."""
    recorder = Recorder()
    turn = [("a", "write", {"key": "a", "hold": "both"}), ("b", "write", {"key": "b", "hold": "both"})]
    async with _dispatcher(recorder, keyed=False) as dispatcher:
        toolset = DispatcherToolset(dispatcher)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_release_when_started, recorder, ["a", "b"], "both")
            with pytest.raises(TimeoutError), anyio.fail_after(1):
                await Agent(_model(turn), toolsets=[toolset]).run("go")
            tg.cancel_scope.cancel()
    assert recorder.max_active == 1


async def test_sequential_follows_the_domain() -> None:
    """A write with a domain is not `sequential`; a domain-less write is; a read never is."""
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    async with _dispatcher(Recorder()) as dispatcher:
        tools = await DispatcherToolset(dispatcher).get_tools(
            RunContext(deps=None, model=TestModel(), usage=RunUsage())
        )
    assert tools["write"].tool_def.sequential is False
    assert tools["write"].tool_def.metadata is not None and tools["write"].tool_def.metadata["domain"] == "notes"
    assert tools["log"].tool_def.sequential is True
    assert tools["read"].tool_def.sequential is False


@dataclass
class Tenant:
    name: str


async def test_deps_reach_the_call_and_its_key_function() -> None:
    """`arguments=` puts a value from `deps` into the call: the tool and the key function read it."""
    recorder = Recorder()
    seen_keys: list[str] = []

    def tenant_key(arguments: Any) -> str:
        seen_keys.append(arguments["key"])
        return f"tenant:{arguments['key']}"

    def from_deps(ctx: RunContext[Tenant], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {**arguments, "key": f"{ctx.deps.name}/{arguments['key']}"}

    async with Client(recording_server(recorder)) as notes, Dispatcher() as dispatcher:
        await dispatcher.add_mcp_server("notes", notes, trusted=True, domain="notes", keys={"write": tenant_key})
        toolset = DispatcherToolset(dispatcher, arguments=from_deps)
        agent = Agent(_model([("w", "write", {"key": "x"})]), toolsets=[toolset], deps_type=Tenant)
        with anyio.fail_after(BOUND):
            await agent.run("go", deps=Tenant("acme"))
        with pytest.raises(ConfigurationError, match="arguments must be a function"):
            DispatcherToolset(dispatcher, arguments="tenant")  # type: ignore[arg-type]
    assert seen_keys == ["acme/x"]
    assert [e.key for e in recorder.executions] == ["acme/x"]
