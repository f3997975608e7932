"""Workload 1, overhead: 1,000 zero-latency read-only calls in one batch.

The dispatcher runs with its default settings (max_concurrency=16, call_timeout=60) against:

- one anyio task per call in a task group, and `asyncio.gather` over one coroutine per call (asyncio
  only), each in two flavours:
  - "bare": each task awaits the tool's coroutine function with the call's arguments;
  - "same adapter": each task does what the dispatcher does for a local function, through the same
    `FunctionTool` adapter: pydantic validation of the arguments and conversion of the return value
    into a `CallToolResult`. The ratio against this flavour isolates the cost of scheduling.

Every variant stores each call's result in call order. The batch's calls (ToolCalls for the
dispatcher, argument dicts for the references) are built before the clock starts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher import Dispatcher

from ._measure import Stat, interleave
from ._results import Comparison, Target, WorkloadResult
from ._tools import READ_ONLY, Adapter, lookup, zero_calls

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._report import Progress

__all__ = ["FULL", "QUICK", "Config", "run"]

DISPATCHER = "dispatcher"
TASKS_BARE = "anyio task per call (bare)"
TASKS_ADAPTER = "anyio task per call (same adapter)"
GATHER_BARE = "asyncio.gather (bare)"
GATHER_ADAPTER = "asyncio.gather (same adapter)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    calls: int = 1000
    repeat: int = 30
    backends: tuple[str, ...] = ("asyncio", "trio")


FULL = Config()
QUICK = Config(repeat=10)


async def _measure(config: Config, backend: str, progress: Progress) -> dict[str, list[float]]:
    calls, arguments = zero_calls(config.calls)
    n = config.calls
    adapter = Adapter(lookup)
    async with Dispatcher() as dispatcher:
        dispatcher.add_function(lookup, annotations=READ_ONLY)

        async def run_dispatcher() -> float:
            start = time.perf_counter()
            results = await dispatcher.dispatch(calls)
            elapsed = time.perf_counter() - start
            assert len(results) == n and results[-1].ok, results[-1]
            return elapsed

        async def run_tasks_bare() -> float:
            results: list[Any] = [None] * n

            async def one(i: int, args: dict[str, Any]) -> None:
                results[i] = await lookup(**args)

            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i, args in enumerate(arguments):
                    tg.start_soon(one, i, args)
            return time.perf_counter() - start

        async def run_tasks_adapter() -> float:
            results: list[Any] = [None] * n

            async def one(i: int, args: dict[str, Any]) -> None:
                results[i] = await adapter.call(args)

            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i, args in enumerate(arguments):
                    tg.start_soon(one, i, args)
            elapsed = time.perf_counter() - start
            assert not results[-1].is_error
            return elapsed

        async def run_gather_bare() -> float:
            start = time.perf_counter()
            await asyncio.gather(*[lookup(**args) for args in arguments])
            return time.perf_counter() - start

        async def run_gather_adapter() -> float:
            start = time.perf_counter()
            await asyncio.gather(*[adapter.call(args) for args in arguments])
            return time.perf_counter() - start

        variants: dict[str, Callable[[], Awaitable[float]]] = {
            DISPATCHER: run_dispatcher,
            TASKS_BARE: run_tasks_bare,
            TASKS_ADAPTER: run_tasks_adapter,
        }
        if backend == "asyncio":
            variants[GATHER_BARE] = run_gather_bare
            variants[GATHER_ADAPTER] = run_gather_adapter
        return await interleave(variants, config.repeat, progress, label=backend)


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Measure per-call overhead on each backend."""
    result = WorkloadResult(
        name="overhead",
        title=f"1. Overhead: {config.calls:,} zero-latency read-only calls in one batch",
        params={
            "calls": config.calls,
            "repeat": config.repeat,
            "backends": list(config.backends),
            "dispatcher": {"max_concurrency": 16, "call_timeout": 60.0},
        },
    )
    n = config.calls
    for backend in config.backends:
        samples = anyio.run(_measure, config, backend, progress, backend=backend)
        per_call = {name: [s / n * 1e6 for s in values] for name, values in samples.items()}
        for name, values in per_call.items():
            median = Stat.of(values).median
            result.row(backend, name, "us/call", values, note=f"{1e6 / median:,.0f} calls/s")
        for reference in (TASKS_BARE, TASKS_ADAPTER, GATHER_BARE, GATHER_ADAPTER):
            if reference in per_call:
                result.comparisons.append(
                    Comparison.paired(
                        backend,
                        (DISPATCHER, per_call[DISPATCHER]),
                        (reference, per_call[reference]),
                        better="lower",
                    )
                )
        ratios = {c.denominator: c.ratio.median for c in result.comparisons if c.case == backend}
        result.targets.append(
            Target(
                name=f"{backend}: dispatcher / {TASKS_ADAPTER}",
                value=ratios[TASKS_ADAPTER],
                op="<=",
                threshold=1.0,
                detail="scheduling overhead: same per-call tool work on both sides",
            )
        )
        result.targets.append(
            Target(
                name=f"{backend}: dispatcher / {TASKS_BARE}",
                value=ratios[TASKS_BARE],
                op="<=",
                threshold=1.0,
                detail="includes the adapter's validation and result conversion, which the bare tasks skip",
            )
        )
        if GATHER_BARE in ratios:
            result.targets.append(
                Target(
                    name=f"{backend}: dispatcher / {GATHER_ADAPTER} (aim)",
                    value=ratios[GATHER_ADAPTER],
                    op="<=",
                    threshold=2.0,
                    detail="same per-call tool work",
                )
            )
            result.targets.append(
                Target(
                    name=f"{backend}: dispatcher / {GATHER_BARE} (aim)",
                    value=ratios[GATHER_BARE],
                    op="<=",
                    threshold=2.0,
                    detail="bare coroutines, no validation or conversion",
                )
            )
    return result
