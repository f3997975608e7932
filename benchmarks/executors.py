"""Choosing the executor: one task per admitted call against the dispatcher's runners, in one run.

Run it with ``python -m benchmarks.executors [--quick]``. Both executors serve the same `Dispatcher` and
are measured in the same process, interleaved repetition by repetition, on asyncio and on trio:

- task per call: the simplest executor the gate allows, `TaskPerCall` below. Each call the gate admits
  gets an anyio task of its own, which runs the call's attempts under a cancel scope of the call's own
  (the dispatcher's general path, `Executor._execute`), frees its place and admits the next calls;
- runners (kept): the dispatcher's own executor. Runner tasks are reused: a runner takes the next
  admitted call when it finishes one, runs calls of one attempt under one cancel scope whose deadline
  it moves, and new runners are brought only as calls are admitted together or wait (see
  `dispatcher._execution`).

Cases:

- overhead: one batch of 1,000 zero-latency read-only calls, default settings (us per call);
- no limit: the same with ``max_concurrency=None`` (us per call);
- small batches: 500 batches of 4 such calls, one after the other (us per batch);
- 100,000 calls: one batch, default settings (us per call), and the longest stall of a ticker task
  that sleeps 1 ms at a time in the same loop while the batch runs;
- through MCP: one batch of 1,000 zero-latency calls to an in-process `MCPServer` (us per call).

The table printed is the one in docs/benchmarks.md ("Choosing the executor"): medians, with the
min-max of the paired ratios runners / task-per-call.
"""

from __future__ import annotations

import argparse
import gc
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer

from dispatcher import Dispatcher, ToolCall
from dispatcher._execution import Executor

from ._measure import Stat, interleave, paired_ratios
from ._report import Progress
from ._tools import READ_ONLY, lookup, zero_calls

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["Config", "main", "measure"]

TASKS = "task per call"
RUNNERS = "runners (kept)"
KINDS = [TASKS, RUNNERS]


class TaskPerCall(Executor):
    """The simplest executor: one task per admitted call, started as the gate admits it."""

    def _pump(self, arrived: bool = False) -> None:
        tg = self._tg
        assert tg is not None
        while (ticket := self.gate.take()) is not None:
            tg.start_soon(self._one, ticket)

    async def _one(self, ticket: Any) -> None:
        try:
            await self._run_admitted(ticket.item)
        finally:
            self.gate.finish(ticket)
            if self._open:
                self._pump()


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    calls: int = 1000
    repeat: int = 15
    batches: int = 500
    big: int = 100_000
    big_repeat: int = 3


QUICK = Config(repeat=5, big=20_000, big_repeat=2)


def _make(kind: str, **settings: Any) -> Dispatcher:
    """A dispatcher with the executor `kind` in place of its own (swapped before it is entered)."""
    dispatcher = Dispatcher(**settings)
    if kind == TASKS:
        dispatcher._executor = TaskPerCall(
            dispatcher._catalog,
            max_concurrency=dispatcher.max_concurrency,
            call_timeout=dispatcher.call_timeout,
            retry=dispatcher.retry,
        )
    return dispatcher


def _timed(dispatcher: Dispatcher, calls: list[ToolCall], per: int) -> Callable[[], Awaitable[float]]:
    async def run() -> float:
        start = time.perf_counter()
        results = await dispatcher.dispatch(calls)
        elapsed = time.perf_counter() - start
        assert all(result.ok for result in results), next(r for r in results if not r.ok)
        return elapsed / per * 1e6

    return run


def _batches(dispatcher: Dispatcher, batches: list[list[ToolCall]]) -> Callable[[], Awaitable[float]]:
    async def run() -> float:
        dispatch = dispatcher.dispatch
        start = time.perf_counter()
        for calls in batches:
            await dispatch(calls)
        return (time.perf_counter() - start) / len(batches) * 1e6

    return run


def _mcp_server() -> MCPServer:
    server = MCPServer("zero")

    @server.tool(annotations=READ_ONLY)
    async def lookup(key: str) -> str:
        return key

    return server


async def stall_while(run: Callable[[], Awaitable[float]]) -> tuple[float, float]:
    """Run `run` beside a ticker that sleeps 1 ms at a time; return its figure and the longest tick (ms)."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        last = anyio.current_time()
        while not done:
            await anyio.sleep(0.001)
            now = anyio.current_time()
            worst = max(worst, now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.005)
        figure = await run()
        done = True
    return figure, (worst - 0.001) * 1e3


async def _measure(config: Config) -> dict[str, dict[str, list[float]]]:
    """case -> variant -> samples."""
    out: dict[str, dict[str, list[float]]] = {}
    calls, _ = zero_calls(config.calls)
    small = [zero_calls(4, prefix=f"b{b}-")[0] for b in range(config.batches)]
    big, _ = zero_calls(config.big, prefix="x")
    progress = Progress()
    n = config.calls
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(Client(_mcp_server()))
        default: dict[str, Dispatcher] = {}
        unlimited: dict[str, Dispatcher] = {}
        mcp: dict[str, Dispatcher] = {}
        for kind in KINDS:
            default[kind] = await stack.enter_async_context(_make(kind))
            unlimited[kind] = await stack.enter_async_context(_make(kind, max_concurrency=None))
            mcp[kind] = await stack.enter_async_context(_make(kind))
            default[kind].add_function(lookup, annotations=READ_ONLY)
            unlimited[kind].add_function(lookup, annotations=READ_ONLY)
            await mcp[kind].add_mcp_server("zero", client, trusted=True)
        out["overhead, 1,000 calls (us/call)"] = await interleave(
            {kind: _timed(default[kind], calls, n) for kind in KINDS}, config.repeat, progress, label="overhead"
        )
        out["max_concurrency=None, 1,000 calls (us/call)"] = await interleave(
            {kind: _timed(unlimited[kind], calls, n) for kind in KINDS}, config.repeat, progress, label="no limit"
        )
        out["batches of 4 (us/batch)"] = await interleave(
            {kind: _batches(default[kind], small) for kind in KINDS}, config.repeat, progress, label="batches"
        )
        out["through MCP in-process, 1,000 calls (us/call)"] = await interleave(
            {kind: _timed(mcp[kind], calls, n) for kind in KINDS}, max(3, config.repeat // 3), progress, label="mcp"
        )
        big_case = f"{config.big:,} calls (us/call)"
        stall_case = f"{config.big:,} calls: longest ticker stall (ms)"
        out[big_case] = {kind: [] for kind in KINDS}
        out[stall_case] = {kind: [] for kind in KINDS}
        for rep in range(config.big_repeat):
            shift = rep % len(KINDS)
            for kind in KINDS[shift:] + KINDS[:shift]:
                progress.update(f"{big_case}: {kind}, repetition {rep + 1}")
                gc.collect()
                figure, stall = await stall_while(_timed(default[kind], big, config.big))
                out[big_case][kind].append(figure)
                out[stall_case][kind].append(stall)
    return out


def measure(config: Config) -> dict[str, dict[str, dict[str, list[float]]]]:
    """backend -> case -> variant -> samples."""
    return {backend: anyio.run(_measure, config, backend=backend) for backend in ("asyncio", "trio")}


def render(results: dict[str, dict[str, dict[str, list[float]]]]) -> str:
    """A markdown table: each case on each backend, each executor, and the paired ratios runners / tasks."""
    lines = [
        f"| backend | case | {TASKS} | {RUNNERS} | runners / tasks (min-max) |",
        "|---|---|---:|---:|---|",
    ]
    for backend, cases in results.items():
        for case, samples in cases.items():
            medians = " | ".join(f"{Stat.of(samples[kind]).median:,.1f}" for kind in KINDS)
            ratio = Stat.of(paired_ratios(samples[RUNNERS], samples[TASKS]))
            lines.append(f"| {backend} | {case} | {medians} | {ratio.median:.2f} ({ratio.min:.2f}-{ratio.max:.2f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.executors", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and a 20,000-call batch")
    args = parser.parse_args(argv)
    print(render(measure(QUICK if args.quick else Config())))


if __name__ == "__main__":
    main()
