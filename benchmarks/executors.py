"""Choosing the executor: one task per admitted call against the worker pool, in one run.

Run it with ``python -m benchmarks.executors [--quick]``. Both executors serve the same `Dispatcher`
(the pool, `_worker_pool.Executor`, is the executor of commit 4749c3b, put in place of the default one
before the dispatcher is entered) and are measured in the same process, interleaved repetition by
repetition, on asyncio and on trio:

- overhead: one batch of 1,000 zero-latency read-only calls, default settings (us per call);
- no limit: the same with ``max_concurrency=None`` (us per call);
- small batches: 500 batches of 4 such calls, one after the other (us per batch);
- 100,000 calls: one batch, default settings (us per call), and the longest stall of a ticker task
  that sleeps 1 ms at a time in the same loop while the batch runs;
- through MCP: one batch of 1,000 zero-latency calls to an in-process `MCPServer` (us per call).

The table printed is the one in docs/benchmarks.md ("Choosing the executor"): medians, with the
min-max of the paired ratios pool / task-per-call.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer

from dispatcher import Dispatcher, ToolCall

from . import _worker_pool
from ._measure import Stat, interleave, paired_ratios
from ._report import Progress
from ._tools import READ_ONLY, lookup, zero_calls

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["Config", "main", "measure"]

TASKS = "task per call"
POOL = "worker pool"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    calls: int = 1000
    repeat: int = 15
    batches: int = 500
    big: int = 100_000
    big_repeat: int = 3


QUICK = Config(repeat=5, big=20_000, big_repeat=2)


def _with_pool(dispatcher: Dispatcher) -> Dispatcher:
    """Put the worker pool in place of the dispatcher's executor (before it is entered)."""
    current = dispatcher._executor
    dispatcher._executor = _worker_pool.Executor(  # type: ignore[assignment]
        dispatcher._catalog,
        max_concurrency=current.gate.limit,
        call_timeout=dispatcher.call_timeout,
        retry=dispatcher.retry,
    )
    return dispatcher


def _make(kind: str, **settings: Any) -> Dispatcher:
    dispatcher = Dispatcher(**settings)
    return _with_pool(dispatcher) if kind == POOL else dispatcher


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
    async with (
        _make(TASKS) as tasks,
        _make(POOL) as pool,
        _make(TASKS, max_concurrency=None) as tasks_unlimited,
        _make(POOL, max_concurrency=None) as pool_unlimited,
        _make(TASKS) as tasks_mcp,
        _make(POOL) as pool_mcp,
        Client(_mcp_server()) as client,
    ):
        for dispatcher in (tasks, pool, tasks_unlimited, pool_unlimited):
            dispatcher.add_function(lookup, annotations=READ_ONLY)
        await tasks_mcp.add_mcp_server("zero", client, trusted=True)
        await pool_mcp.add_mcp_server("zero", client, trusted=True)
        n = config.calls
        out["overhead, 1,000 calls (us/call)"] = await interleave(
            {TASKS: _timed(tasks, calls, n), POOL: _timed(pool, calls, n)}, config.repeat, progress, label="overhead"
        )
        out["max_concurrency=None, 1,000 calls (us/call)"] = await interleave(
            {TASKS: _timed(tasks_unlimited, calls, n), POOL: _timed(pool_unlimited, calls, n)},
            config.repeat,
            progress,
            label="no limit",
        )
        out["batches of 4 (us/batch)"] = await interleave(
            {TASKS: _batches(tasks, small), POOL: _batches(pool, small)}, config.repeat, progress, label="batches"
        )
        out["through MCP in-process, 1,000 calls (us/call)"] = await interleave(
            {TASKS: _timed(tasks_mcp, calls, n), POOL: _timed(pool_mcp, calls, n)},
            max(3, config.repeat // 3),
            progress,
            label="mcp",
        )
        big_case = f"{config.big:,} calls (us/call)"
        stall_case = f"{config.big:,} calls: longest ticker stall (ms)"
        out[big_case] = {TASKS: [], POOL: []}
        out[stall_case] = {TASKS: [], POOL: []}
        for rep in range(config.big_repeat):
            order = [(TASKS, tasks), (POOL, pool)]
            for name, dispatcher in order if rep % 2 == 0 else order[::-1]:
                progress.update(f"{big_case}: {name}, repetition {rep + 1}")
                gc.collect()
                figure, stall = await stall_while(_timed(dispatcher, big, config.big))
                out[big_case][name].append(figure)
                out[stall_case][name].append(stall)
    return out


def measure(config: Config) -> dict[str, dict[str, dict[str, list[float]]]]:
    """backend -> case -> variant -> samples."""
    return {backend: anyio.run(_measure, config, backend=backend) for backend in ("asyncio", "trio")}


def render(results: dict[str, dict[str, dict[str, list[float]]]]) -> str:
    """A markdown table: each case on each backend, both executors, and the paired ratio pool / tasks."""
    lines = [
        f"| backend | case | {TASKS} | {POOL} | {POOL} / {TASKS} (min-max) |",
        "|---|---|---:|---:|---|",
    ]
    for backend, cases in results.items():
        for case, samples in cases.items():
            tasks, pool = Stat.of(samples[TASKS]), Stat.of(samples[POOL])
            ratio = Stat.of(paired_ratios(samples[POOL], samples[TASKS]))
            lines.append(
                f"| {backend} | {case} | {tasks.median:,.1f} | {pool.median:,.1f} | "
                f"{ratio.median:.2f} ({ratio.min:.2f}-{ratio.max:.2f}) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.executors", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and a 20,000-call batch")
    args = parser.parse_args(argv)
    print(render(measure(QUICK if args.quick else Config())))


if __name__ == "__main__":
    main()
