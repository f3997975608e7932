"""Workload 2, parallel reads: 64 read-only calls of 20 ms each, under several `max_concurrency` limits.

The ideal makespan with at most `limit` calls in flight is ceil(64 / limit) x 20 ms. The measured
reference is the usual hand-written way to cap concurrency: one anyio task per call, each holding a
`CapacityLimiter(limit)` token while it awaits the tool. The tool is a real `anyio.sleep`, so the
figures include the event loop's timer resolution, for the reference as much as for the dispatcher.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher import Dispatcher

from ._measure import Stat, interleave
from ._results import Comparison, Target, WorkloadResult
from ._tools import dispatch_once, latency_calls, register_latency_tools, sleep_read
from .reference import ideal_makespan

if TYPE_CHECKING:
    from ._report import Progress

__all__ = ["FULL", "QUICK", "Config", "run"]

DISPATCHER = "dispatcher"
LIMITER = "anyio tasks + CapacityLimiter"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    calls: int = 64
    latency: float = 0.020
    limits: tuple[int | None, ...] = (1, 2, 4, 8, 16, 32, 64, None)
    repeat: int = 5
    backend: str = "asyncio"


FULL = Config()
QUICK = Config(limits=(4, 16, 64), repeat=3)


async def _measure(config: Config, limit: int | None, progress: Progress) -> dict[str, list[float]]:
    exclusive = [False] * config.calls
    calls = latency_calls(exclusive, config.latency)
    arguments = [{"key": f"k{i}", "seconds": config.latency} for i in range(config.calls)]
    async with Dispatcher(max_concurrency=limit) as dispatcher:
        register_latency_tools(dispatcher)

        async def run_limiter() -> float:
            limiter = anyio.CapacityLimiter(limit if limit is not None else math.inf)
            results: list[Any] = [None] * len(arguments)

            async def one(i: int, args: dict[str, Any]) -> None:
                async with limiter:
                    results[i] = await sleep_read(**args)

            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i, args in enumerate(arguments):
                    tg.start_soon(one, i, args)
            return time.perf_counter() - start

        return await interleave(
            {DISPATCHER: dispatch_once(dispatcher, calls), LIMITER: run_limiter},
            config.repeat,
            progress,
            label=f"max_concurrency={limit}",
        )


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Measure makespans under each limit."""
    result = WorkloadResult(
        name="parallel",
        title=f"2. Parallel reads: {config.calls} read-only calls of {config.latency * 1000:g} ms",
        params={
            "calls": config.calls,
            "latency_ms": config.latency * 1000,
            "limits": [str(limit) for limit in config.limits],
            "repeat": config.repeat,
            "backend": config.backend,
        },
    )
    worst = 0.0
    for limit in config.limits:
        samples = anyio.run(_measure, config, limit, progress, backend=config.backend)
        ideal = ideal_makespan([False] * config.calls, config.latency, limit)
        case = f"max_concurrency={limit}"
        ms = {name: [s * 1000 for s in values] for name, values in samples.items()}
        stats = {}
        for name, values in ms.items():
            median = Stat.of(values).median
            stats[name] = result.row(case, name, "ms", values, note=f"{median / (ideal * 1000):.3f}x ideal")
        result.row(case, "ideal", "ms", [ideal * 1000], note="ceil(calls / limit) x latency")
        for name in (DISPATCHER, LIMITER):
            result.comparisons.append(
                Comparison.paired(case, (name, ms[name]), ("ideal", [ideal * 1000] * len(ms[name])), better="lower")
            )
        result.comparisons.append(
            Comparison.paired(case, (DISPATCHER, ms[DISPATCHER]), (LIMITER, ms[LIMITER]), better="lower")
        )
        worst = max(worst, stats[DISPATCHER].median / (ideal * 1000))
        result.series.setdefault("makespan", []).append(
            {
                "limit": "none" if limit is None else limit,
                "ideal_ms": ideal * 1000,
                "dispatcher_ms": stats[DISPATCHER].median,
                "reference_ms": stats[LIMITER].median,
            }
        )
    result.targets.append(
        Target(
            name="worst dispatcher makespan / ideal over the limits",
            value=worst,
            op="<=",
            threshold=1.10,
            detail="no target in the issue; 10% is this suite's sanity bound (timer resolution included)",
        )
    )
    return result
