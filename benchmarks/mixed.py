"""Workload 3, mixed agent turns: seeded batches of 16 calls, about 70% read-only, writes interleaved.

Every call takes 20 ms (a real `anyio.sleep`). The ideal under ordered barriers is
(read groups + writes) x latency (`benchmarks.reference.ideal_makespan`, with the default limit of 16).
The references, all calling the same tool coroutines:

- hand-written barriers: the batch cut into steps by `benchmarks.reference.plan`, each read step one anyio
  task group, each write awaited alone (what a careful hand-written loop would do for one batch);
- serial: every call awaited in order (the safe, slow default of many agent loops);
- all at once: every call in one task group, ignoring the writes (unsafe: the floor no safe scheduler
  can beat, one latency per batch).

A repetition runs every batch of the set one after the other; the figures are the set's total.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher import Dispatcher

from ._measure import Stat, interleave
from ._results import Comparison, Target, WorkloadResult
from ._tools import latency_calls, mixed_batch, register_latency_tools, sleep_read, sleep_write
from .reference import ideal_makespan, plan

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence

    from ._report import Progress

__all__ = ["FULL", "QUICK", "Config", "run"]

DISPATCHER = "dispatcher"
BARRIERS = "hand-written barriers (anyio)"
SERIAL = "serial"
ALL_AT_ONCE = "all at once (unsafe)"
IDEAL = "ideal (ordered barriers)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    batches: int = 8
    size: int = 16
    read_fraction: float = 0.7
    latency: float = 0.020
    seed: int = 0
    repeat: int = 5
    backend: str = "asyncio"


FULL = Config()
QUICK = Config(batches=2, repeat=3)


def batches_of(config: Config) -> list[list[bool]]:
    """The seeded batches: for each, whether each call mutates."""
    return [mixed_batch(config.seed + i, config.size, config.read_fraction) for i in range(config.batches)]


async def run_barriers(exclusive: Sequence[bool], call: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    """Run one batch step by step under ordered barriers, with plain anyio."""
    for step in plan(exclusive):
        if step.exclusive:
            await call(step.indices[0])
        else:
            async with anyio.create_task_group() as tg:
                for i in step.indices:
                    tg.start_soon(call, i)


async def _measure(config: Config, progress: Progress) -> dict[str, list[float]]:
    sets = batches_of(config)
    latency = config.latency
    calls = [latency_calls(exclusive, latency, prefix=f"b{b}-") for b, exclusive in enumerate(sets)]

    async with Dispatcher() as dispatcher:
        register_latency_tools(dispatcher)

        async def run_dispatcher() -> float:
            start = time.perf_counter()
            for batch in calls:
                results = await dispatcher.dispatch(batch)
                assert all(r.ok for r in results)
            return time.perf_counter() - start

        def caller(exclusive: Sequence[bool], results: list[Any]) -> Callable[[int], Coroutine[Any, Any, None]]:
            async def call(i: int) -> None:
                tool = sleep_write if exclusive[i] else sleep_read
                results[i] = await tool(key=f"k{i}", seconds=latency)

            return call

        async def run_hand_barriers() -> float:
            start = time.perf_counter()
            for exclusive in sets:
                results: list[Any] = [None] * len(exclusive)
                await run_barriers(exclusive, caller(exclusive, results))
            return time.perf_counter() - start

        async def run_serial() -> float:
            start = time.perf_counter()
            for exclusive in sets:
                results: list[Any] = [None] * len(exclusive)
                call = caller(exclusive, results)
                for i in range(len(exclusive)):
                    await call(i)
            return time.perf_counter() - start

        async def run_all_at_once() -> float:
            start = time.perf_counter()
            for exclusive in sets:
                results: list[Any] = [None] * len(exclusive)
                call = caller(exclusive, results)
                async with anyio.create_task_group() as tg:
                    for i in range(len(exclusive)):
                        tg.start_soon(call, i)
            return time.perf_counter() - start

        return await interleave(
            {
                DISPATCHER: run_dispatcher,
                BARRIERS: run_hand_barriers,
                SERIAL: run_serial,
                ALL_AT_ONCE: run_all_at_once,
            },
            config.repeat,
            progress,
            label=f"{config.batches} batches",
        )


def ideal_total(config: Config, limit: int | None = 16) -> float:
    """The ideal makespan of the whole set of batches, in seconds."""
    return sum(ideal_makespan(exclusive, config.latency, limit) for exclusive in batches_of(config))


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Measure the makespan of the batch set under each strategy."""
    sets = batches_of(config)
    writes = sum(sum(exclusive) for exclusive in sets)
    total_calls = config.batches * config.size
    steps = sum(len(plan(exclusive)) for exclusive in sets)
    result = WorkloadResult(
        name="mixed",
        title=(
            f"3. Mixed agent turns: {config.batches} seeded batches of {config.size} calls "
            f"({total_calls - writes} reads, {writes} writes, {steps} steps), {config.latency * 1000:g} ms each"
        ),
        params={
            "batches": config.batches,
            "size": config.size,
            "read_fraction": config.read_fraction,
            "latency_ms": config.latency * 1000,
            "seed": config.seed,
            "repeat": config.repeat,
            "backend": config.backend,
            "writes": writes,
            "steps": steps,
        },
    )
    samples = anyio.run(_measure, config, progress, backend=config.backend)
    ideal_ms = ideal_total(config) * 1000
    ms = {name: [s * 1000 for s in values] for name, values in samples.items()}
    case = f"{config.batches} batches"
    for name, values in ms.items():
        median = Stat.of(values).median
        result.row(case, name, "ms", values, note=f"{median / ideal_ms:.3f}x ideal")
    result.row(case, IDEAL, "ms", [ideal_ms], note="(read groups + writes) x latency")
    ideal = [ideal_ms] * config.repeat
    result.comparisons.extend(
        [
            Comparison.paired(case, (DISPATCHER, ms[DISPATCHER]), (IDEAL, ideal), better="lower"),
            Comparison.paired(case, (BARRIERS, ms[BARRIERS]), (IDEAL, ideal), better="lower"),
            Comparison.paired(case, (DISPATCHER, ms[DISPATCHER]), (BARRIERS, ms[BARRIERS]), better="lower"),
            Comparison.paired(case, (SERIAL, ms[SERIAL]), (DISPATCHER, ms[DISPATCHER]), better="higher"),
            Comparison.paired(case, (DISPATCHER, ms[DISPATCHER]), (ALL_AT_ONCE, ms[ALL_AT_ONCE]), better="lower"),
        ]
    )
    over_ideal = Stat.of(ms[DISPATCHER]).scaled(1 / ideal_ms)
    result.targets.append(
        Target(
            name="dispatcher makespan / ideal",
            value=over_ideal.median,
            op="<=",
            threshold=1.03,
            detail="within 3% of the ordered-barrier ideal",
            spread=over_ideal,
        )
    )
    medians = {name: Stat.of(values).median for name, values in ms.items()}
    speedup = medians[SERIAL] / medians[DISPATCHER]
    result.notes.append(f"speedup over serial: {speedup:.2f}x (serial / dispatcher, medians)")
    result.headline = (
        f"dispatcher {speedup:.2f}x faster than serial calls, {over_ideal.median:.3f}x the ordered-barrier ideal "
        f"(hand-written barriers {medians[BARRIERS] / ideal_ms:.3f}x; all at once, unsafe, "
        f"{medians[ALL_AT_ONCE] / ideal_ms:.3f}x)"
    )
    return result
