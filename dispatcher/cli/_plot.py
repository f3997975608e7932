"""`tune --plot`: throughput and p50/p95 run time against the setting, drawn with matplotlib (the `plot` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from matplotlib.figure import Figure

    from ..tuning._report import TuneReport

__all__ = ["draw", "save_plot"]


def save_plot(report: TuneReport, path: Path) -> None:
    """Draw throughput and p50/p95 run time against the setting into a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = draw(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw(report: TuneReport) -> Figure:
    """The figure `save_plot` writes: the settings evenly spaced, each with half a slot of room either side."""
    import matplotlib.pyplot as plt

    limits = [s.limit for s in report.settings]
    positions = list(range(len(limits)))
    fig, left = plt.subplots(figsize=(7, 5))
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
    # Half a slot either side of the first and last settings: a recommendation at the smallest setting drew its
    # line on the left axis, where it could not be told from the spine (or, with one setting, filled the plot).
    left.set_xlim(-0.5, len(limits) - 0.5)
    if report.recommended is not None:
        at = limits.index(report.recommended)
        left.axvspan(at - 0.25, at + 0.25, color="tab:green", alpha=0.12, zorder=0)
        left.axvline(
            at, color="tab:green", alpha=0.8, linewidth=2, zorder=0, label=f"recommended: {report.recommended}"
        )
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    # Below the plot, not over it: in the upper left it covered the recommended line at the smallest setting.
    right.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8)
    left.grid(True, alpha=0.3)
    title = f"{report.target}"[:80]
    if report.cut_short is not None:
        title += " (cut short)"
    left.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _spread(values: list[float], ranges: list[tuple[float, float] | None]) -> list[list[float]]:
    """Error bar lengths below and above each value, from its (low, high) range (none without one)."""
    below, above = [], []
    for value, bounds in zip(values, ranges, strict=True):
        low, high = bounds if bounds is not None else (value, value)
        below.append(max(0.0, value - low))
        above.append(max(0.0, high - value))
    return [below, above]
