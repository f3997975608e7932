"""The plots of a run, drawn with matplotlib (the `plot` extra, in the dev extras): one PNG per workload
that has a picture worth drawing.

- `mixed_turns.png`, the headline claim: the mixed agent turns (workload 3) under the dispatcher, serial
  calls, hand-written barriers and all at once (unsafe), against the ordered-barrier ideal;
- `time_per_call_vs_batch_size.png`: the scale workload, one panel per backend, one line per variant;
- `makespan_vs_concurrency.png`: parallel reads under each concurrency limit;
- `under_faults.png`: the share of calls that end OK and the makespan, with and without retries, at each
  fault rate.

Each `*_figure` function builds a `matplotlib.figure.Figure` from a `WorkloadResult` (None when the result
lacks what it needs, such as a run that stopped early), without pyplot, so nothing global changes; the
tests read the figures' lines and bars back.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ._results import Row, WorkloadResult

__all__ = ["PLOTS", "adaptive_figure", "faults_figure", "mixed_figure", "parallel_figure", "save_plots", "scale_figure"]

# Okabe-Ito colours: distinct for the common forms of colour blindness (as in dispatcher.timeline).
_BLUE, _ORANGE, _GREEN, _GREY, _SKY, _VERMILION = "#0072B2", "#E69F00", "#009E73", "#999999", "#56B4E9", "#D55E00"


def _new_figure(width: float, height: float, panels: int = 1, *, sharey: bool = False) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots(1, panels, sharey=sharey, squeeze=False)[0]
    return figure, list(axes)


def _rows(result: WorkloadResult, unit: str) -> dict[tuple[str, str], Row]:
    return {(row.case, row.variant): row for row in result.rows if row.unit == unit}


def _title(result: WorkloadResult) -> str:
    """The workload's title without its number."""
    number, dot, rest = result.title.partition(". ")
    return rest if dot and number.isdigit() else result.title


def mixed_figure(result: WorkloadResult) -> Figure | None:
    """The headline claim: the makespan of the mixed turns under each strategy, with its IQR."""
    from .mixed import ALL_AT_ONCE, BARRIERS, DISPATCHER, IDEAL, SERIAL

    rows = {row.variant: row for row in result.rows if row.unit == "ms"}
    if not {DISPATCHER, BARRIERS, SERIAL, ALL_AT_ONCE, IDEAL} <= set(rows):
        return None
    ideal = rows[IDEAL].stat.median
    # Top to bottom, slowest first; the dispatcher stands out, the unsafe floor is hatched.
    bars = [
        (SERIAL, "serial (one call at a time)", _GREY, ""),
        (BARRIERS, "hand-written barriers (anyio)", _SKY, ""),
        (DISPATCHER, "dispatcher", _BLUE, ""),
        (ALL_AT_ONCE, "all at once (unsafe: writes overlap)", _ORANGE, "//"),
    ]
    figure, (ax,) = _new_figure(7.5, 3.4)
    positions = list(range(len(bars)))[::-1]
    ideal_line = ax.axvline(ideal, color="black", linestyle="--", linewidth=1, zorder=1)
    for position, (variant, label, colour, hatch) in zip(positions, bars, strict=True):
        stat = rows[variant].stat
        ax.barh(
            position,
            stat.median,
            xerr=[[stat.median - stat.q1], [stat.q3 - stat.median]],
            color=colour,
            hatch=hatch,
            edgecolor="white" if not hatch else "#7F5500",
            label=label,
            capsize=3,
            zorder=2,
        )
        ax.text(
            max(stat.q3, stat.median) + ideal * 0.04,
            position,
            f"{stat.median:,.0f} ms, {stat.median / ideal:.2f}x ideal",
            va="center",
            fontsize=8,
            zorder=3,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
        )
    ax.set_yticks(positions, [label for _, label, _, _ in bars])
    ax.set_xlabel("makespan of the batch set (ms, median and IQR)")
    ax.set_xlim(0, max(rows[SERIAL].stat.max, ideal) * 1.4)
    speedup = rows[SERIAL].stat.median / rows[DISPATCHER].stat.median
    figure.suptitle(
        "\n".join(textwrap.wrap(_title(result), 100))
        + f"\ndispatcher: {speedup:.2f}x faster than serial, and no write overlaps another call",
        fontsize=9,
    )
    ax.legend(
        [ideal_line], [f"ideal (ordered barriers): {ideal:,.0f} ms"], loc="lower right", fontsize=8, frameon=False
    )
    ax.grid(True, axis="x", alpha=0.3)
    return figure


def scale_figure(result: WorkloadResult) -> Figure | None:
    """Time per call against batch size: one panel per backend, each variant one line within it."""
    points = result.series.get("time_per_call") or []
    backends: dict[str, list[dict[str, float]]] = {}
    for point in points:
        backends.setdefault(str(point.get("backend", "")), []).append(point)
    if not backends:
        return None
    figure, axes = _new_figure(4.2 * len(backends), 4.2, len(backends), sharey=True)
    lines = (
        ("dispatcher_us", "dispatcher", "o-", _BLUE),
        ("dispatcher_no_gc_us", "dispatcher, gc disabled", "o:", _BLUE),
        ("reference_us", "anyio task per call (same adapter)", "s-", _ORANGE),
        ("reference_bare_us", "anyio task per call (bare)", "^-", _GREEN),
    )
    for ax, (backend, series) in zip(axes, backends.items(), strict=True):
        series = sorted(series, key=lambda point: point["calls"])
        sizes = [point["calls"] for point in series]
        for key, label, style, colour in lines:
            if all(key in point for point in series):
                ax.plot(sizes, [point[key] for point in series], style, color=colour, label=f"{label} ({backend})")
        ax.set_xscale("log")
        ax.set_xlabel("calls in one batch")
        ax.set_title(backend or "?")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("time per call (us, median)")
    axes[0].set_ylim(bottom=0)
    figure.suptitle("Zero-latency read-only calls: time per call against batch size", fontsize=10)
    return figure


def parallel_figure(result: WorkloadResult) -> Figure | None:
    """Makespan of the parallel reads under each concurrency limit, against the ideal."""
    import matplotlib.ticker

    points = result.series.get("makespan") or []
    if not points:
        return None
    figure, (ax,) = _new_figure(7, 4.5)
    labels = [str(point["limit"]) for point in points]
    positions = list(range(len(points)))
    for key, label, style in (
        ("ideal_ms", f"ideal: ceil({result.params.get('calls', 'calls')}/limit) x latency", "k--"),
        ("reference_ms", "anyio tasks + CapacityLimiter", "s-"),
        ("dispatcher_ms", "dispatcher", "o-"),
    ):
        ax.plot(positions, [point[key] for point in points], style, label=label)
    ax.set_xticks(positions, labels)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("max_concurrency")
    ax.set_ylabel("makespan (ms, median)")
    ax.set_title(_title(result))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return figure


def faults_figure(result: WorkloadResult) -> Figure | None:
    """Under faults: calls that end OK and the makespan, with and without retries, at each fault rate."""
    from .faults import NO_RETRY, RETRY

    ok, ms, attempts = _rows(result, "% calls OK"), _rows(result, "ms"), _rows(result, "attempts/call")
    rates = [case for case, variant in ok if variant == RETRY and (case, NO_RETRY) in ok]
    if not rates or not all((rate, variant) in ms for rate in rates for variant in (RETRY, NO_RETRY)):
        return None
    figure, (left, right) = _new_figure(9, 3.8, 2)
    width = 0.38
    for offset, variant, label, colour in (
        (-0.5, RETRY, "default RetryPolicy", _BLUE),
        (0.5, NO_RETRY, "retry=None", _GREY),
    ):
        xs = [i + offset * width for i in range(len(rates))]
        bars = left.bar(xs, [ok[(rate, variant)].stat.median for rate in rates], width, color=colour, label=label)
        for bar, rate in zip(bars, rates, strict=True):
            extra = attempts.get((rate, variant))
            tried = f"\n{extra.stat.median:.2f} att." if extra is not None else ""
            left.annotate(
                f"{bar.get_height():.1f}%{tried}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        right.bar(
            xs,
            [ms[(rate, variant)].stat.median for rate in rates],
            width,
            yerr=[
                [ms[(rate, variant)].stat.median - ms[(rate, variant)].stat.q1 for rate in rates],
                [ms[(rate, variant)].stat.q3 - ms[(rate, variant)].stat.median for rate in rates],
            ],
            color=colour,
            label=label,
            capsize=3,
        )
    ideal = next((row.stat.median for row in result.rows if row.case == "fault-free" and row.unit == "ms"), None)
    if ideal is not None:
        right.axhline(ideal, color="black", linestyle="--", linewidth=1, label="fault-free ideal")
    low = min(ok[(rate, variant)].stat.median for rate in rates for variant in (RETRY, NO_RETRY))
    left.set_ylim(max(0.0, low - (100 - low) * 1.5 - 1), 101)
    for ax, ylabel in ((left, "calls that end OK (%, median)"), (right, "makespan (ms, median and IQR)")):
        ax.set_xticks(range(len(rates)), [rate.removeprefix("fault rate ") + " faults" for rate in rates])
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    left.legend(fontsize=8, loc="lower left")
    right.legend(fontsize=8)
    figure.suptitle("\n".join(textwrap.wrap(_title(result), 100)), fontsize=9)
    return figure


def adaptive_figure(result: WorkloadResult) -> Figure | None:
    """The online limit over time against the server's true capacity, one panel per scenario."""
    names = [name for name in ("changing", "bursty", "bucket") if result.series.get(f"limit {name}")]
    if not names:
        return None
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 2.6 * len(names)), layout="constrained")
    axes = list(figure.subplots(len(names), 1, squeeze=False)[:, 0])
    for ax, name in zip(axes, names, strict=True):
        points = result.series[f"limit {name}"]
        steps = result.series.get(f"steps {name}") or []
        ax.step([p["t"] for p in points], [p["limit"] for p in points], where="post", label="adaptive limit")
        if steps:
            ax.step([p["t"] for p in steps], [p["capacity"] for p in steps], "k--", where="post", label="capacity")
        ax.set_ylabel("calls in flight")
        ax.set_title(f"{name}: the limit against the server's capacity (virtual clock)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds")
    return figure


# File name, workload, drawing; in the order the run prints them.
PLOTS: tuple[tuple[str, str, Callable[[WorkloadResult], Figure | None]], ...] = (
    ("mixed_turns.png", "mixed", mixed_figure),
    ("makespan_vs_concurrency.png", "parallel", parallel_figure),
    ("time_per_call_vs_batch_size.png", "scale", scale_figure),
    ("under_faults.png", "faults", faults_figure),
    ("adaptive_limit.png", "adaptive", adaptive_figure),
)


def save_plots(results: Sequence[WorkloadResult], directory: Path, *, dpi: int = 110) -> list[Path] | str:
    """Draw the PNG plots of the workloads that have one; returns their paths, or why none were drawn."""
    try:
        import matplotlib  # noqa: F401  (the figures import it lazily; this says early that it is missing)
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[plot]'), so no plots were drawn"
    by_name = {result.name: result for result in results}
    paths: list[Path] = []
    for filename, name, draw in PLOTS:
        result = by_name.get(name)
        figure = draw(result) if result is not None else None
        if figure is None:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / filename
        figure.savefig(path, dpi=dpi)
        paths.append(path)
    return paths
