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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from dispatcher import Dispatcher

from ._measure import Stat, interleave
from ._results import Comparison, Target, WorkloadResult
from ._tools import ADAPTER_WORK, READ_ONLY, Adapter, dispatch_once, gather_per_call, lookup, task_per_call, zero_calls

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

# The targets of each backend: reference, threshold on dispatcher / reference, name suffix, detail.
_TARGETS = (
    (TASKS_ADAPTER, 1.0, "", "scheduling overhead: same per-call tool work on both sides"),
    (TASKS_BARE, 1.0, "", ADAPTER_WORK),
    (GATHER_ADAPTER, 2.0, " (aim)", "same per-call tool work"),
    (GATHER_BARE, 2.0, " (aim)", "bare coroutines, no validation or conversion"),
)


async def _measure(config: Config, backend: str, progress: Progress) -> dict[str, list[float]]:
    calls, arguments = zero_calls(config.calls)
    adapter = Adapter(lookup)
    async with Dispatcher() as dispatcher:
        dispatcher.add_function(lookup, annotations=READ_ONLY)

        variants: dict[str, Callable[[], Awaitable[float]]] = {
            DISPATCHER: dispatch_once(dispatcher, calls),
            TASKS_BARE: task_per_call(lookup, arguments),
            TASKS_ADAPTER: task_per_call(adapter, arguments),
        }
        if backend == "asyncio":
            variants[GATHER_BARE] = gather_per_call(lookup, arguments)
            variants[GATHER_ADAPTER] = gather_per_call(adapter, arguments)
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
        for reference, threshold, aim, detail in _TARGETS:
            if reference in ratios:
                result.targets.append(
                    Target(
                        name=f"{backend}: dispatcher / {reference}{aim}",
                        value=ratios[reference],
                        op="<=",
                        threshold=threshold,
                        detail=detail,
                    )
                )
    return result
