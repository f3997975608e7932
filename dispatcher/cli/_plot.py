"""`tune --plot`: throughput and p50/p95 run time against the setting, drawn with matplotlib (the `plot` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from ._sweep import TuneReport

__all__ = ["save_plot"]


def save_plot(report: TuneReport, path: Path) -> None:
    """Draw throughput and p50/p95 run time against the setting into a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limits = [s.limit for s in report.settings]
    positions = list(range(len(limits)))
    fig, left = plt.subplots(figsize=(7, 4.5))
    left.plot(positions, [s.throughput for s in report.settings], "o-", color="tab:blue", label="throughput")
    left.set_xticks(positions, [str(limit) for limit in limits])
    left.set_xlabel(report.knob)
    left.set_ylabel("throughput (calls/s)", color="tab:blue")
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(positions, [s.run_p50 * 1000 for s in report.settings], "s--", color="tab:orange", label="run p50")
    right.plot(positions, [s.run_p95 * 1000 for s in report.settings], "^:", color="tab:red", label="run p95")
    right.set_ylabel("run time per call (ms)", color="tab:red")
    right.set_ylim(bottom=0)
    if report.recommended is not None:
        left.axvline(limits.index(report.recommended), color="tab:green", alpha=0.5, label="recommended")
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    # On the twin axes, drawn last, so that no line crosses the legend.
    right.legend(handles=handles, loc="upper left")
    left.grid(True, alpha=0.3)
    left.set_title(f"{report.target}"[:80], fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
