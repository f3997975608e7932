"""The reference semantics of a batch ("ordered barriers"), as a pure function.

A batch is cut into steps. A run of consecutive concurrency-safe calls is one step whose calls may
overlap; a mutating call is a step of its own. Steps run one after another in request order. The
executor (`_gate.Gate`) produces the same order incrementally, also across batches that arrive while
others run; this module states the rule on its own so that it can be tested and used to compute the
ideal makespan of a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Step", "ideal_makespan", "plan"]


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
