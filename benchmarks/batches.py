"""Workload 4, many small batches: 2,000 batches of 4 zero-latency read-only calls, one after the other.

This is the agent-loop pattern: the model asks for a few calls, waits for all of them, asks again. The
dispatcher (default settings, one instance for the whole run) dispatches each batch in turn; the
reference opens one anyio task group per batch with one task per call, bare or through the same
function-tool adapter (see `overhead`). Throughput is batches per second, on asyncio and trio. Target 5:
the dispatcher's throughput is at least that of the task group doing the same per-call work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from dispatcher import Dispatcher

from ._measure import Stat, interleave, paired_ratios
from ._results import Comparison, Target, WorkloadResult
from ._tools import READ_ONLY, Adapter, lookup, task_group_per_batch, zero_calls

if TYPE_CHECKING:
    from ._report import Progress

__all__ = ["FULL", "QUICK", "Config", "run"]

DISPATCHER = "dispatcher"
TASKS_BARE = "anyio task group per batch (bare)"
TASKS_ADAPTER = "anyio task group per batch (same adapter)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    batches: int = 2000
    size: int = 4
    repeat: int = 9
    backends: tuple[str, ...] = ("asyncio", "trio")


FULL = Config()
QUICK = Config(repeat=5)


async def _measure(config: Config, progress: Progress) -> dict[str, list[float]]:
    batches = [zero_calls(config.size, prefix=f"b{b}-") for b in range(config.batches)]
    adapter = Adapter(lookup)
    async with Dispatcher() as dispatcher:
        dispatcher.add_function(lookup, annotations=READ_ONLY)

        async def run_dispatcher() -> float:
            dispatch = dispatcher.dispatch
            start = time.perf_counter()
            for calls, _ in batches:
                await dispatch(calls)
            return time.perf_counter() - start

        return await interleave(
            {
                DISPATCHER: run_dispatcher,
                TASKS_BARE: task_group_per_batch(lookup, batches),
                TASKS_ADAPTER: task_group_per_batch(adapter, batches),
            },
            config.repeat,
            progress,
            label=f"{config.batches} batches of {config.size}",
        )


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Measure batches per second."""
    result = WorkloadResult(
        name="batches",
        title=f"4. Many small batches: {config.batches:,} batches of {config.size} zero-latency read-only calls",
        params={
            "batches": config.batches,
            "size": config.size,
            "repeat": config.repeat,
            "backends": list(config.backends),
        },
    )
    for case in config.backends:
        samples = anyio.run(_measure, config, progress, backend=case)
        rates = {name: [config.batches / s for s in values] for name, values in samples.items()}
        for name, values in rates.items():
            median = Stat.of(values).median
            result.row(case, name, "batches/s", values, note=f"{1e6 / median:.1f} us/batch")
        for reference in (TASKS_BARE, TASKS_ADAPTER):
            result.comparisons.append(
                Comparison.paired(case, (DISPATCHER, rates[DISPATCHER]), (reference, rates[reference]), better="higher")
            )
        ratio = Stat.of(paired_ratios(rates[DISPATCHER], rates[TASKS_ADAPTER]))
        result.targets.append(
            Target(
                name=f"{case}: 5. batches/s: dispatcher / {TASKS_ADAPTER}",
                value=ratio.median,
                op=">=",
                threshold=1.0,
                detail=f"same per-call tool work on both sides; {ratio.n} paired runs, "
                f"min-max {ratio.min:.2f}-{ratio.max:.2f}",
                spread=ratio,
            )
        )
    return result
