"""The recommendation: the smallest setting whose throughput is within a tolerance of the best.

A pure function of the measurements (`recommend`), with the sentence that explains the choice, and the
number formats that sentence and the tables share.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._measure import SettingResult

__all__ = ["TOLERANCE", "format_ms", "format_number", "recommend"]

TOLERANCE = 0.05
"""A setting is good enough when its throughput is within this share of the best."""


def recommend(settings: Sequence[SettingResult], *, tolerance: float = TOLERANCE) -> tuple[int | None, int | None, str]:
    """The smallest setting whose throughput is within `tolerance` of the best, and why.

    Throughput counts successful calls only, so a setting whose calls all failed is never chosen.

    Args:
        settings: The measurements, one per setting (any order).
        tolerance: The share of the best throughput a setting may give up.

    Returns:
        The recommended setting, the best one, and a sentence or two that explain the choice. Both
        settings are None when no setting got a single successful answer.
    """
    ordered = sorted(settings, key=lambda s: s.limit)
    measured = [s for s in ordered if s.calls > 0 and s.throughput > 0]
    if not measured:
        return (
            None,
            None,
            "no setting got a successful answer from the server, so there is nothing to recommend; see the errors",
        )
    best = max(measured, key=lambda s: s.throughput)
    chosen = next(s for s in measured if s.throughput >= (1 - tolerance) * best.throughput)
    top = measured[-1]
    if chosen is best:
        if chosen is top and len(measured) > 1:
            before = measured[-2]
            gain = best.throughput / before.throughput - 1 if before.throughput > 0 else math.inf
            return (
                chosen.limit,
                best.limit,
                f"{chosen.limit} gives the best throughput ({_rate(best)}), {_percent(gain)} more than "
                f"{before.limit}; it is the largest setting tried and throughput was still growing, so try a "
                "wider range.",
            )
        head = f"{chosen.limit} gives the best throughput ({_rate(best)})"
    else:
        share = chosen.throughput / best.throughput
        # 99.7% printed as "100% of the best" would read as a contradiction.
        amount = "the best throughput to within 1%" if share >= 0.995 else f"{share:.0%} of the best throughput"
        head = f"{chosen.limit} gives {amount} ({_rate(best)} at {best.limit})"
    if chosen is top:
        return chosen.limit, best.limit, head + "."
    gain = best.throughput / chosen.throughput - 1
    same = chosen.throughput >= 0.995 * best.throughput
    if top.run_p95 > 1.1 * chosen.run_p95:
        more = "without more throughput" if same else f"for at most {_percent(gain)} more throughput"
        return (
            chosen.limit,
            best.limit,
            f"{head}; beyond it, each call's p95 run time grows from {format_ms(chosen.run_p95)} to "
            f"{format_ms(top.run_p95)} (at {top.limit}) {more}.",
        )
    more = "no more throughput" if same else f"at most {_percent(gain)} more throughput"
    return chosen.limit, best.limit, f"{head}; larger settings give {more}."


def _rate(setting: SettingResult) -> str:
    return f"{format_number(setting.throughput)} calls/s"


def _percent(share: float) -> str:
    return "infinitely" if math.isinf(share) else f"{share:.0%}"


def format_ms(seconds: float) -> str:
    """Seconds as milliseconds, e.g. "50.0 ms"."""
    return f"{format_number(seconds * 1000)} ms"


def format_number(value: float) -> str:
    """A figure with three significant digits or so; "-" for NaN."""
    if math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
