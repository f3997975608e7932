"""The reference semantics of a batch, as pure functions: the oracle of the tests and of the benchmarks.

Ordered barriers (`plan`, `ideal_makespan`): a batch is cut into steps. A run of consecutive
concurrency-safe calls is one step whose calls may overlap; a mutating call is a step of its own. Steps
run one after another in request order. This is the conflict rule below with every call on the root key.

The conflict rule (`keyed_schedule`, `ideal_keyed_makespan`): every call has conflict keys and is a read
or exclusive; a call may start when every earlier call that has a conflicting key (one a segment-wise
prefix of the other), where either of the two is exclusive, has finished. Reads never wait for reads.
`keyed_schedule` gives the start and end of every call under that rule with zero scheduling overhead,
oldest ready call first when a limit holds calls back: the ideal the benchmarks measure against.

The executor (`dispatcher._core._gate.Gate`) produces the same order incrementally, also across batches that
arrive while others run; the tests check it against these functions and against a brute-force model.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dispatcher._core._gate import conflicts

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["KeyedCall", "Step", "ideal_keyed_makespan", "ideal_makespan", "keyed_schedule", "plan"]


@dataclass(frozen=True, slots=True)
class Step:
    """A set of calls that may run together, given by their indices in the batch."""

    indices: tuple[int, ...]
    exclusive: bool


def plan(exclusive: Sequence[bool]) -> list[Step]:
    """Cut a batch into ordered steps.

    Args:
        exclusive: For each call in request order, whether it must run alone (its tool may mutate).

    Returns:
        The steps in the order they run; every index appears in exactly one step.
    """
    steps: list[Step] = []
    run: list[int] = []
    for index, alone in enumerate(exclusive):
        if alone:
            if run:
                steps.append(Step(tuple(run), exclusive=False))
                run = []
            steps.append(Step((index,), exclusive=True))
        else:
            run.append(index)
    if run:
        steps.append(Step(tuple(run), exclusive=False))
    return steps


def ideal_makespan(exclusive: Sequence[bool], latency: float, limit: int | None = None) -> float:
    """The shortest possible time for a batch of equal-latency calls under ordered barriers.

    Args:
        exclusive: For each call, whether it must run alone.
        latency: The time each call takes.
        limit: At most this many calls in flight, or None for no limit.

    Returns:
        The makespan with zero scheduling overhead: each concurrent step of n calls takes
        ceil(n / limit) rounds, each exclusive step one round.
    """
    rounds = 0
    for step in plan(exclusive):
        n = len(step.indices)
        rounds += 1 if step.exclusive or limit is None else math.ceil(n / limit)
    return rounds * latency


@dataclass(frozen=True, slots=True)
class KeyedCall:
    """One call of a keyed batch: its keys, whether it is exclusive, and how long it takes."""

    keys: tuple[str, ...]
    exclusive: bool
    latency: float


def _conflict(a: KeyedCall, b: KeyedCall) -> bool:
    return (a.exclusive or b.exclusive) and conflicts(a.keys, b.keys)


def keyed_schedule(calls: Sequence[KeyedCall], limit: int | None = None) -> list[tuple[float, float]]:
    """When each call starts and ends under the conflict rule, with zero scheduling overhead.

    A call is ready once every earlier conflicting call has ended; whenever a slot is free, the oldest
    ready call starts. Quadratic in the batch size: a reference, not an executor.

    Returns:
        ``(start, end)`` for each call, in batch order.
    """
    n = len(calls)
    before = [[j for j in range(i) if _conflict(calls[i], calls[j])] for i in range(n)]
    times: list[tuple[float, float] | None] = [None] * n
    running: list[tuple[float, int]] = []  # (end, index)
    waiting = set(range(n))
    now = 0.0
    while waiting or running:
        ready = sorted(
            i
            for i in waiting
            if all(times[j] is not None and times[j][1] <= now for j in before[i])  # type: ignore[index]
        )
        for i in ready:
            if limit is not None and len(running) >= limit:
                break
            end = now + calls[i].latency
            times[i] = (now, end)
            heapq.heappush(running, (end, i))
            waiting.discard(i)
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] <= now:
            heapq.heappop(running)
    return [t if t is not None else (math.inf, math.inf) for t in times]


def ideal_keyed_makespan(calls: Sequence[KeyedCall], limit: int | None = None) -> float:
    """The time from the first start to the last end of a keyed batch under the conflict rule."""
    return max((end for _, end in keyed_schedule(calls, limit)), default=0.0)
