"""The OpenAI Agents SDK adapter under the SDK's own `Runner` and `ScriptedModel`: no setting hangs a run.

Every call the SDK never hands to the tool (an input guardrail rejects it, it waits for the SDK's
approval, its tool is disabled) must give up its place in the turn, or the calls after it would wait
for it forever. Each run is bounded by `anyio.fail_after`, so a hang fails the test. The SDK runs on
asyncio only, so these tests do too. Servers: a trusted read/write recording server and a second
real MCP server holding another write tool (`log`).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher import ApprovalRequest, ConfigurationError, Dispatcher

from .recording import WRITE, Recorder, recording_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytest.importorskip("agents")

from agents import (
    Agent,
    FunctionTool,
    RunConfig,
    Runner,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
)
from agents.testing import ScriptedModel, assistant_message, function_call

from dispatcher.integrations.openai_agents import DispatcherTools

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

# A run that takes longer than this is hung (every tool here answers at once).
BOUND = 10
CONFIG = RunConfig(tracing_disabled=True)


def _log_server(recorder: Recorder) -> MCPServer:
    server = MCPServer("log")

    @server.tool(annotations=WRITE)
    async def log(key: str) -> str:
        """Append a line to the log (records its execution)."""
        return await recorder.run("log", "log", key, True, "", 1)

    return server


@asynccontextmanager
async def _dispatcher(recorder: Recorder, approve: Any = None) -> AsyncIterator[Dispatcher]:
    async with (
        Client(recording_server(recorder)) as rec,
        Client(_log_server(recorder)) as log,
        Dispatcher(approve=approve) as dispatcher,
    ):
        await dispatcher.add_mcp_server("rec", rec, trusted=True)
        await dispatcher.add_mcp_server("log", log, trusted=True)
        yield dispatcher


def _ran(recorder: Recorder) -> list[str]:
    return [e.key for e in sorted(recorder.executions, key=lambda e: e.start)]


def _outputs(result: Any) -> dict[str, str]:
    return {
        str(item.raw_item["call_id"]): str(item.output)
        for item in result.new_items
        if item.type == "tool_call_output_item"
    }


def _tool(tools: DispatcherTools, name: str) -> FunctionTool:
    [tool] = [tool for tool in tools.tools if isinstance(tool, FunctionTool) and tool.name == name]
    return tool


TURN = [
    function_call("write", {"key": "w1"}, call_id="w1"),
    function_call("log", {"key": "l1"}, call_id="l1"),
    function_call("read", {"key": "r1"}, call_id="r1"),
    function_call("write", {"key": "w2"}, call_id="w2"),
]


def _model(turn: list[Any] = TURN) -> ScriptedModel:
    return ScriptedModel([turn, [assistant_message("done")]])


async def _run(agent: Agent[Any], start: Any = "go", config: RunConfig = CONFIG) -> Any:
    with anyio.fail_after(BOUND):
        return await Runner.run(agent, start, run_config=config)


async def test_a_call_rejected_by_an_input_guardrail_gives_up_its_place() -> None:
    """An input guardrail that rejects the first write: the calls after it run, in order, and it never runs."""

    def no_w1(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        if data.context.tool_call_id == "w1":
            return ToolGuardrailFunctionOutput.reject_content("w1 is not allowed")
        return ToolGuardrailFunctionOutput.allow()

    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        _tool(tools, "write").tool_input_guardrails = [ToolInputGuardrail(no_w1)]
        agent = Agent(name="a", model=_model(), tools=tools.tools, hooks=tools.hooks)
        result = await _run(agent)
    outputs = _outputs(result)
    assert outputs["w1"] == "w1 is not allowed"
    assert outputs == {"w1": "w1 is not allowed", "l1": "log:l1", "r1": "read:r1", "w2": "write:w2"}
    assert _ran(recorder) == ["l1", "r1", "w2"]
    assert recorder.violations == []
    assert result.final_output == "done"


async def test_a_guardrail_before_approval_rejecting_a_call_gives_up_its_place() -> None:
    """pre_approval_tool_input_guardrails: a guardrail rejecting a call that needs approval frees its place."""
    from agents.run_config import ToolExecutionConfig

    def no_w1(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        if data.context.tool_call_id == "w1":
            return ToolGuardrailFunctionOutput.reject_content("w1 is not allowed")
        return ToolGuardrailFunctionOutput.allow()

    recorder = Recorder()
    config = RunConfig(
        tracing_disabled=True, tool_execution=ToolExecutionConfig(pre_approval_tool_input_guardrails=True)
    )
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher, approvals="sdk")
        _tool(tools, "write").tool_input_guardrails = [ToolInputGuardrail(no_w1)]
        agent = Agent(name="a", model=_model(), tools=tools.tools, hooks=tools.hooks)
        first = await _run(agent, config=config)
        held = {item.raw_item.call_id: item for item in first.interruptions}
        assert sorted(held) == ["l1", "r1", "w2"]
        assert _outputs(first) == {"w1": "w1 is not allowed"}
        state = first.to_state()
        for item in held.values():
            state.approve(item)
        second = await _run(agent, state, config=config)
    # The resumed run's items include the first run's.
    assert _outputs(second) == {"w1": "w1 is not allowed", "l1": "log:l1", "r1": "read:r1", "w2": "write:w2"}
    assert _ran(recorder) == ["l1", "r1", "w2"]
    assert second.final_output == "done"


async def test_needs_approval_set_on_a_tool_holds_the_rest_of_the_turn_and_resumes_in_order() -> None:
    """`needs_approval=True` set on the write tool: from the first write on the turn waits, then runs in order."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        _tool(tools, "write").needs_approval = True
        turn = [function_call("read", {"key": "r0"}, call_id="r0"), *TURN]
        agent = Agent(name="a", model=_model(turn), tools=tools.tools, hooks=tools.hooks)
        first = await _run(agent)
        held = {item.raw_item.call_id: item for item in first.interruptions}
        # The write needs approval; the calls after it wait with it, so none of them runs before it.
        assert sorted(held) == ["l1", "r1", "w1", "w2"]
        assert _ran(recorder) == ["r0"]
        state = first.to_state()
        for item in held.values():
            state.approve(item)
        second = await _run(agent, state)
    assert _outputs(second) == {"r0": "read:r0", "w1": "write:w1", "l1": "log:l1", "r1": "read:r1", "w2": "write:w2"}
    assert _ran(recorder) == ["r0", "w1", "l1", "r1", "w2"]
    assert recorder.violations == []


async def test_calls_approved_through_the_sdk_are_not_asked_again_by_the_dispatchers_approver() -> None:
    """`needs_approval=True` and a dispatcher approver: a call the person approved in the SDK is not asked
    again; a write of the turn the SDK did not hold is still put to the dispatcher's approver."""
    asked: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(request.call.id)
        return True

    recorder = Recorder()
    async with _dispatcher(recorder, approve=approve) as dispatcher:
        tools = DispatcherTools(dispatcher)
        _tool(tools, "write").needs_approval = True
        turn = [function_call("log", {"key": "l0"}, call_id="l0"), *TURN]
        agent = Agent(name="a", model=_model(turn), tools=tools.tools, hooks=tools.hooks)
        first = await _run(agent)
        held = {item.raw_item.call_id: item for item in first.interruptions}
        assert sorted(held) == ["l1", "r1", "w1", "w2"]
        state = first.to_state()
        for item in held.values():
            state.approve(item)
        second = await _run(agent, state)
    assert _outputs(second) == {"l0": "log:l0", "w1": "write:w1", "l1": "log:l1", "r1": "read:r1", "w2": "write:w2"}
    assert asked == ["l0"], "a call approved through the SDK was asked about again"


async def test_a_callable_needs_approval_that_selects_one_call() -> None:
    """A `needs_approval` function selecting w2: the calls before it run, w2 and the read after it wait."""

    async def only_w2(context: Any, arguments: dict[str, Any], call_id: str) -> bool:
        return arguments.get("key") == "w2"

    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        _tool(tools, "write").needs_approval = only_w2
        turn = [*TURN, function_call("read", {"key": "r2"}, call_id="r2")]
        agent = Agent(name="a", model=_model(turn), tools=tools.tools, hooks=tools.hooks)
        first = await _run(agent)
        held = {item.raw_item.call_id: item for item in first.interruptions}
        assert sorted(held) == ["r2", "w2"]
        assert _ran(recorder) == ["w1", "l1", "r1"]
        state = first.to_state()
        state.reject(held["w2"])
        state.approve(held["r2"])
        second = await _run(agent, state)
    outputs = _outputs(second)
    assert outputs["r2"] == "read:r2" and "write:w2" not in outputs.values()
    assert _ran(recorder) == ["w1", "l1", "r1", "r2"]
    assert second.final_output == "done"


async def test_a_disabled_tool_the_model_calls_anyway_does_not_block_the_turn() -> None:
    """`is_enabled=False` on write, the model calls it anyway: its calls end as not-found errors, the others run."""
    recorder = Recorder()
    config = RunConfig(tracing_disabled=True, tool_not_found_behavior="return_error_to_model")
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        _tool(tools, "write").is_enabled = False
        agent = Agent(name="a", model=_model(), tools=tools.tools, hooks=tools.hooks)
        result = await _run(agent, config=config)
    outputs = _outputs(result)
    assert outputs["l1"] == "log:l1" and outputs["r1"] == "read:r1"
    assert "write" in outputs["w1"] and "not found" in outputs["w1"]
    assert _ran(recorder) == ["l1", "r1"]
    assert result.final_output == "done"


async def test_a_callable_is_enabled_is_honoured() -> None:
    """An `is_enabled` function turning the log tool off: the writes and the read still run in order."""

    def never(context: Any, agent: Any) -> bool:
        return False

    recorder = Recorder()
    config = RunConfig(tracing_disabled=True, tool_not_found_behavior="return_error_to_model")
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        _tool(tools, "log").is_enabled = never
        agent = Agent(name="a", model=_model(), tools=tools.tools, hooks=tools.hooks)
        result = await _run(agent, config=config)
    assert "not found" in _outputs(result)["l1"]
    assert _ran(recorder) == ["w1", "r1", "w2"]


async def test_an_unknown_tool_is_an_error_the_model_reads_with_return_error_to_model() -> None:
    """With the documented `tool_not_found_behavior`, a made-up tool is an error output; the rest runs."""
    recorder = Recorder()
    config = RunConfig(tracing_disabled=True, tool_not_found_behavior="return_error_to_model")
    turn = [function_call("delete_everything", {}, call_id="x"), *TURN]
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        agent = Agent(name="a", model=_model(turn), tools=tools.tools, hooks=tools.hooks)
        result = await _run(agent, config=config)
    outputs = _outputs(result)
    assert "delete_everything" in outputs["x"] and "not found" in outputs["x"]
    assert _ran(recorder) == ["w1", "l1", "r1", "w2"]


async def test_an_unknown_tool_fails_the_run_by_default_without_running_anything() -> None:
    """The SDK's default `raise_error`: the run fails with ModelBehaviorError before any call runs (no hang)."""
    from agents.exceptions import ModelBehaviorError

    recorder = Recorder()
    turn = [*TURN, function_call("delete_everything", {}, call_id="x")]
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        agent = Agent(name="a", model=_model(turn), tools=tools.tools, hooks=tools.hooks)
        with pytest.raises(ModelBehaviorError, match="delete_everything"):
            await _run(agent)
    assert _ran(recorder) == []


async def test_a_tool_timeout_while_waiting_for_its_turn_frees_its_place() -> None:
    """The SDK's `timeout_seconds` cancels a call waiting behind a held write: the later calls still run."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        log = _tool(tools, "log")
        log.timeout_seconds = 0.2
        timed_out = anyio.Event()

        def on_timeout(context: Any, error: Exception) -> str:
            timed_out.set()
            return f"the log call timed out: {error}"

        log.timeout_error_function = on_timeout
        turn = [
            function_call("write", {"key": "w1", "hold": "w1"}, call_id="w1"),
            function_call("log", {"key": "l1"}, call_id="l1"),
            function_call("read", {"key": "r1"}, call_id="r1"),
        ]
        agent = Agent(name="a", model=_model(turn), tools=tools.tools, hooks=tools.hooks)

        async def release() -> None:
            # The write holds until the log call, waiting behind it, has given up.
            await timed_out.wait()
            recorder.gate("w1").set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(release)
            result = await _run(agent)
    outputs = _outputs(result)
    assert outputs["w1"] == "write:w1" and outputs["r1"] == "read:r1"
    assert "timed out" in outputs["l1"]
    assert _ran(recorder) == ["w1", "r1"]


async def test_the_tool_list_follows_the_catalogue_between_turns() -> None:
    """A tool registered during a run is shown to the model on the next turn and runs when called."""
    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:

        def install() -> str:
            """Register a new tool."""

            def shout(text: str) -> str:
                """Say it louder."""
                return text.upper()

            dispatcher.add_function(shout, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
            return "installed"

        dispatcher.add_function(install, annotations=ToolAnnotations(open_world_hint=False))
        tools = DispatcherTools(dispatcher)
        model = ScriptedModel(
            [
                [function_call("install", {}, call_id="i")],
                [function_call("shout", {"text": "hi"}, call_id="s")],
                [assistant_message("done")],
            ]
        )
        agent = Agent(name="a", model=model, tools=tools.tools, hooks=tools.hooks)
        result = await _run(agent)
        listed = [tool.name for tool in tools.tools]
    shown = [sorted(tool.name for tool in call.tools) for call in model.calls]
    assert "shout" not in shown[0] and "shout" in shown[1]
    assert _outputs(result) == {"i": "installed", "s": "HI"}
    assert "shout" in listed


async def test_building_refuses_settings_it_cannot_honour() -> None:
    """An approver with approvals="sdk" is never asked: building the tools says so."""

    async def approve(request: ApprovalRequest) -> bool:
        return True

    async with _dispatcher(Recorder()) as dispatcher:
        with pytest.raises(ConfigurationError, match=r"approvals='sdk'.*approve"):
            DispatcherTools(dispatcher, approvals="sdk", approve=approve)
        with pytest.raises(ConfigurationError, match="approvals must be"):
            DispatcherTools(dispatcher, approvals="never")  # type: ignore[arg-type]


async def test_a_streamed_run_with_a_rejecting_guardrail_does_not_hang() -> None:
    """Runner.run_streamed: the same give-up holds when the run is streamed."""

    def no_w1(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        if data.context.tool_call_id == "w1":
            return ToolGuardrailFunctionOutput.reject_content("w1 is not allowed")
        return ToolGuardrailFunctionOutput.allow()

    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        _tool(tools, "write").tool_input_guardrails = [ToolInputGuardrail(no_w1)]
        agent = Agent(name="a", model=_model(), tools=tools.tools, hooks=tools.hooks)
        with anyio.fail_after(BOUND):
            streamed = Runner.run_streamed(agent, "go", run_config=CONFIG)
            async for _ in streamed.stream_events():
                pass
    assert _ran(recorder) == ["l1", "r1", "w2"]
    assert streamed.final_output == "done"


async def test_a_guardrail_that_raises_fails_the_run_without_leaving_calls_waiting() -> None:
    """A guardrail that trips (raise_exception) fails the run promptly; no call behind it waits forever."""
    from agents.exceptions import ToolInputGuardrailTripwireTriggered

    def trip_w1(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        if data.context.tool_call_id == "w1":
            return ToolGuardrailFunctionOutput.raise_exception()
        return ToolGuardrailFunctionOutput.allow()

    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        _tool(tools, "write").tool_input_guardrails = [ToolInputGuardrail(trip_w1)]
        agent = Agent(name="a", model=_model(), tools=tools.tools, hooks=tools.hooks)
        with pytest.raises(ToolInputGuardrailTripwireTriggered):
            await _run(agent)
    assert "w1" not in _ran(recorder)


async def test_the_tool_list_follows_a_servers_tools_list_changed() -> None:
    """A server adds one tool and removes another (tools/list_changed): the next turn shows the change."""
    from dispatcher.examples import Workspace

    workspace = Workspace()
    workspace.remove_tool("send_message")
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)

        async def change() -> str:
            """Make the server change its tools."""
            workspace.restore_tool("send_message")
            workspace.remove_tool("fetch_url")
            await workspace.notify_tools_changed()
            await anyio.wait_all_tasks_blocked()
            return "changed"

        dispatcher.add_function(change, annotations=ToolAnnotations(open_world_hint=False))
        tools = DispatcherTools(dispatcher)
        model = ScriptedModel(
            [
                [function_call("change", {}, call_id="c")],
                [function_call("send_message", {"to": "bob", "text": "hi"}, call_id="s")],
                [assistant_message("done")],
            ]
        )
        agent = Agent(name="a", model=model, tools=tools.tools, hooks=tools.hooks)
        result = await _run(agent)
    shown = [{tool.name for tool in call.tools} for call in model.calls]
    assert "send_message" not in shown[0] and "fetch_url" in shown[0]
    assert "send_message" in shown[1] and "fetch_url" not in shown[1]
    assert not _outputs(result)["s"].startswith("Error")
