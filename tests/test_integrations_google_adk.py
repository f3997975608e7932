"""The Google ADK adapter under ADK's own `Runner` with a scripted model: one batch per model response.

ADK's flow starts one asyncio task per function call of a response and cancels the others when one
raises. These tests drive `InMemoryRunner` with a `BaseLlm` that answers with parallel function calls
and check, on real in-process MCP servers, that the calls of one response run as one dispatcher batch:
reads together, writes alone in the model's order (also when ADK hands them over in another order), a
call a ``before_tool_callback`` answers gives up its place, failures stay results, approvals hold a call
at its place, untrusted tools run alone with marked results, and cancellation reaches the server. Each
run is bounded by `anyio.fail_after`, so a hang fails the test. ADK runs on asyncio only, so these tests
do too. The last test measures ADK's own MCP toolset on the same kind of turn.
"""

from __future__ import annotations

import functools
import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from pydantic import Field

from dispatcher import ApprovalRequest, ConfigurationError, Dispatcher

from .recording import READ, Recorder, recording_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from google.adk.events import Event
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest  # noqa: TC002  (pydantic reads Scripted's field types at run time)
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import InMemoryRunner
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

from dispatcher.integrations.google_adk import DispatcherPlugin, DispatcherToolset

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

# A run that takes longer than this is hung (every tool here answers at once unless a test holds it).
BOUND = 10


class Scripted(BaseLlm):
    """Plays the model: one list of parts per turn, in order; keeps every request it was sent."""

    model: str = "scripted"
    turns: list[list[types.Part]] = Field(default_factory=list)
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False) -> Any:
        self.requests.append(llm_request)
        turn = self.turns[len(self.requests) - 1] if len(self.requests) <= len(self.turns) else [text("done")]
        yield LlmResponse(content=types.Content(role="model", parts=turn))


def call(name: str, call_id: str, **args: Any) -> types.Part:
    return types.Part(function_call=types.FunctionCall(name=name, args=args, id=call_id))


def text(value: str) -> types.Part:
    return types.Part(text=value)


def reads_and_writes(*keys: str) -> list[types.Part]:
    """A turn: each key names its call id and tool (``r...`` reads, ``w...`` writes)."""
    return [call("read" if key.startswith("r") else "write", key, key=key) for key in keys]


def _server(recorder: Recorder, name: str, tool: str) -> MCPServer:
    """A server with one tool that claims to be read-only (and records its execution)."""
    server = MCPServer(name)

    @server.tool(name=tool, annotations=READ)
    async def lookup(key: str) -> str:
        """Look something up."""
        return await recorder.run(name, tool, key, False, "", 1)

    return server


@asynccontextmanager
async def _dispatcher(recorder: Recorder, approve: Any = None) -> AsyncIterator[Dispatcher]:
    async with (
        Client(recording_server(recorder)) as rec,
        Client(_server(recorder, "ext", "lookup")) as ext,
        Dispatcher(approve=approve) as dispatcher,
    ):
        await dispatcher.add_mcp_server("rec", rec, trusted=True)
        # Its tool claims to be read-only; the server is not trusted, so its calls run alone.
        await dispatcher.add_mcp_server("ext", ext, trusted=False)
        yield dispatcher


async def _run(
    agent: LlmAgent,
    plugins: Sequence[BasePlugin] = (),
    message: str = "go",
    runner: InMemoryRunner | None = None,
    bound: float = BOUND,
) -> list[Event]:
    runner = runner or InMemoryRunner(app=App(name="app", root_agent=agent, plugins=list(plugins)))
    session = await runner.session_service.create_session(app_name="app", user_id="user")
    content = types.Content(role="user", parts=[text(message)])
    with anyio.fail_after(bound):
        return [event async for event in runner.run_async(user_id="user", session_id=session.id, new_message=content)]


def _responses(events: list[Event]) -> dict[str, Any]:
    return {str(r.id): r.response for event in events for r in event.get_function_responses()}


def _declared(request: LlmRequest) -> list[str]:
    """The function names a model request declares."""
    return [
        declaration.name or ""
        for tool in request.config.tools or []
        if isinstance(tool, types.Tool)
        for declaration in tool.function_declarations or []
    ]


def _ran(recorder: Recorder) -> list[str]:
    return [e.key for e in sorted(recorder.executions, key=lambda e: e.start)]


def _agent(model: BaseLlm, tools: list[Any], **kwargs: Any) -> LlmAgent:
    return LlmAgent(name="agent", model=model, tools=tools, **kwargs)


async def test_reads_run_together_and_writes_alone_in_the_model_order() -> None:
    """r1 r2 w1 r3 w2: the reads run together (r1 waits for r2), each write alone, in the model's order."""
    recorder = Recorder()
    both = recorder.gate("both")
    turn = [call("read", "r1", key="r1", hold="both"), *reads_and_writes("r2", "w1", "r3", "w2")]

    async def release() -> None:
        await recorder.started_event("r2").wait()
        both.set()

    async with _dispatcher(recorder) as dispatcher, anyio.create_task_group() as tg:
        tg.start_soon(release)
        events = await _run(_agent(Scripted(turns=[turn]), [DispatcherToolset(dispatcher)]))
    assert _responses(events) == {key: {"result": f"{tool}:{key}"} for tool, key in _pairs("r1 r2 w1 r3 w2")}
    assert _ran(recorder) == ["r1", "r2", "w1", "r3", "w2"]
    assert recorder.violations == []
    assert recorder.max_active == 2


def _pairs(keys: str) -> list[tuple[str, str]]:
    return [("read" if key.startswith("r") else "write", key) for key in keys.split()]


async def _wait_behind(tool: BaseTool, args: dict[str, Any], tool_context: ToolContext) -> None:
    """A before_tool_callback that holds w1 until every other task is blocked: w2 reaches its tool first."""
    if tool_context.function_call_id == "w1":
        await anyio.wait_all_tasks_blocked()


async def test_writes_keep_the_model_order_when_adk_hands_them_over_in_another() -> None:
    """A callback holds w1 until w2 has reached its tool: w1 still runs first, w2 after it."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("w1", "w2")]), [DispatcherToolset(dispatcher)])
        agent.before_tool_callback = _wait_behind
        await _run(agent, [DispatcherPlugin()])
    assert _ran(recorder) == ["w1", "w2"]


async def test_the_order_check_catches_calls_run_in_arrival_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle: with the numbering switched off (each call its own batch), w2 runs before w1."""
    monkeypatch.setattr(DispatcherToolset, "_number", lambda self, context, event, call_id: None)
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("w1", "w2")]), [DispatcherToolset(dispatcher)])
        agent.before_tool_callback = _wait_behind
        await _run(agent, [DispatcherPlugin()])
    assert _ran(recorder) == ["w2", "w1"]


@pytest.mark.parametrize("answered", ["w1", "r1", "w2"])
async def test_a_call_a_before_tool_callback_answers_gives_up_its_place(answered: str) -> None:
    """The agent's callback answers one call (first, middle or last): it never runs, the others do, in order."""

    def block(tool: BaseTool, args: dict[str, Any], tool_context: ToolContext) -> dict[str, Any] | None:
        return {"result": "blocked"} if tool_context.function_call_id == answered else None

    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("w1", "r1", "w2")]), [DispatcherToolset(dispatcher)])
        agent.before_tool_callback = block
        events = await _run(agent, [DispatcherPlugin()])
    assert _responses(events)[answered] == {"result": "blocked"}
    assert _ran(recorder) == [key for key in ["w1", "r1", "w2"] if key != answered]
    assert recorder.violations == []


async def test_the_hang_check_catches_a_place_never_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle: with give_up switched off, the calls behind an answered call wait forever (the run times out)."""
    monkeypatch.setattr(DispatcherToolset, "give_up", lambda self, tool_context: None)

    def block(tool: BaseTool, args: dict[str, Any], tool_context: ToolContext) -> dict[str, Any] | None:
        return {"result": "blocked"} if tool_context.function_call_id == "w1" else None

    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("r1", "w1", "w2")]), [DispatcherToolset(dispatcher)])
        agent.before_tool_callback = block
        # It never finishes, however long it is given: a short bound is enough to see it hang.
        with pytest.raises(TimeoutError):
            await _run(agent, [DispatcherPlugin()], bound=1)
    assert _ran(recorder) == ["r1"]


class _Blocker(BasePlugin):
    """A plugin whose before_tool_callback answers w1 itself."""

    def __init__(self) -> None:
        super().__init__(name="blocker")

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        return {"result": "not allowed"} if tool_context.function_call_id == "w1" else None


async def test_a_call_a_plugin_answers_gives_up_its_place() -> None:
    """A plugin's before_tool_callback answers w1: w2 after it runs, with DispatcherPlugin before the blocker."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("w1", "w2")]), [DispatcherToolset(dispatcher)])
        events = await _run(agent, [DispatcherPlugin(), _Blocker()])
    assert _responses(events) == {"w1": {"result": "not allowed"}, "w2": {"result": "write:w2"}}
    assert _ran(recorder) == ["w2"]


async def test_a_callback_without_the_plugin_is_refused_instead_of_hanging() -> None:
    """A before_tool_callback but no DispatcherPlugin: the run fails with a ConfigurationError naming the fix."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("w1", "w2")]), [DispatcherToolset(dispatcher)])
        agent.before_tool_callback = lambda tool, args, tool_context: None
        with pytest.raises(ConfigurationError, match=r"add DispatcherPlugin\(\)"):
            await _run(agent)
    assert recorder.executions == []


class _Rewriter(BasePlugin):
    """A plugin with an after_tool_callback (it could replace a result, and stop the plugins after it)."""

    def __init__(self) -> None:
        super().__init__(name="rewriter")

    async def after_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, result: dict[str, Any]
    ) -> dict[str, Any] | None:
        return None


async def test_the_plugin_after_one_that_may_replace_results_is_refused() -> None:
    """DispatcherPlugin behind a plugin with an after_tool_callback (and a blocker present): refused, not hung."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("w1", "w2")]), [DispatcherToolset(dispatcher)])
        with pytest.raises(ConfigurationError, match="put DispatcherPlugin"):
            await _run(agent, [_Rewriter(), _Blocker(), DispatcherPlugin()])
    assert recorder.executions == []


async def test_without_callbacks_no_plugin_is_needed() -> None:
    """Plugins that cannot answer a call (no before_tool_callback) need no DispatcherPlugin."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("w1", "w2")]), [DispatcherToolset(dispatcher)])
        await _run(agent, [_Rewriter()])
    assert _ran(recorder) == ["w1", "w2"]


async def test_a_failing_call_is_a_result_and_its_siblings_run() -> None:
    """A tool that reports an error: the model reads it as an error; the calls around it run and answer."""
    recorder = Recorder()
    turn = [*reads_and_writes("w1"), call("fail", "f1", key="f1"), *reads_and_writes("r1")]
    async with _dispatcher(recorder) as dispatcher:
        events = await _run(_agent(Scripted(turns=[turn]), [DispatcherToolset(dispatcher)]))
    responses = _responses(events)
    assert set(responses["f1"]) == {"error"}
    assert responses["f1"]["error"] == "tool_error: Error executing tool fail"
    assert responses["w1"] == {"result": "write:w1"} and responses["r1"] == {"result": "read:r1"}


async def test_a_denied_call_is_an_error_the_model_reads_and_never_runs() -> None:
    """The approver denies w1: its response is a denial; r1 after it runs."""

    async def deny_w1(request: ApprovalRequest) -> bool:
        return request.call.id != "w1"

    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        toolset = DispatcherToolset(dispatcher, approve=deny_w1)
        events = await _run(_agent(Scripted(turns=[reads_and_writes("w1", "r1")]), [toolset]))
    responses = _responses(events)
    assert responses["w1"]["error"].startswith("denied:")
    assert _ran(recorder) == ["r1"]


async def test_a_call_waiting_for_approval_keeps_its_place() -> None:
    """While the person decides on w1, r1 (after it) does not start; once approved, w1 runs, then r1."""
    recorder = Recorder()
    seen: list[list[str]] = []

    async def slow_yes(request: ApprovalRequest) -> bool:
        await anyio.wait_all_tasks_blocked()  # everything else of the turn is where it waits
        seen.append(_ran(recorder))
        return True

    async with _dispatcher(recorder) as dispatcher:
        toolset = DispatcherToolset(dispatcher, approve=slow_yes)
        await _run(_agent(Scripted(turns=[reads_and_writes("w1", "r1")]), [toolset]))
    assert seen == [[]]
    assert _ran(recorder) == ["w1", "r1"]


async def test_an_untrusted_tool_runs_alone_and_its_result_is_marked() -> None:
    """r1 (held) u1 r2: the untrusted server's 'read' waits for r1 and runs alone; its text is marked untrusted."""
    recorder = Recorder()
    held = recorder.gate("held")
    turn = [call("read", "r1", key="r1", hold="held"), call("lookup", "u1", key="u1"), *reads_and_writes("r2")]

    async def release() -> None:
        await recorder.started_event("r1").wait()
        await anyio.wait_all_tasks_blocked()
        held.set()

    async with _dispatcher(recorder) as dispatcher, anyio.create_task_group() as tg:
        tg.start_soon(release)
        events = await _run(_agent(Scripted(turns=[turn]), [DispatcherToolset(dispatcher)]))
    runs = {e.key: e for e in recorder.executions}
    assert runs["r1"].end is not None and runs["u1"].end is not None
    assert runs["u1"].start > runs["r1"].end and runs["r2"].start > runs["u1"].end
    marked = _responses(events)["u1"]["result"]
    assert marked.startswith("<untrusted-content-") and "lookup:u1" in marked
    assert _responses(events)["r1"] == {"result": "read:r1"}


async def test_cancelling_the_run_cancels_the_call_on_the_server() -> None:
    """The run is cancelled while w1 runs: the server's handler is cancelled, and w2 never starts."""
    recorder = Recorder()
    turn = [call("write", "w1", key="w1", hold="never"), *reads_and_writes("w2")]
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[turn]), [DispatcherToolset(dispatcher)])
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_run, agent)
                await recorder.started_event("w1").wait()
                tg.cancel_scope.cancel()
            await anyio.wait_all_tasks_blocked()  # the server has seen the cancellation
    assert recorder.by_key("w1")[0].cancelled
    assert _ran(recorder) == ["w1"]


async def _hold_w2(tool: BaseTool, args: dict[str, Any], tool_context: ToolContext) -> None:
    if tool_context.function_call_id == "w2":
        await anyio.Event().wait()


async def test_a_native_tool_that_raises_cancels_the_dispatchers_calls_cleanly() -> None:
    """ADK cancels the siblings of a tool that raises: w1 is cancelled on the server, w2 never runs or waits."""
    recorder = Recorder()

    async def explode() -> str:
        """Fails once w1 has started."""
        await recorder.started_event("w1").wait()
        raise RuntimeError("boom")

    turn = [call("write", "w1", key="w1", hold="never"), call("explode", "x1"), *reads_and_writes("w2")]
    async with _dispatcher(recorder) as dispatcher:
        toolset = DispatcherToolset(dispatcher)
        agent = _agent(Scripted(turns=[turn]), [toolset, FunctionTool(explode)])
        agent.before_tool_callback = _hold_w2  # w2 never reaches its tool before the turn is cancelled
        with pytest.raises(RuntimeError, match="boom"):
            await _run(agent, [DispatcherPlugin()])
        await anyio.wait_all_tasks_blocked()  # the server has seen the cancellation
    assert recorder.by_key("w1")[0].cancelled
    assert _ran(recorder) == ["w1"]
    assert toolset._placed == {}  # the cancelled turn holds no place for w2


class _Echo(BaseLlm):
    """Plays one model for many sessions: the user's message ``n`` asks for wNa, rN, wNb; then it is done."""

    model: str = "echo"

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False) -> Any:
        last = llm_request.contents[-1].parts or []
        if last and last[0].text is not None:
            n = last[0].text
            turn = [call("write", f"w{n}a", key=f"w{n}a"), call("read", f"r{n}", key=f"r{n}")]
            turn.append(call("write", f"w{n}b", key=f"w{n}b"))
        else:
            turn = [text("done")]
        yield LlmResponse(content=types.Content(role="model", parts=turn))


async def test_many_sessions_at_once_each_keep_their_order() -> None:
    """Twenty sessions share one toolset at once: each response's calls keep their order; no place is left over."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        toolset = DispatcherToolset(dispatcher)
        agent = _agent(_Echo(), [toolset])
        runner = InMemoryRunner(app=App(name="app", root_agent=agent))
        async with anyio.create_task_group() as tg:
            for n in range(20):
                tg.start_soon(functools.partial(_run, agent, message=str(n), runner=runner))
    order = _ran(recorder)
    for n in range(20):
        assert order.index(f"w{n}a") < order.index(f"r{n}") < order.index(f"w{n}b")
    assert len(order) == 60 and recorder.violations == []
    assert toolset._placed == {}


async def test_a_repeated_call_id_is_refused() -> None:
    """Two calls of one response share an id: neither runs, each answers with an error saying why."""
    recorder = Recorder()
    turn = [call("write", "same", key="a"), call("write", "same", key="b"), *reads_and_writes("r1")]
    async with _dispatcher(recorder) as dispatcher:
        events = await _run(_agent(Scripted(turns=[turn]), [DispatcherToolset(dispatcher)]))
    responses = [r.response for event in events for r in event.get_function_responses() if r.id == "same"]
    assert len(responses) == 2 and all("used twice" in str(response) for response in responses)
    assert _ran(recorder) == ["r1"]


async def test_a_prefix_and_a_filter_shape_what_the_model_sees() -> None:
    """tool_name_prefix and tool_filter: the model sees ws_read and ws_write only; ws_write calls write."""
    recorder = Recorder()
    model = Scripted(turns=[[call("ws_write", "w1", key="w1"), call("ws_read", "r1", key="r1")]])
    async with _dispatcher(recorder) as dispatcher:
        toolset = DispatcherToolset(dispatcher, tool_filter=["read", "write"], tool_name_prefix="ws")
        events = await _run(_agent(model, [toolset]))
    assert sorted(_declared(model.requests[0])) == ["ws_read", "ws_write"]
    assert _responses(events) == {"w1": {"result": "write:w1"}, "r1": {"result": "read:r1"}}
    assert _ran(recorder) == ["w1", "r1"]


async def test_a_name_another_tool_shadows_holds_no_place() -> None:
    """A FunctionTool named write after the toolset takes write's calls (ADK's last-wins): r1 does not wait for it."""
    recorder = Recorder()

    async def write(key: str) -> str:
        """A local write that shadows the server's."""
        return f"local:{key}"

    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(Scripted(turns=[reads_and_writes("w1", "r1")]), [DispatcherToolset(dispatcher), write])
        events = await _run(agent)
    assert _responses(events) == {"w1": {"result": "local:w1"}, "r1": {"result": "read:r1"}}
    assert _ran(recorder) == ["r1"]


async def test_the_tools_follow_the_catalogue_from_the_next_invocation() -> None:
    """A server added between two invocations: the next model request declares its tools."""
    recorder = Recorder()
    model = Scripted(turns=[[text("one")], [text("two")]])
    async with _dispatcher(recorder) as dispatcher:
        agent = _agent(model, [DispatcherToolset(dispatcher)])
        runner = InMemoryRunner(app=App(name="app", root_agent=agent))
        await _run(agent, runner=runner)
        async with Client(_server(recorder, "more", "extra")) as more:
            await dispatcher.add_mcp_server("more", more, trusted=True)
            await _run(agent, runner=runner)
    assert "extra" not in _declared(model.requests[0])
    assert "extra" in _declared(model.requests[1])


async def test_responses_in_the_session_are_plain_data() -> None:
    """What the session stores for each call is a dict of strings (it serializes as JSON)."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        turn = [*reads_and_writes("w1"), call("lookup", "u1", key="u1"), call("nope", "n1")]
        events = await _run(_agent(Scripted(turns=[turn]), [DispatcherToolset(dispatcher)]))
    responses = _responses(events)
    assert set(responses) == {"w1", "u1", "n1"}  # n1: ADK's own "tool not found" answer
    for call_id in ("w1", "u1"):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in responses[call_id].items())
    json.dumps(responses)


async def test_a_bad_tool_filter_is_refused() -> None:
    """tool_filter must be a list of names or a function."""
    with pytest.raises(ConfigurationError, match="tool_filter"):
        DispatcherToolset(object(), tool_filter="read")  # type: ignore[arg-type]
