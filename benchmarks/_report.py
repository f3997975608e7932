"""Showing and saving results: progress lines, the terminal tables (`rich`), JSON files and plots.

Results go to `benchmarks/results/` by default, which git ignores: running the suite never changes a
tracked file. `benchmarks/reference.json` is the committed copy of the run that docs/benchmarks.md quotes.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dispatcher.cli import machine_info

try:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - the bench extra installs rich
    raise ImportError("the benchmark suite prints its tables with rich: pip install -e '.[bench]'") from exc

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.status import Status

    from ._measure import Stat
    from ._results import Target, WorkloadResult

__all__ = ["NO_VERDICTS", "RESULTS_DIR", "Progress", "machine_info", "render", "save_plots", "write_results"]

# Where a run writes its JSON and plots unless told otherwise (`--output`); ignored by git.
RESULTS_DIR = Path(__file__).resolve().parent / "results"
NO_VERDICTS = "quick run: no verdicts, figures only"


class Progress:
    """Progress on stderr: rich's status line on a terminal, one line per step elsewhere (CI logs).

    Args:
        stream: Where to write (default: stderr).
        enabled: False silences it (the smoke test).
    """

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._tty = enabled and self._stream.isatty()
        self._console = Console(file=self._stream, highlight=False) if self._tty else None
        self._status: Status | None = None
        self._section = ""
        self._started = time.perf_counter()

    def section(self, title: str) -> None:
        """A workload starts."""
        self._section = title
        self._started = time.perf_counter()
        self._write(f"{title} ...", final=not self._tty)

    def update(self, text: str) -> None:
        """A step within the workload (shown live on a terminal only, to keep logs short)."""
        if self._tty:
            self._write(f"{self._section}: {text}", final=False)

    def done(self, summary: str = "") -> None:
        """The workload finished."""
        elapsed = time.perf_counter() - self._started
        tail = f" {summary}" if summary else ""
        self._write(f"{self._section}: done in {elapsed:.1f} s.{tail}", final=True)

    def note(self, text: str) -> None:
        """A message that stays (a skipped part, a missing optional package)."""
        self._write(text, final=True)

    def _write(self, text: str, *, final: bool) -> None:
        if not self._enabled:
            return
        if self._console is None:
            self._stream.write(text + "\n")
            self._stream.flush()
            return
        if final:
            if self._status is not None:
                self._status.stop()
                self._status = None
            self._console.print(escape(text))
        elif self._status is None:
            self._status = self._console.status(escape(text))
            self._status.start()
        else:
            self._status.update(escape(text))


# The table --------------------------------------------------------------------------------------------


def _number(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 10_000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _spread(stat: Stat) -> str:
    return f"{_number(stat.q1)}-{_number(stat.q3)}"


def _range(stat: Stat) -> str:
    return f"{_number(stat.min)}-{_number(stat.max)}"


def _verdict(target: Target, *, verdicts: bool) -> str:
    if not verdicts:
        return "figure only"
    return "met" if target.met else "NOT MET"


def _tables(result: WorkloadResult, *, verdicts: bool) -> list[tuple[str, list[str], list[list[str]]]]:
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    if result.rows:
        rows = [
            [row.case, row.variant, _number(row.stat.median), _spread(row.stat), _range(row.stat), row.unit, row.note]
            for row in result.rows
        ]
        tables.append(("", ["case", "variant", "median", "IQR", "min-max", "unit", ""], rows))
    if result.comparisons:
        rows = [
            [
                c.case,
                f"{c.numerator} / {c.denominator}",
                f"{_number(c.ratio.median)}x",
                _range(c.ratio),
                f"{c.better} is better",
            ]
            for c in result.comparisons
        ]
        tables.append(
            ("ratios (median and min-max over paired repetitions)", ["case", "ratio", "median", "min-max", ""], rows)
        )
    if result.targets:
        rows = [
            [t.name, f"{_number(t.value)} {t.op} {_number(t.threshold)}", _verdict(t, verdicts=verdicts), t.detail]
            for t in result.targets
        ]
        tables.append(("targets", ["target", "check", "", ""], rows))
    return tables


def render(results: Sequence[WorkloadResult], stream: TextIO | None = None, *, verdicts: bool = True) -> None:
    """Print every workload's tables with `rich` (colours and the terminal's width on a terminal, plain
    text 160 columns wide elsewhere, such as CI logs).

    Args:
        results: The workloads' results.
        stream: Where to print (default: stdout).
        verdicts: False prints the targets' figures without saying whether they are met (the quick run,
            whose few repetitions on a loaded machine cannot support a verdict).
    """
    stream = stream if stream is not None else sys.stdout
    console = Console(file=stream, width=None if stream.isatty() else 160)
    if not verdicts:
        console.print(NO_VERDICTS)
    for result in results:
        console.rule(f"[bold]{escape(result.title)}")
        for title, headers, rows in _tables(result, verdicts=verdicts):
            table = Table(*headers, title=title or None, title_justify="left", box=box.SIMPLE_HEAD)
            for row in rows:
                table.add_row(*(escape(cell) for cell in row))
            console.print(table)
        for note in result.notes:
            console.print(f"note: {escape(note)}")


# JSON -------------------------------------------------------------------------------------------------


def write_results(
    results: Sequence[WorkloadResult],
    *,
    command: str,
    quick: bool,
    elapsed: float,
    directory: Path = RESULTS_DIR,
) -> tuple[Path, Path]:
    """Write `<timestamp>.json` and `latest.json` into `directory`; returns both paths.

    A quick run records no verdicts: every target's `met` is null, and `verdicts` is false.
    """
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    workloads = {result.name: result.to_json() for result in results}
    if quick:
        for workload in workloads.values():
            for target in workload["targets"]:
                target["met"] = None
    document = {
        "created": now.isoformat(timespec="seconds"),
        "command": command,
        "quick": quick,
        "verdicts": not quick,
        "elapsed_seconds": round(elapsed, 1),
        "machine": machine_info(),
        "workloads": workloads,
    }
    text = json.dumps(document, indent=2, default=str) + "\n"
    stamped = directory / f"{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    latest = directory / "latest.json"
    stamped.write_text(text)
    latest.write_text(text)
    return stamped, latest


# Plots ------------------------------------------------------------------------------------------------


def save_plots(results: Sequence[WorkloadResult], directory: Path = RESULTS_DIR) -> list[Path] | str:
    """Draw the PNG plots; returns their paths, or why none were drawn (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[plot]'), so no plots were drawn"
    directory.mkdir(parents=True, exist_ok=True)
    by_name = {result.name: result for result in results}
    paths: list[Path] = []
    parallel = by_name.get("parallel")
    if parallel is not None and parallel.series.get("makespan"):
        points = parallel.series["makespan"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        labels = [str(point["limit"]) for point in points]
        positions = list(range(len(points)))
        for key, label, style in (
            ("ideal_ms", "ideal: ceil(64/limit) x latency", "k--"),
            ("reference_ms", "anyio tasks + CapacityLimiter", "s-"),
            ("dispatcher_ms", "dispatcher", "o-"),
        ):
            ax.plot(positions, [point[key] for point in points], style, label=label)
        ax.set_xticks(positions, labels)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("max_concurrency")
        ax.set_ylabel("makespan (ms, median)")
        ax.set_title(f"64 read-only calls of {parallel.params.get('latency_ms', '?')} ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        path = directory / "makespan_vs_concurrency.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    scale = by_name.get("scale")
    if scale is not None and scale.series.get("time_per_call"):
        points = scale.series["time_per_call"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        sizes = [point["calls"] for point in points]
        ax.plot(sizes, [point["dispatcher_us"] for point in points], "o-", label="dispatcher")
        ax.plot(sizes, [point["dispatcher_no_gc_us"] for point in points], "o:", label="dispatcher, gc disabled")
        ax.plot(sizes, [point["reference_us"] for point in points], "s-", label="anyio task per call (same adapter)")
        ax.plot(sizes, [point["reference_bare_us"] for point in points], "^-", label="anyio task per call (bare)")
        ax.set_xscale("log")
        ax.set_xlabel("calls in one batch")
        ax.set_ylabel("time per call (us, median)")
        ax.set_ylim(bottom=0)
        ax.set_title("Zero-latency read-only calls: time per call against batch size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        path = directory / "time_per_call_vs_batch_size.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    online = by_name.get("adaptive")
    if online is not None:
        names = [name for name in ("changing", "bursty", "bucket") if online.series.get(f"limit {name}")]
        if names:
            fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.6 * len(names)), sharex=False, squeeze=False)
            for ax, name in zip(axes[:, 0], names, strict=True):
                points = online.series[f"limit {name}"]
                steps = online.series[f"steps {name}"]
                ax.step([p["t"] for p in points], [p["limit"] for p in points], where="post", label="adaptive limit")
                ax.step(
                    [p["t"] for p in steps], [p["capacity"] for p in steps], "k--", where="post", label="true capacity"
                )
                ax.set_ylabel("calls in flight")
                ax.set_title(f"{name}: the limit over time against the server's capacity (virtual clock)")
                ax.grid(True, alpha=0.3)
                ax.legend(loc="upper left")
            axes[-1, 0].set_xlabel("seconds")
            path = directory / "adaptive_limit.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            paths.append(path)
    return paths
