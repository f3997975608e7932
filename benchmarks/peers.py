"""Workload 8, peers (optional): the same batch of tool calls run by the dispatcher and by what users pick
instead, in one process, as ratios to the dispatcher.

Installed by the `peers` extra (`pip install -e '.[peers]'`); without it the suite skips this workload and
says so. It is not part of the quick run (CI). Nothing touches the network: each framework runs its own
tool execution, driven by a scripted model built on its public model interface.

Peers, each given the very same coroutine functions (`lookup`, and `sleep_read` for the sleeping case):

- `asyncio.gather` over one coroutine per call, and one anyio task per call in a task group (bare: no
  argument validation, no result conversion; what a hand-written loop does);
- LangGraph: a `ToolNode` as the only node of a compiled `StateGraph(MessagesState)`, invoked with one
  `AIMessage` carrying every tool call (how an agent graph runs a model's tool calls);
- pydantic-ai: an `Agent` whose `FunctionModel` answers the prompt with every tool call in one response,
  then with a final text once it sees the tool returns;
- OpenAI Agents SDK: an `Agent` run by `Runner.run`, whose `Model` (a subclass of the SDK's public
  interface) answers the same way; tracing is disabled.

The frameworks' figures include their per-run cost (building the run, two scripted model turns), a few
hundred microseconds per batch; the dispatcher's include validating each call's arguments and converting
each result, as the frameworks do. Two cases: zero-latency calls (the cost of running a call), and a
turn of calls that each sleep a few milliseconds (the makespan a user waits for). The frameworks run
every call of a batch at once; the dispatcher is shown with its default limit (16 in flight) and with
`max_concurrency=None` (all in flight, the same concurrency as the peers). The frameworks run on
asyncio only; on trio the dispatcher is compared with one anyio task per call.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher import Dispatcher

from ._measure import interleave
from ._results import Comparison, WorkloadResult
from ._tools import dispatch_once, latency_calls, lookup, register_latency_tools, sleep_read, zero_calls

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ._report import Progress

__all__ = [
    "DISPATCHER",
    "DISPATCHER_UNLIMITED",
    "FULL",
    "GATHER",
    "LANGGRAPH",
    "OPENAI_AGENTS",
    "PACKAGES",
    "PYDANTIC_AI",
    "QUICK",
    "TASKS",
    "Config",
    "missing",
    "run",
]

DISPATCHER = "dispatcher"
DISPATCHER_UNLIMITED = "dispatcher, max_concurrency=None"
GATHER = "asyncio.gather"
TASKS = "anyio task per call"
LANGGRAPH = "LangGraph ToolNode"
PYDANTIC_AI = "pydantic-ai Agent"
OPENAI_AGENTS = "OpenAI Agents SDK Runner"

# Import name -> distribution name, for the message when the extra is missing.
PACKAGES = {
    "langgraph": "langgraph",
    "langchain_core": "langchain-core",
    "pydantic_ai": "pydantic-ai-slim",
    "agents": "openai-agents",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    calls: int = 1000
    sleep_calls: int = 64
    sleep: float = 0.010
    repeat: int = 10
    backends: tuple[str, ...] = ("asyncio", "trio")


FULL = Config()
QUICK = Config(calls=200, repeat=3)


def missing() -> str | None:
    """Why the workload cannot run (the `peers` extra is not installed), or None."""
    absent = [dist for module, dist in PACKAGES.items() if importlib.util.find_spec(module) is None]
    if not absent:
        return None
    return f"needs {', '.join(absent)}: pip install -e '.[peers]'"


def _gather(fn: Callable[..., Awaitable[Any]], arguments: list[dict[str, Any]]) -> Callable[[], Awaitable[float]]:
    async def run_gather() -> float:
        start = time.perf_counter()
        results = await asyncio.gather(*[fn(**args) for args in arguments])
        elapsed = time.perf_counter() - start
        assert len(results) == len(arguments)
        return elapsed

    return run_gather


def _tasks(fn: Callable[..., Awaitable[Any]], arguments: list[dict[str, Any]]) -> Callable[[], Awaitable[float]]:
    async def run_tasks() -> float:
        results: list[Any] = [None] * len(arguments)

        async def one(i: int, args: dict[str, Any]) -> None:
            results[i] = await fn(**args)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i, args in enumerate(arguments):
                tg.start_soon(one, i, args)
        elapsed = time.perf_counter() - start
        assert all(result is not None for result in results)
        return elapsed

    return run_tasks


def _langgraph(fn: Callable[..., Awaitable[Any]], arguments: list[dict[str, Any]]) -> Callable[[], Awaitable[float]]:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import StructuredTool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    name = fn.__name__
    tool = StructuredTool.from_function(coroutine=fn, name=name, description=fn.__doc__ or name)
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile()
    message = AIMessage(
        content="",
        tool_calls=[
            {"name": name, "args": args, "id": f"c{i}", "type": "tool_call"} for i, args in enumerate(arguments)
        ],
    )

    async def run_langgraph() -> float:
        start = time.perf_counter()
        state = await graph.ainvoke({"messages": [message]})
        elapsed = time.perf_counter() - start
        replies = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        assert len(replies) == len(arguments) and all(m.status == "success" for m in replies), replies[:1]
        return elapsed

    return run_langgraph


def _pydantic_ai(fn: Callable[..., Awaitable[Any]], arguments: list[dict[str, Any]]) -> Callable[[], Awaitable[float]]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    name = fn.__name__

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[ToolCallPart(name, args, tool_call_id=f"c{i}") for i, args in enumerate(arguments)]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(script))
    agent.tool_plain(fn)

    async def run_pydantic_ai() -> float:
        start = time.perf_counter()
        result = await agent.run("run the tools")
        elapsed = time.perf_counter() - start
        returns = [
            part
            for message in result.all_messages()
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        assert len(returns) == len(arguments) and result.output == "done", (len(returns), result.output)
        return elapsed

    return run_pydantic_ai


def _openai_agents(
    fn: Callable[..., Awaitable[Any]], arguments: list[dict[str, Any]]
) -> Callable[[], Awaitable[float]]:
    from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool, set_tracing_disabled
    from agents.items import ToolCallOutputItem
    from agents.models.interface import Model
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    name = fn.__name__
    set_tracing_disabled(True)

    class Scripted(Model):  # type: ignore[misc, unused-ignore]  # Model is Any without the peers extra
        """Every tool call in the first response; a final message once the tool outputs come back."""

        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
            answered = not isinstance(input, str) and any(
                isinstance(item, dict) and item.get("type") == "function_call_output" for item in input
            )
            output: list[Any]
            if answered:
                text = ResponseOutputText(type="output_text", text="done", annotations=[])
                output = [
                    ResponseOutputMessage(id="m", type="message", role="assistant", status="completed", content=[text])
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call", call_id=f"c{i}", name=name, arguments=json.dumps(args)
                    )
                    for i, args in enumerate(arguments)
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark runs without streaming")

    agent: Agent[Any] = Agent(name="bench", model=Scripted(), tools=[function_tool(fn)])
    config = RunConfig(tracing_disabled=True)

    async def run_openai_agents() -> float:
        start = time.perf_counter()
        result = await Runner.run(agent, "run the tools", run_config=config)
        elapsed = time.perf_counter() - start
        outputs = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
        assert len(outputs) == len(arguments) and result.final_output == "done", (len(outputs), result.final_output)
        return elapsed

    return run_openai_agents


async def _measure(
    fn: Callable[..., Awaitable[Any]],
    calls: Sequence[Any],
    arguments: list[dict[str, Any]],
    repeat: int,
    backend: str,
    progress: Progress,
    label: str,
) -> dict[str, list[float]]:
    async with Dispatcher() as dispatcher, Dispatcher(max_concurrency=None) as unlimited:
        register_latency_tools(dispatcher)
        register_latency_tools(unlimited)
        variants: dict[str, Callable[[], Awaitable[float]]] = {
            DISPATCHER: dispatch_once(dispatcher, list(calls)),
            DISPATCHER_UNLIMITED: dispatch_once(unlimited, list(calls)),
            TASKS: _tasks(fn, arguments),
        }
        if backend == "asyncio":
            variants[GATHER] = _gather(fn, arguments)
            variants[LANGGRAPH] = _langgraph(fn, arguments)
            variants[PYDANTIC_AI] = _pydantic_ai(fn, arguments)
            variants[OPENAI_AGENTS] = _openai_agents(fn, arguments)
        return await interleave(variants, repeat, progress, label=f"{backend}: {label}")


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Run the same batches through the dispatcher and its peers; report each peer as a ratio to it."""
    why = missing()
    if why is not None:
        raise RuntimeError(f"the peers workload {why}")
    result = WorkloadResult(
        name="peers",
        title=(
            f"9. Peers: {config.calls:,} zero-latency calls, and {config.sleep_calls} calls of "
            f"{config.sleep * 1000:g} ms, in one batch"
        ),
        params={
            "calls": config.calls,
            "sleep_calls": config.sleep_calls,
            "sleep_ms": config.sleep * 1000,
            "repeat": config.repeat,
            "backends": list(config.backends),
            "versions": _versions(),
        },
    )
    zero, zero_arguments = zero_calls(config.calls)
    sleeping = latency_calls([False] * config.sleep_calls, config.sleep)
    sleeping_arguments = [dict(call.arguments or {}) for call in sleeping]
    for backend in config.backends:
        cases = (
            (
                f"{backend}: {config.calls:,} calls, zero latency",
                lookup,
                zero,
                zero_arguments,
                "us/call",
                1e6 / config.calls,
            ),
            (
                f"{backend}: {config.sleep_calls} calls of {config.sleep * 1000:g} ms",
                sleep_read,
                sleeping,
                sleeping_arguments,
                "ms",
                1e3,
            ),
        )
        for case, fn, calls, arguments, unit, scale in cases:
            samples = anyio.run(_measure, fn, calls, arguments, config.repeat, backend, progress, case, backend=backend)
            scaled = {name: [s * scale for s in values] for name, values in samples.items()}
            for name, values in scaled.items():
                result.row(case, name, unit, values)
            # Zero latency: concurrency changes little, so peers are compared with the default settings;
            # sleeping calls: with the dispatcher at the peers' concurrency (all in flight).
            reference = DISPATCHER if unit == "us/call" else DISPATCHER_UNLIMITED
            for name, values in scaled.items():
                if name != reference:
                    result.comparisons.append(
                        Comparison.paired(
                            case,
                            (name, values),
                            (reference, scaled[reference]),
                            # Dispatcher against dispatcher: the cost of a setting, lower is better.
                            better="lower" if name.startswith(DISPATCHER) else "higher",
                        )
                    )
    zero_case = f"{config.backends[0]}: {config.calls:,} calls, zero latency"
    slower = [
        f"{c.numerator} {c.ratio.median:.1f}x"
        for c in result.comparisons
        if c.case == zero_case and c.numerator in (LANGGRAPH, PYDANTIC_AI, OPENAI_AGENTS)
    ]
    if slower:
        result.headline = f"time per zero-latency call against the dispatcher's ({config.backends[0]}): " + ", ".join(
            slower
        )
    result.notes.append(
        "ratios are peer / dispatcher: above 1 the peer is slower. LangGraph, pydantic-ai and the OpenAI "
        "Agents SDK run on asyncio only; their figures include a per-run cost (two scripted model turns)."
    )
    return result


def _versions() -> dict[str, str | None]:
    import importlib.metadata

    versions: dict[str, str | None] = {}
    for dist in PACKAGES.values():
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions
