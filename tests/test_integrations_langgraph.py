"""The LangGraph node inside LangGraph's prebuilt agent, with a fake chat model and two real MCP servers.

`create_react_agent(model, tools=node)` takes the node (it is a ``ToolNode``) in both graph versions:
``v2`` sends each call to the node on its own, ``v1`` the whole message; either way the message is one
batch. An approver may pause the graph with ``interrupt()``; checkpoints hold plain data; LangChain
tools share the node. LangGraph is driven on asyncio here (its graphs run on asyncio); each run is
bounded by `anyio.fail_after`, so a wait that never ends fails the test. langchain's own
``create_agent`` takes the dispatcher as a middleware instead (tests/test_integrations_langchain.py).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from pydantic import Field

from dispatcher import ApprovalRequest, ConfigurationError, Dispatcher

from .recording import WRITE, Recorder, recording_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command, interrupt

from dispatcher.integrations.langgraph import DispatcherToolNode

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
    # LangGraph 1.x deprecates create_react_agent in favour of langchain's create_agent (DispatcherMiddleware).
    pytest.mark.filterwarnings("ignore:create_react_agent has been moved"),
]

BOUND = 10


class FakeModel(GenericFakeChatModel):
    """The fake chat model, with the `bind_tools` the prebuilt agent calls (it records the tools)."""

    bound: list[Any] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.bound = list(tools)
        return self


def _model(calls: list[tuple[str, str, dict[str, Any]]]) -> FakeModel:
    return FakeModel(
        messages=iter(
            [AIMessage("", tool_calls=[{"id": i, "name": n, "args": a} for i, n, a in calls]), AIMessage("done")]
        )
    )


def _log_server(recorder: Recorder) -> MCPServer:
    server = MCPServer("log")

    @server.tool(annotations=WRITE)
    async def log(key: str) -> str:
        """Append a line to the log (records its execution)."""
        return await recorder.run("log", "log", key, True, "", 1)

    return server


@asynccontextmanager
async def _dispatcher(recorder: Recorder) -> AsyncIterator[Dispatcher]:
    async with Client(recording_server(recorder)) as rec, Client(_log_server(recorder)) as log, Dispatcher() as d:
        await d.add_mcp_server("rec", rec, trusted=True)
        await d.add_mcp_server("log", log, trusted=True)
        yield d


def _ran(recorder: Recorder) -> list[str]:
    return [e.key for e in sorted(recorder.executions, key=lambda e: e.start)]


TURN = [
    ("w1", "write", {"key": "w1"}),
    ("r1", "read", {"key": "r1", "hold": "reads"}),
    ("r2", "read", {"key": "r2", "hold": "reads"}),
    ("l1", "log", {"key": "l1"}),
    ("w2", "write", {"key": "w2"}),
]


async def _release(recorder: Recorder) -> None:
    # The two reads hold until both have started: run one at a time, they never would.
    await recorder.started_event("r1").wait()
    await recorder.started_event("r2").wait()
    recorder.gate("reads").set()


@pytest.mark.parametrize("version", ["v2", "v1"])
async def test_the_prebuilt_agent_runs_the_message_as_one_batch(version: str) -> None:
    """create_react_agent(model, tools=node): reads together, writes alone in model order, one answer per call."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        node = DispatcherToolNode(dispatcher)
        model = _model(TURN)
        agent = create_react_agent(model, tools=node, version=version)  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:
            tg.start_soon(_release, recorder)
            with anyio.fail_after(BOUND):
                state = await agent.ainvoke({"messages": [("user", "go")]})
    answers = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert sorted(m.tool_call_id for m in answers) == ["l1", "r1", "r2", "w1", "w2"]
    assert {m.tool_call_id: m.content for m in answers}["w2"] == "write:w2"
    assert {tool.name for tool in model.bound} >= {"read", "write", "log"}
    order = _ran(recorder)
    assert order[0] == "w1" and sorted(order[1:3]) == ["r1", "r2"] and order[3:] == ["l1", "w2"]
    assert recorder.max_active == 2
    assert recorder.violations == []
    assert state["messages"][-1].content == "done"


async def test_langchain_tools_in_the_same_node_run_alone_in_order() -> None:
    """A LangChain tool given to the node answers its call, between the dispatcher's calls, alone."""
    recorder = Recorder()
    seen: list[int] = []

    @tool
    async def shout(text: str) -> str:
        """Say it louder."""
        seen.append(len(recorder.active))
        return text.upper()

    turn = [("w1", "write", {"key": "w1"}), ("s", "shout", {"text": "hi"}), ("r1", "read", {"key": "r1"})]
    async with _dispatcher(recorder) as dispatcher:
        node = DispatcherToolNode(dispatcher, tools=[shout])
        agent = create_react_agent(_model(turn), tools=node)
        with anyio.fail_after(BOUND):
            state = await agent.ainvoke({"messages": [("user", "go")]})
        with pytest.raises(ConfigurationError, match="has the name of a catalogue entry"):

            @tool
            async def read(key: str) -> str:
                """A clash with the catalogue's read."""
                return key

            DispatcherToolNode(dispatcher, tools=[read])
    answers = {m.tool_call_id: m.content for m in state["messages"] if isinstance(m, ToolMessage)}
    assert answers == {"w1": "write:w1", "s": "HI", "r1": "read:r1"}
    assert seen == [0]
    assert _ran(recorder) == ["w1", "r1"]


async def test_an_approver_may_interrupt_and_the_graph_resumes_with_the_answer() -> None:
    """approvals="interrupt": the graph pauses before any call runs; resuming with True runs the write once."""
    recorder = Recorder()
    asked: list[Any] = []

    async def approve(request: ApprovalRequest) -> bool:
        answer = interrupt({"tool": request.call.name, "reason": request.reason})
        asked.append(answer)
        return bool(answer)

    turn = [("r1", "read", {"key": "r1"}), ("w1", "write", {"key": "w1"}), ("w2", "write", {"key": "w2"})]
    config: Any = {"configurable": {"thread_id": "t"}}
    async with _dispatcher(recorder) as dispatcher:
        node = DispatcherToolNode(dispatcher, approvals="interrupt", approve=approve)
        agent = create_react_agent(_model(turn), tools=node, checkpointer=InMemorySaver())
        with anyio.fail_after(BOUND):
            paused = await agent.ainvoke({"messages": [("user", "go")]}, config)
            assert [i.value["tool"] for i in paused["__interrupt__"]] == ["write"]
            assert recorder.executions == []  # nothing of the message ran before the person answered
            paused = await agent.ainvoke(Command(resume=True), config)  # w1 approved; now w2 is asked
            assert [i.value["tool"] for i in paused["__interrupt__"]] == ["write"]
            assert recorder.executions == []
            state = await agent.ainvoke(Command(resume=False), config)  # w2 refused
    answers = {m.tool_call_id: (m.status, m.content) for m in state["messages"] if isinstance(m, ToolMessage)}
    assert answers["r1"] == ("success", "read:r1") and answers["w1"] == ("success", "write:w1")
    assert answers["w2"][0] == "error" and "denied" in answers["w2"][1]
    assert _ran(recorder) == ["r1", "w1"]  # each ran once, in order; the refused write never
    with pytest.raises(ConfigurationError, match="pass approve="):
        DispatcherToolNode(dispatcher, approvals="interrupt")


async def test_checkpoints_hold_plain_data_under_strict_msgpack(caplog: pytest.LogCaptureFixture) -> None:
    """The stored ToolMessages reload with a strict serializer: no dispatcher class, no serde warning."""
    recorder = Recorder()
    saver = InMemorySaver(serde=JsonPlusSerializer(allowed_msgpack_modules=None))  # LANGGRAPH_STRICT_MSGPACK
    config: Any = {"configurable": {"thread_id": "t"}}
    async with _dispatcher(recorder) as dispatcher:
        agent = create_react_agent(_model(TURN[:1]), tools=DispatcherToolNode(dispatcher), checkpointer=saver)
        with caplog.at_level(logging.WARNING), anyio.fail_after(BOUND):
            await agent.ainvoke({"messages": [("user", "go")]}, config)
            stored = await agent.aget_state(config)
    [answer] = [m for m in stored.values["messages"] if isinstance(m, ToolMessage)]
    assert answer.artifact == {
        "status": "ok",
        "tool": "write",
        "server": "rec",
        "attempts": 1,
        "untrusted_content": False,
    }
    assert [r.getMessage() for r in caplog.records if r.name.startswith("langgraph")] == []


async def test_repeated_call_ids_under_v2_run_each_call_once() -> None:
    """v2 with a call id used twice: every call runs exactly once and gets its answer (no double batch)."""
    recorder = Recorder()
    turn = [("same", "write", {"key": "a"}), ("same", "write", {"key": "b"}), ("r", "read", {"key": "c"})]
    async with _dispatcher(recorder) as dispatcher:
        agent = create_react_agent(_model(turn), tools=DispatcherToolNode(dispatcher))
        with anyio.fail_after(BOUND):
            state = await agent.ainvoke({"messages": [("user", "go")]})
    answers = sorted(m.content for m in state["messages"] if isinstance(m, ToolMessage))
    assert answers == ["read:c", "write:a", "write:b"]
    assert sorted(_ran(recorder)) == ["a", "b", "c"]


async def test_an_interrupting_approver_in_a_graph_of_your_own() -> None:
    """The node in a StateGraph (tools_condition): interrupt() pauses it, and a refusal is a ToolMessage."""
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    recorder = Recorder()

    async def approve(request: ApprovalRequest) -> bool:
        return bool(interrupt(request.reason))

    model = _model([("w1", "write", {"key": "w1"}), ("r1", "read", {"key": "r1"})])
    config: Any = {"configurable": {"thread_id": "t"}}
    async with _dispatcher(recorder) as dispatcher:
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", DispatcherToolNode(dispatcher, approvals="interrupt", approve=approve))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        compiled: Any = graph.compile(checkpointer=InMemorySaver())
        with anyio.fail_after(BOUND):
            paused = await compiled.ainvoke({"messages": [("user", "go")]}, config)
            assert "may make destructive changes" in paused["__interrupt__"][0].value
            assert recorder.executions == []
            state = await compiled.ainvoke(Command(resume=False), config)
    answers = {m.tool_call_id: (m.status, m.content) for m in state["messages"] if isinstance(m, ToolMessage)}
    assert answers == {"w1": ("error", "not run: the user denied it"), "r1": ("success", "read:r1")}
    assert _ran(recorder) == ["r1"]


async def test_an_interrupting_approver_without_approvals_interrupt_is_denied_saying_what_to_use() -> None:
    """approvals="dispatcher" cannot pause the graph: the denial names approvals="interrupt", not GraphInterrupt."""
    recorder = Recorder()

    async def approve(request: ApprovalRequest) -> bool:
        return bool(interrupt(request.reason))

    config: Any = {"configurable": {"thread_id": "t"}}
    async with _dispatcher(recorder) as dispatcher:
        node = DispatcherToolNode(dispatcher, approve=approve)
        agent = create_react_agent(_model([("w1", "write", {"key": "w1"})]), tools=node, checkpointer=InMemorySaver())
        with anyio.fail_after(BOUND):
            state = await agent.ainvoke({"messages": [("user", "go")]}, config)
    [answer] = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert answer.status == "error" and "approvals='interrupt'" in str(answer.content)
    assert recorder.executions == []
