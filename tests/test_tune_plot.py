"""`tune --plot`: the recommended setting's line can be seen wherever it falls, the smallest setting included."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from dispatcher.tuning import TuneReport, recommend

from .test_tune import setting

if TYPE_CHECKING:
    from matplotlib.figure import Figure

pytest.importorskip("matplotlib")


def report_of(*figures: tuple[int, float, float]) -> TuneReport:
    """A report of settings measured as (limit, calls/s, run time), with the recommendation the rule gives them."""
    settings = tuple(setting(limit, rate, p95) for limit, rate, p95 in figures)
    recommended, best, why = recommend(settings)
    return TuneReport(
        target="in-process MCPServer",
        trusted=True,
        knob="max_concurrency",
        workload="synthetic reads",
        concurrent_share=1.0,
        clients=max(limit for limit, _, _ in figures),
        calls=100,
        duration=None,
        settings=settings,
        recommended=recommended,
        best=best,
        explanation=why,
    )


def recommended_line(fig: Figure) -> tuple[float, float, float]:
    """Where the recommended line is drawn, as shares of the plot's width: from the left edge, from the right,
    and whether the legend covers it (1.0) or not (0.0)."""
    left = fig.axes[0]
    [line] = [line for line in left.get_lines() if str(line.get_label()).startswith("recommended")]
    x = float(line.get_xdata()[0])  # type: ignore[index, arg-type]  # matplotlib types xdata as ArrayLike
    low, high = left.get_xlim()
    fig.canvas.draw()
    pixel = left.transData.transform((x, 0))[0]
    plot = left.get_window_extent()
    covered = 0.0
    for axes in fig.axes:
        legend = axes.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent()
        if box.x0 <= pixel <= box.x1 and box.y1 > plot.y0 and box.y0 < plot.y1:
            covered = 1.0
    return (x - low) / (high - low), (high - x) / (high - low), covered


@pytest.mark.parametrize(
    "figures",
    [
        ((1, 100.0, 0.01), (2, 100.0, 0.02), (4, 100.0, 0.04)),  # flat: the smallest, 1
        ((1, 50.0, 0.02), (2, 100.0, 0.02), (4, 110.0, 0.04)),  # the knee inside the range, 2
        ((1, 20.0, 0.05), (2, 40.0, 0.05)),  # still growing: the largest, 2
        ((8, 100.0, 0.05),),  # one setting
    ],
)
def test_the_recommended_line_stands_clear_of_the_axes_and_the_legend(figures: tuple[tuple[int, float, float]]) -> None:
    """At the smallest setting the line was drawn at 4.5% of the width, against the left axis, under the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dispatcher.cli._plot import draw

    report = report_of(*figures)
    assert report.recommended is not None
    fig = draw(report)
    try:
        from_left, from_right, covered = recommended_line(fig)
    finally:
        plt.close(fig)
    assert from_left >= 0.15 and from_right >= 0.15, (from_left, from_right)
    assert covered == 0.0
