"""Showing and saving results: progress lines, the report (`rich`) and the JSON files.

The report is one screen first (`render_summary`: every target, its figure and spread, the reference
figure, met or not), then each workload's tables (`render`). Results go to `benchmarks/results/` by
default, which git ignores: running the suite never changes a tracked file. `benchmarks/reference.json`
is the committed copy of the run that docs/benchmarks.md quotes; the plots are drawn by `_plots`.
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

from ._plots import save_plots
from ._results import Run
from ._summary import NO_VERDICTS, QUICK_NOTE, cell_text, figure, heading, reference_text, summarize

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.status import Status

    from ._measure import Stat
    from ._results import Target, WorkloadResult
    from ._summary import Summary

__all__ = [
    "NO_VERDICTS",
    "REFERENCE",
    "RESULTS_DIR",
    "Progress",
    "machine_info",
    "new_run",
    "render",
    "render_summary",
    "save_plots",
    "summarize",
    "write_results",
]

# Where a run writes its JSON and plots unless told otherwise (`--output`); ignored by git.
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The published figures the report sets each target against.
REFERENCE = Path(__file__).resolve().parent / "reference.json"


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


def _console(stream: TextIO | None) -> Console:
    """Colours and the terminal's width on a terminal; plain text 160 columns wide elsewhere (CI logs)."""
    stream = stream if stream is not None else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 160, highlight=False)


# The first screen ---------------------------------------------------------------------------------------


def render_summary(
    summary: Summary,
    stream: TextIO | None = None,
    *,
    reference_path: str = "benchmarks/reference.json",
    files: Sequence[str] = (),
) -> None:
    """Print the report's first screen: the run, then one line per target with its figure on each backend
    (median and IQR), the reference figure and the verdict, then each workload's headline.

    Args:
        summary: What to show (`summarize`).
        stream: Where to print (default: stdout).
        reference_path: How to name the reference.
        files: Lines saying where the run's files were written, printed last.
    """
    console = _console(stream)
    run = summary.run
    console.rule("[bold]Benchmark report")
    console.print(f"run: {escape(heading(run))}")
    if summary.reference is not None:
        console.print(f"reference: {escape(reference_path)}, {escape(heading(summary.reference))}")
    else:
        console.print(f"reference: none ({escape(reference_path)} could not be read)")
    if not run.verdicts:
        console.print(escape(QUICK_NOTE))
    if summary.lines:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("target")
        table.add_column("goal", no_wrap=True)
        for backend in summary.backends:
            table.add_column(f"{backend}: median (IQR)" + ("" if not run.verdicts else ", verdict"), no_wrap=True)
        table.add_column("reference", no_wrap=True)
        for line in summary.lines:
            cells = []
            for backend in summary.backends:
                text, style = cell_text(line.cells.get(backend))
                cells.append(f"[{style}]{escape(text)}[/]" if style else escape(text))
            label = escape(f"{line.workload}: {line.label}")
            table.add_row(label, escape(line.goal), *cells, escape(reference_text(line, summary.backends)))
        console.print(table)
        if any(cell.other_sizes for line in summary.lines for cell in line.cells.values()):
            console.print("* measured at this run's smaller sizes; the reference figure is the full run's.")
    for name, headline in summary.headlines:
        console.print(f"{escape(name)}: {escape(headline)}")
    if run.verdicts:
        counts = f"{summary.count('met')} met, {summary.count('not met')} not met"
        if summary.count("missing"):
            counts += f", {summary.count('missing')} missing from this run"
        console.print(f"targets: {counts}.")
    else:
        console.print(f"targets: {summary.count('figure')} figures, no verdicts (quick run).")
    for written in files:
        console.print(escape(written))
    console.print("The details follow, workload by workload.")


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


def _verdict(target: Target) -> str:
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
        # The figure and the goal in columns of their own: "1.14" beside "<= 1.05" reads as a figure
        # and a goal, where "1.14 <= 1.05" would read as a failed check in the quick run.
        headers = ["target", "figure", "goal", *(["verdict"] if verdicts else []), ""]
        rows = [
            [
                t.name,
                figure(t.value),
                f"{t.op} {t.threshold:g}",
                *([_verdict(t)] if verdicts else []),
                t.detail,
            ]
            for t in result.targets
        ]
        tables.append(
            ("targets" if verdicts else "targets (figures only: no verdicts in the quick run)", headers, rows)
        )
    return tables


def render(results: Sequence[WorkloadResult], stream: TextIO | None = None, *, verdicts: bool = True) -> None:
    """Print every workload's tables with `rich` (colours and the terminal's width on a terminal, plain
    text 160 columns wide elsewhere, such as CI logs).

    Args:
        results: The workloads' results.
        stream: Where to print (default: stdout).
        verdicts: False prints the targets' figures without saying whether they are met (the quick run,
            whose few repetitions on a loaded machine cannot support a verdict; the first screen says so).
    """
    console = _console(stream)
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


def new_run(results: Sequence[WorkloadResult], *, command: str, quick: bool, elapsed: float) -> Run:
    """A run just measured: its results, how it ran and the machine it ran on."""
    return Run(
        workloads=list(results),
        command=command,
        quick=quick,
        verdicts=not quick,
        elapsed_seconds=elapsed,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        machine=machine_info(),
    )


def write_results(run: Run, directory: Path = RESULTS_DIR) -> tuple[Path, Path]:
    """Write `<timestamp>.json` and `latest.json` into `directory`; returns both paths.

    A quick run records no verdicts: every target's `met` is null, and `verdicts` is false.
    """
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(run.to_json(), indent=2, default=str) + "\n"
    created = datetime.datetime.fromisoformat(run.created) if run.created else datetime.datetime.now(datetime.UTC)
    stamped = directory / f"{created.strftime('%Y%m%dT%H%M%SZ')}.json"
    latest = directory / "latest.json"
    stamped.write_text(text)
    latest.write_text(text)
    return stamped, latest
