"""The framework integrations against the real framework packages, with their own fake models.

LangGraph, the OpenAI Agents SDK and pydantic-ai run their graphs and agents on asyncio only, so the
tests that drive a whole run are asyncio-only; the parts that are the dispatcher's own (the LangGraph
node, the OpenAI tools' ordering, the Claude server and permission callback) run on both backends.
"""

from __future__ import annotations

import json
import random
import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher import ApprovalRequest, ConfigurationError, Dispatcher

from .recording import Recorder, recording_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

# The OpenAI Agents SDK and pydantic-ai run agents on asyncio only.
ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])


def _untrusted_server() -> MCPServer:
    server = MCPServer("web")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(word: str) -> str:
        """Look a word up (claims to be read-only)."""
        return word

    return server


@asynccontextmanager
async def _dispatcher(recorder: Recorder, approve: Any = None) -> AsyncIterator[Dispatcher]:
    async with (
        Client(recording_server(recorder)) as rec,
        Client(_untrusted_server()) as web,
        Dispatcher(approve=approve) as dispatcher,
    ):
        await dispatcher.add_mcp_server("rec", rec, trusted=True)
        await dispatcher.add_mcp_server("web", web, trusted=False)
        yield dispatcher


def _writes_in_order(recorder: Recorder) -> list[str]:
    return [e.key for e in sorted(recorder.executions, key=lambda e: e.start) if e.tool == "write"]


# LangGraph ------------------------------------------------------------------------------------------


async def test_langgraph_node_answers_every_call_in_order_errors_flagged() -> None:
    """One ToolMessage per call (unparseable ones too), in call order; failures have status="error"."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage

    from dispatcher.integrations.langgraph import DispatcherToolNode

    recorder = Recorder()
    message = AIMessage(
        "",
        tool_calls=[
            {"id": "w1", "name": "write", "args": {"key": "w1"}},
            {"id": "r1", "name": "read", "args": {"key": "r1"}},
            {"id": "x", "name": "no_such_tool", "args": {}},
            {"id": "w2", "name": "write", "args": {"key": "w2"}},
        ],
        invalid_tool_calls=[{"id": "bad", "name": "read", "args": "{not json", "error": "bad JSON", "type": ""}],
    )
    async with _dispatcher(recorder) as dispatcher:
        node = DispatcherToolNode(dispatcher)
        answer = await node({"messages": [message]})
        assert {tool["function"]["name"] for tool in node.tool_schemas()} >= {"read", "write", "lookup"}
        as_list = await node([message])
        with pytest.raises(ValueError, match="not an AIMessage"):
            await node({"messages": [answer["messages"][0]]})
    messages = answer["messages"]
    assert [m.tool_call_id for m in messages] == ["w1", "r1", "x", "w2", "bad"]
    assert [m.status for m in messages] == ["success", "success", "error", "success", "error"]
    assert "unknown tool" in messages[2].content
    assert [m.tool_call_id for m in as_list] == ["w1", "r1", "x", "w2", "bad"]
    assert _writes_in_order(recorder) == ["w1", "w2", "w1", "w2"]
    assert recorder.violations == []


# OpenAI Agents SDK ----------------------------------------------------------------------------------


async def test_openai_agents_tools_keep_the_response_order_whatever_order_the_calls_start_in() -> None:
    """Calls invoked in a shuffled order run their writes in the order of the model's response."""
    pytest.importorskip("agents")
    from agents import FunctionTool
    from agents.items import ModelResponse
    from agents.testing import function_call
    from agents.tool_context import ToolContext
    from agents.usage import Usage

    from dispatcher.integrations.openai_agents import DispatcherTools

    recorder = Recorder()
    kinds = ["write", "read", "write", "read", "read", "write", "lookup"]
    calls = [(f"c{i}", kind, {"word": "x"} if kind == "lookup" else {"key": f"c{i}"}) for i, kind in enumerate(kinds)]
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        by_name = {tool.name: tool for tool in tools.tools if isinstance(tool, FunctionTool)}
        response = ModelResponse(
            output=[function_call(name, args, call_id=i) for i, name, args in calls], usage=Usage(), response_id="r"
        )
        tools.response_received(response)
        outputs: dict[str, str] = {}

        async def invoke(call_id: str, name: str, args: dict[str, str]) -> None:
            context = ToolContext(None, tool_name=name, tool_call_id=call_id, tool_arguments=json.dumps(args))
            outputs[call_id] = await by_name[name].on_invoke_tool(context, json.dumps(args))

        order = list(range(len(calls)))
        random.Random(7).shuffle(order)
        async with anyio.create_task_group() as tg:
            for position in order:
                tg.start_soon(invoke, *calls[position])
        with pytest.raises(ConfigurationError, match=r"hooks=tools\.hooks"):
            context = ToolContext(None, tool_name="read", tool_call_id="stray", tool_arguments="{}")
            await by_name["read"].on_invoke_tool(context, '{"key": "stray"}')
    marked = outputs.pop("c6")
    assert outputs == {i: f"{name}:{i}" for i, name, _ in calls if name != "lookup"}
    # The open-world lookup's answer reaches the SDK wrapped as untrusted content, behind a random boundary.
    assert re.fullmatch(
        r'<untrusted-content-([0-9a-f]{16}) tool="lookup">\nx\n</untrusted-content-\1>\n.*', marked, re.S
    )
    assert _writes_in_order(recorder) == ["c0", "c2", "c5"]
    assert recorder.violations == []


@ASYNCIO_ONLY
async def test_openai_agents_run_with_a_denied_call() -> None:
    """A full Runner.run: the denied call's output says so and the model sees it; the others ran."""
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, Runner
    from agents.testing import ScriptedModel, assistant_message, function_call

    from dispatcher.integrations.openai_agents import DispatcherTools

    async def approve(request: ApprovalRequest) -> bool:
        return request.call.id != "w2"

    recorder = Recorder()
    model = ScriptedModel(
        [
            [
                function_call("write", {"key": "w1"}, call_id="w1"),
                function_call("write", {"key": "w2"}, call_id="w2"),
                function_call("read", {"key": "r"}, call_id="r"),
            ],
            [assistant_message("done")],
        ]
    )
    async with _dispatcher(recorder, approve) as dispatcher:
        tools = DispatcherTools(dispatcher)
        agent = Agent(name="a", model=model, tools=tools.tools, hooks=tools.hooks)
        result = await Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True))
    outputs = {_call_id(item): item.output for item in result.new_items if item.type == "tool_call_output_item"}
    assert outputs["w1"] == "write:w1" and outputs["r"] == "read:r"
    assert outputs["w2"].startswith("Error (denied): not run: the user denied it")
    assert _writes_in_order(recorder) == ["w1"]
    assert result.final_output == "done"


def _call_id(item: Any) -> str:
    return str(item.raw_item["call_id"])


# pydantic-ai ----------------------------------------------------------------------------------------


async def test_pydantic_ai_tools_are_sequential_exactly_where_the_dispatcher_runs_them_alone() -> None:
    """`sequential` follows the effective annotations: a trusted read is not, an untrusted "read" is."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.tools import RunContext
    from pydantic_ai.usage import RunUsage

    from dispatcher.integrations.pydantic_ai import DispatcherToolset

    async with _dispatcher(Recorder()) as dispatcher:
        toolset = DispatcherToolset(dispatcher, id="d")
        tools = await toolset.get_tools(RunContext(deps=None, model=TestModel(), usage=RunUsage()))
        with pytest.raises(ConfigurationError, match="approvals must be"):
            DispatcherToolset(dispatcher, approvals="never")  # type: ignore[arg-type]
    sequential = {name: tool.tool_def.sequential for name, tool in tools.items()}
    assert sequential["read"] is False
    assert sequential["write"] is True
    assert sequential["lookup"] is True  # its read-only claim comes from an untrusted server
    assert toolset.id == "d"


def _scripted(first_turn: list[tuple[str, str, dict[str, str]]], seen: list[Any]) -> Any:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=i) for i, name, args in first_turn])
        seen.extend(messages[-1].parts)
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


@ASYNCIO_ONLY
async def test_pydantic_ai_tool_error_asks_the_model_to_retry() -> None:
    """A tool that reports an error (isError) reaches the model as a retry prompt, not as a success."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import RetryPromptPart, ToolReturnPart

    from dispatcher.integrations.pydantic_ai import DispatcherToolset

    seen: list[Any] = []
    async with _dispatcher(Recorder()) as dispatcher:
        model = _scripted([("f", "fail", {"key": "f"}), ("r", "read", {"key": "r"})], seen)
        result = await Agent(model, toolsets=[DispatcherToolset(dispatcher)]).run("go")
    assert result.output == "done"
    parts = {part.tool_call_id: part for part in seen}
    # pydantic-ai 2 reports a `ModelRetry` as a return part whose outcome is "retried".
    assert getattr(parts["f"], "outcome", None) == "retried" or isinstance(parts["f"], RetryPromptPart)
    assert "Error executing tool fail" in str(parts["f"].content)
    assert isinstance(parts["r"], ToolReturnPart) and parts["r"].content == "read:r"
    assert getattr(parts["r"], "outcome", None) != "retried"


@ASYNCIO_ONLY
async def test_pydantic_ai_deferred_approval_runs_the_call_only_once_approved() -> None:
    """With approvals="deferred", a destructive call becomes a DeferredToolRequests approval, run once approved."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults

    from dispatcher.integrations.pydantic_ai import DispatcherToolset

    recorder = Recorder()
    seen: list[Any] = []
    async with _dispatcher(recorder) as dispatcher:
        agent = Agent(
            _scripted([("r0", "read", {"key": "r0"}), ("w", "write", {"key": "w"}), ("r", "read", {"key": "r"})], seen),
            toolsets=[DispatcherToolset(dispatcher, approvals="deferred")],
            output_type=[str, DeferredToolRequests],
        )
        first = await agent.run("go")
        assert isinstance(first.output, DeferredToolRequests)
        # The read after the write waits with it, so that it cannot run before the write.
        assert [part.tool_call_id for part in first.output.approvals] == ["w", "r"]
        assert "may make destructive changes" in first.output.metadata["w"]["reason"]
        assert "waits for approval" in first.output.metadata["r"]["reason"]
        assert [e.key for e in recorder.executions] == ["r0"]
        second = await agent.run(
            message_history=first.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={"w": True, "r": True}),
        )
    assert second.output == "done"
    assert [e.key for e in sorted(recorder.executions, key=lambda e: e.start)] == ["r0", "w", "r"]


# Claude Agent SDK -----------------------------------------------------------------------------------


async def test_claude_server_shows_effective_annotations_and_runs_calls_through_the_dispatcher() -> None:
    """The in-process server lists the untrusted tool as not read-only and answers calls via the dispatcher."""
    pytest.importorskip("claude_agent_sdk")
    from dispatcher.integrations.claude_agent_sdk import sdk_server

    recorder = Recorder()
    async with _dispatcher(recorder) as dispatcher:
        config = sdk_server(dispatcher)
        async with Client(config["instance"]) as cli:
            listed = {tool.name: tool.annotations for tool in (await cli.list_tools()).tools}
            ok = await cli.call_tool("write", {"key": "k"})
            missing = await cli.call_tool("read", {})
    assert listed["read"] is not None and listed["read"].read_only_hint is True
    assert listed["lookup"] is not None and listed["lookup"].read_only_hint is False
    assert listed["lookup"].destructive_hint is True and listed["lookup"].open_world_hint is True
    assert ok.content[0].text == "write:k" and not ok.is_error  # type: ignore[union-attr]
    assert missing.is_error
    assert len(recorder.by_key("k")) == 1


async def test_claude_permission_callback_applies_the_policy() -> None:
    """Selected calls go to the approver (denied without one); reads are allowed; other tools are denied
    unless a callback for them is given."""
    pytest.importorskip("claude_agent_sdk")
    from claude_agent_sdk import PermissionResultAllow, ToolPermissionContext

    from dispatcher.integrations.claude_agent_sdk import claude_options, permission_callback

    asked: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(f"{request.call.id} {request.call.name}: {request.reason}")
        return False

    async with _dispatcher(Recorder()) as dispatcher:
        options = claude_options(dispatcher, approve=approve)
        can_use = options["can_use_tool"]
        context = ToolPermissionContext(tool_use_id="t1")
        read = await can_use("mcp__dispatcher__read", {"key": "a"}, context)
        write = await can_use("mcp__dispatcher__write", {"key": "a"}, context)
        other = await can_use("Bash", {"command": "ls"}, context)
        unknown = await can_use("mcp__dispatcher__nope", {}, context)
        without = await permission_callback(dispatcher, approve=None)("mcp__dispatcher__lookup", {}, context)

        async def allow_all(tool: str, arguments: dict[str, Any], context: ToolPermissionContext) -> Any:
            return PermissionResultAllow()

        delegated = await permission_callback(dispatcher, approve=approve, other_tools=allow_all)("Bash", {}, context)
    assert read.behavior == "allow" and delegated.behavior == "allow"
    assert other.behavior == "deny" and "no permission callback" in other.message
    assert write.behavior == "deny" and "denied" in write.message
    assert unknown.behavior == "deny"
    assert without.behavior == "deny" and "no approver" in without.message
    assert asked == ["t1 write: write may make destructive changes"]


@asynccontextmanager
async def _claude_setup(**options: Any) -> AsyncIterator[tuple[Dispatcher, Any, list[str]]]:
    """A dispatcher with its own approver and the given settings, and the SDK's ``can_use_tool`` from it."""
    pytest.importorskip("claude_agent_sdk")
    from dispatcher.integrations.claude_agent_sdk import claude_options

    asked: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(request.call.name)
        return True

    async with (
        Client(recording_server(Recorder())) as rec,
        Client(_untrusted_server()) as web,
        Dispatcher(approve=approve, **options) as dispatcher,
    ):
        await dispatcher.add_mcp_server("rec", rec, trusted=True)
        await dispatcher.add_mcp_server("web", web, trusted=False)
        yield dispatcher, claude_options(dispatcher)["can_use_tool"], asked


async def _permissions(can_use: Any, *tools: str) -> list[str]:
    from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny, ToolPermissionContext

    behaviours: list[str] = []
    for index, tool in enumerate(tools):
        answer = await can_use(f"mcp__dispatcher__{tool}", {"key": "k"}, ToolPermissionContext(tool_use_id=str(index)))
        assert isinstance(answer, PermissionResultAllow | PermissionResultDeny)  # the SDK's own types
        behaviours.append(answer.behavior)
    return behaviours


async def test_claude_options_apply_the_dispatchers_own_policy_and_approver() -> None:
    """Without approve/approval, the callback uses the dispatcher's: `always` asks a read, `never` spares a write."""
    from dispatcher import ApprovalPolicy

    policy = ApprovalPolicy(always={"rec:read"}, never={"rec:write"})
    async with _claude_setup(approval=policy) as (_, can_use, asked):
        assert await _permissions(can_use, "read", "write", "lookup") == ["allow", "allow", "allow"]
    # read: listed in always; write: in never, though destructive; lookup: untrusted, so destructive.
    assert asked == ["read", "lookup"]


async def test_claude_options_deny_what_the_dispatchers_approver_denies() -> None:
    """The dispatcher's approver decides (here: it denies all); a policy given to claude_options overrides."""
    pytest.importorskip("claude_agent_sdk")
    from dispatcher import ApprovalPolicy
    from dispatcher.integrations.claude_agent_sdk import claude_options

    async def deny(request: ApprovalRequest) -> bool:
        return False

    async with _dispatcher(Recorder(), approve=deny) as dispatcher:
        own = claude_options(dispatcher)["can_use_tool"]
        assert await _permissions(own, "read", "write") == ["allow", "deny"]
        given = claude_options(dispatcher, approval=ApprovalPolicy(destructive=False))["can_use_tool"]
        assert await _permissions(given, "read", "write") == ["allow", "allow"]
        nobody = claude_options(dispatcher, approve=None)["can_use_tool"]
        assert await _permissions(nobody, "write") == ["deny"]


async def test_claude_permission_callback_keeps_the_policy_timeout(virtual_clock: bool) -> None:
    """An approver that never answers denies the call after the dispatcher's policy timeout, as in a batch."""
    pytest.importorskip("claude_agent_sdk")
    from claude_agent_sdk import ToolPermissionContext

    from dispatcher import ApprovalPolicy
    from dispatcher.integrations.claude_agent_sdk import claude_options

    async def never(request: ApprovalRequest) -> bool:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with (
        Client(recording_server(Recorder())) as rec,
        Dispatcher(approve=never, approval=ApprovalPolicy(timeout=0.05)) as dispatcher,
    ):
        await dispatcher.add_mcp_server("rec", rec, trusted=True)
        can_use = claude_options(dispatcher)["can_use_tool"]
        with anyio.fail_after(30):
            answer = await can_use("mcp__dispatcher__write", {"key": "k"}, ToolPermissionContext(tool_use_id="t"))
    assert answer.behavior == "deny"
    assert "no approval within 0.05s" in answer.message


async def test_claude_server_puts_the_guard_approvals_to_the_same_approver() -> None:
    """The session guard still applies to calls the CLI runs, and asks the approver given to claude_options."""
    pytest.importorskip("claude_agent_sdk")
    from dispatcher import SessionGuard
    from dispatcher.integrations.claude_agent_sdk import claude_options

    asked: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(request.reason)
        return False

    guard = SessionGuard()
    guard.note_private_data("the user's files")
    async with _dispatcher(Recorder()) as dispatcher:  # the dispatcher has no approver of its own
        options = claude_options(dispatcher, approve=approve, guard=guard)
        async with Client(options["mcp_servers"]["dispatcher"]["instance"]) as cli:
            result = await cli.call_tool("lookup", {"word": "w"})
    assert result.is_error
    [reason] = asked
    assert "tool definitions of untrusted server 'web'" in reason


async def test_langgraph_node_answers_repeated_and_missing_ids() -> None:
    """A model that repeats a call id or gives none still gets one answer per call, under its own id."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage

    from dispatcher.integrations.langgraph import DispatcherToolNode

    recorder = Recorder()
    message = AIMessage(
        "",
        tool_calls=[
            {"id": "same", "name": "write", "args": {"key": "a"}},
            {"id": "same", "name": "write", "args": {"key": "b"}},
            {"id": None, "name": "read", "args": {"key": "c"}},
        ],
    )
    async with _dispatcher(recorder) as dispatcher:
        answer = await DispatcherToolNode(dispatcher)({"messages": [message]})
    assert [(m.tool_call_id, m.content) for m in answer["messages"]] == [
        ("same", "write:a"),
        ("same", "write:b"),
        ("", "read:c"),
    ]
    assert _writes_in_order(recorder) == ["a", "b"]


async def test_openai_agents_tools_refuse_a_repeated_call_id_without_blocking_the_others() -> None:
    """A response that uses one call id twice runs the first call and refuses the second; nothing waits forever."""
    pytest.importorskip("agents")
    from agents import FunctionTool
    from agents.items import ModelResponse
    from agents.testing import function_call
    from agents.tool_context import ToolContext
    from agents.usage import Usage

    from dispatcher.integrations.openai_agents import DispatcherTools

    recorder = Recorder()
    calls = [("x", "write", {"key": "one"}), ("x", "write", {"key": "two"}), ("y", "write", {"key": "three"})]
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher)
        [write] = [tool for tool in tools.tools if isinstance(tool, FunctionTool) and tool.name == "write"]
        tools.response_received(
            ModelResponse(output=[function_call(n, a, call_id=i) for i, n, a in calls], usage=Usage(), response_id="r")
        )
        outputs: list[str] = []
        with anyio.fail_after(10):
            for call_id, name, args in calls:
                context = ToolContext(None, tool_name=name, tool_call_id=call_id, tool_arguments=json.dumps(args))
                outputs.append(await write.on_invoke_tool(context, json.dumps(args)))
    assert outputs[0] == "write:one" and outputs[2] == "write:three"
    assert outputs[1].startswith("Error (failed): the call id 'x' was used twice")
    assert _writes_in_order(recorder) == ["one", "three"]


@ASYNCIO_ONLY
async def test_openai_agents_sdk_approvals_hold_the_rest_of_the_turn_and_keep_its_order() -> None:
    """approvals="sdk": from the first destructive call on, the turn waits for the SDK's approval; order holds."""
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, Runner
    from agents.testing import ScriptedModel, assistant_message, function_call

    from dispatcher.integrations.openai_agents import DispatcherTools

    recorder = Recorder()
    model = ScriptedModel(
        [
            [
                function_call("read", {"key": "r1"}, call_id="r1"),
                function_call("write", {"key": "w1"}, call_id="w1"),
                function_call("read", {"key": "r2"}, call_id="r2"),
                function_call("write", {"key": "w2"}, call_id="w2"),
            ],
            [assistant_message("done")],
        ]
    )
    config = RunConfig(tracing_disabled=True)
    async with _dispatcher(recorder) as dispatcher:
        tools = DispatcherTools(dispatcher, approvals="sdk")
        agent = Agent(name="a", model=model, tools=tools.tools, hooks=tools.hooks)
        first = await Runner.run(agent, "go", run_config=config)
        held = {item.raw_item.call_id: item for item in first.interruptions}  # type: ignore[union-attr]
        assert sorted(held) == ["r2", "w1", "w2"]  # the read before the first write ran already
        assert [e.key for e in recorder.executions] == ["r1"]
        state = first.to_state()
        state.approve(held["w1"])
        state.approve(held["r2"])
        state.reject(held["w2"])
        second = await Runner.run(agent, state, run_config=config)
    assert second.final_output == "done"
    assert [e.key for e in sorted(recorder.executions, key=lambda e: e.start)] == ["r1", "w1", "r2"]
    assert recorder.violations == []
