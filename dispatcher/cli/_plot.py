"""`tune --plot`: throughput and p50/p95 run time against the setting, drawn with matplotlib (the `plot` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from ..tuning._report import TuneReport

__all__ = ["save_plot"]


def save_plot(report: TuneReport, path: Path) -> None:
    """Draw throughput and p50/p95 run time against the setting into a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limits = [s.limit for s in report.settings]
    positions = list(range(len(limits)))
    fig, left = plt.subplots(figsize=(7, 4.5))
    throughputs = [s.throughput for s in report.settings]
    # The spread of the repeats as error bars: the lowest and highest measurement around the median.
    left.errorbar(
        positions,
        throughputs,
        yerr=_spread(throughputs, [s.throughput_range for s in report.settings]),
        fmt="o-",
        color="tab:blue",
        capsize=3,
        label="throughput (median, range)",
    )
    left.set_xticks(positions, [str(limit) for limit in limits])
    left.set_xlabel(report.knob)
    left.set_ylabel("throughput (calls/s)", color="tab:blue")
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(positions, [s.run_p50 * 1000 for s in report.settings], "s--", color="tab:orange", label="run p50")
    p95s = [s.run_p95 * 1000 for s in report.settings]
    ranges = [
        None if s.run_p95_range is None else (s.run_p95_range[0] * 1000, s.run_p95_range[1] * 1000)
        for s in report.settings
    ]
    right.errorbar(
        positions, p95s, yerr=_spread(p95s, ranges), fmt="^:", color="tab:red", capsize=3, label="run p95 (range)"
    )
    right.set_ylabel("run time per call (ms)", color="tab:red")
    right.set_ylim(bottom=0)
    if report.recommended is not None:
        left.axvline(limits.index(report.recommended), color="tab:green", alpha=0.5, label="recommended")
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    # On the twin axes, drawn last, so that no line crosses the legend.
    right.legend(handles=handles, loc="upper left")
    left.grid(True, alpha=0.3)
    title = f"{report.target}"[:80]
    if report.cut_short is not None:
        title += " (cut short)"
    left.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _spread(values: list[float], ranges: list[tuple[float, float] | None]) -> list[list[float]]:
    """Error bar lengths below and above each value, from its (low, high) range (none without one)."""
    below, above = [], []
    for value, bounds in zip(values, ranges, strict=True):
        low, high = bounds if bounds is not None else (value, value)
        below.append(max(0.0, value - low))
        above.append(max(0.0, high - value))
    return [below, above]
