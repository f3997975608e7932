"""Smoke test of one framework integration, installed from the wheel with its extra alone.

Run by `make package-check` once per extra, right after `pip install "<wheel>[<extra>]"`, with the Python of
a venv that has nothing else: `python smoke_integrations.py <extra>`. It imports the integration module and
runs one model turn (a write, then a read of what it wrote) through the framework's own runner with the
framework's fake model, and checks that the write ran first and alone and that both answers came back.
The Google ADK adapter (extra `adk`) has its own venv and tests (`make adk`).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import anyio
from mcp.types import ToolAnnotations

import dispatcher
from dispatcher import Dispatcher

TURN = [("c1", "write", {"key": "a"}), ("c2", "read", {"key": "a"})]
ANSWERS = {"c1": "wrote a", "c2": "read a"}


def _dispatcher(order: list[str]) -> Dispatcher:
    d = Dispatcher()

    async def read(key: str) -> str:
        order.append(f"read {key}")
        return f"read {key}"

    async def write(key: str) -> str:
        order.append(f"write {key}")
        await anyio.sleep(0.01)  # a read started beside it would record itself meanwhile
        order.append("write done")
        return f"wrote {key}"

    d.add_function(read, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    d.add_function(write, annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False))
    return d


def _fake_chat_model() -> Any:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    class FakeModel(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:  # the agents bind the adapter's tools
            return self

    message = AIMessage("", tool_calls=[{"id": i, "name": n, "args": a} for i, n, a in TURN])
    return FakeModel(messages=iter([message, AIMessage("done")]))


async def _langgraph(d: Dispatcher) -> dict[str, str]:
    from langgraph.prebuilt import create_react_agent

    from dispatcher.integrations.langgraph import DispatcherToolNode

    # LangGraph 1.x says create_react_agent has moved to langchain, which this extra does not install.
    warnings.filterwarnings("ignore", "create_react_agent has been moved")
    agent = create_react_agent(_fake_chat_model(), tools=DispatcherToolNode(d))
    state = await agent.ainvoke({"messages": [("user", "go")]})
    return {m.tool_call_id: m.content for m in state["messages"] if m.type == "tool"}


async def _langchain(d: Dispatcher) -> dict[str, str]:
    from langchain.agents import create_agent

    from dispatcher.integrations.langchain import DispatcherMiddleware

    agent = create_agent(_fake_chat_model(), middleware=[DispatcherMiddleware(d)])
    state = await agent.ainvoke({"messages": [("user", "go")]})
    return {m.tool_call_id: m.content for m in state["messages"] if m.type == "tool"}


async def _openai_agents(d: Dispatcher) -> dict[str, str]:
    from agents import Agent, RunConfig, Runner
    from agents.testing import ScriptedModel, assistant_message, function_call

    from dispatcher.integrations.openai_agents import DispatcherTools

    model = ScriptedModel([[function_call(n, a, call_id=i) for i, n, a in TURN], [assistant_message("done")]])
    tools = DispatcherTools(d)
    agent = Agent(name="smoke", model=model, tools=tools.tools, hooks=tools.hooks)
    result = await Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True))
    return {i.raw_item["call_id"]: i.output for i in result.new_items if i.type == "tool_call_output_item"}


async def _pydantic_ai(d: Dispatcher) -> dict[str, str]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from dispatcher.integrations.pydantic_ai import DispatcherToolset

    answers: dict[str, str] = {}

    def respond(messages: Any, info: Any) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=i) for i, n, a in TURN])
        answers.update({part.tool_call_id: part.content for part in messages[-1].parts})
        return ModelResponse(parts=[TextPart("done")])

    await Agent(FunctionModel(respond), toolsets=[DispatcherToolset(d)]).run("go")
    return answers


async def _claude_agent_sdk(d: Dispatcher) -> dict[str, str]:
    from claude_agent_sdk import ToolPermissionContext
    from mcp import Client

    from dispatcher.integrations.claude_agent_sdk import claude_options

    # The CLI is not here: its side is played as the docs do, asking the permission callback before each call.
    options: Any = claude_options(d, approve=None)
    answers = {}
    async with Client(options["mcp_servers"]["dispatcher"]["instance"]) as cli:
        for call_id, name, args in TURN:
            context = ToolPermissionContext(tool_use_id=call_id)
            permission = await options["can_use_tool"](f"mcp__dispatcher__{name}", args, context)
            assert permission.behavior == "allow", permission
            answers[call_id] = (await cli.call_tool(name, args)).content[0].text
    return answers


SMOKES = {
    "langgraph": _langgraph,
    "langchain": _langchain,
    "openai-agents": _openai_agents,
    "pydantic-ai": _pydantic_ai,
    "claude-agent-sdk": _claude_agent_sdk,
}


async def main(extra: str) -> None:
    order: list[str] = []
    async with _dispatcher(order) as d:
        answers = await SMOKES[extra](d)
    assert {key: value.strip() for key, value in answers.items()} == ANSWERS, answers
    assert order == ["write a", "write done", "read a"], order
    assert "site-packages" in dispatcher.__file__, f"imported from {dispatcher.__file__}, not the installed wheel"
    print(f"[{extra}]: a write and a read ran in order through the adapter")


anyio.run(main, sys.argv[1])
