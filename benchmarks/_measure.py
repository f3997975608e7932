"""Repetitions, interleaving and summary statistics.

Every workload measures its variants (the dispatcher and its references) in the same process, one
repetition of each in turn, rotating the order every repetition so that no variant always runs first
(after a garbage collection) or last (on a warm cache). A comparison is the median of the ratios of
paired repetitions (repetition i of one variant against repetition i of the other), so slow drift of
the machine cancels out; its spread is the min-max of those ratios.
"""

from __future__ import annotations

import gc
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from ._report import Progress

__all__ = ["Stat", "interleave", "paired_ratios"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stat:
    """The median and spread of repeated measurements."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        """Summarise samples (at least one)."""
        if not samples:
            raise ValueError("no samples to summarise")
        values = sorted(samples)
        if len(values) == 1:
            q1 = q3 = values[0]
        else:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return cls(
            median=statistics.median(values),
            q1=q1,
            q3=q3,
            min=values[0],
            max=values[-1],
            n=len(values),
        )

    def scaled(self, factor: float) -> Stat:
        """The same statistics in another unit (factor > 0)."""
        return Stat(
            median=self.median * factor,
            q1=self.q1 * factor,
            q3=self.q3 * factor,
            min=self.min * factor,
            max=self.max * factor,
            n=self.n,
        )

    def inverted(self, numerator: float = 1.0) -> Stat:
        """numerator / x of every statistic: turns times into rates (the quartiles swap)."""
        return Stat(
            median=numerator / self.median,
            q1=numerator / self.q3,
            q3=numerator / self.q1,
            min=numerator / self.max,
            max=numerator / self.min,
            n=self.n,
        )


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """The ratio of each repetition of one variant to the same repetition of another."""
    if len(numerators) != len(denominators):
        raise ValueError(f"cannot pair {len(numerators)} samples with {len(denominators)}")
    return [a / b if b > 0 else math.inf for a, b in zip(numerators, denominators, strict=True)]


async def interleave(
    variants: Mapping[str, Callable[[], Awaitable[float]]],
    repeat: int,
    progress: Progress,
    *,
    label: str,
    warmup: int = 1,
) -> dict[str, list[float]]:
    """Run each variant `repeat` times, one repetition of each in turn, and collect what they return.

    Args:
        variants: Name to a coroutine function that runs the variant once and returns its measurement
            (usually seconds of wall time it timed itself, so that setup stays out of the figure).
        repeat: Timed repetitions of each variant.
        progress: Where to report which repetition is running.
        label: What is being measured, for the progress line.
        warmup: Untimed runs of each variant first (imports, caches, lazily built validators).

    Returns:
        The measurements of each variant, in repetition order.
    """
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            await variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeat):
        progress.update(f"{label}: repetition {rep + 1}/{repeat}")
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            samples[name].append(await variants[name]())
    return samples
