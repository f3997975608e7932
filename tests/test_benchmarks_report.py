"""The benchmark report, built from a real run's results file: its first screen (every target, its figure
and spread, the reference figure, the verdict), the quick run's figures without verdicts, and the plots.

`tests/benchmark_runs/quick.json` is the results file of a real run, committed as it was written:
``python -m benchmarks --quick --only parallel,mixed,batches,scale,faults,keys``. Nothing here measures.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path

import pytest

from benchmarks._cli import main
from benchmarks._plots import PLOTS, faults_figure, mixed_figure, scale_figure
from benchmarks._report import REFERENCE, render_summary
from benchmarks._results import Run, Target, WorkloadResult
from benchmarks._summary import QUICK_NOTE, Summary, summarize

RUN_FILE = Path(__file__).resolve().parent / "benchmark_runs" / "quick.json"
VERDICT = re.compile(r"\b(met|MET|missing)\b")


@pytest.fixture(scope="module")
def quick() -> Run:
    return Run.load(RUN_FILE)


@pytest.fixture(scope="module")
def reference() -> Run:
    return Run.load(REFERENCE)


def judged(run: Run) -> Run:
    """The same figures, as a run that gives verdicts."""
    return dataclasses.replace(run, quick=False, verdicts=True)


def goal_met(target: Target) -> bool:
    """The oracle: the figure against the goal, written out."""
    return target.value <= target.threshold if target.op == "<=" else target.value >= target.threshold


def first_screen(summary: Summary) -> str:
    out = io.StringIO()
    render_summary(summary, out, files=["plots: here.png"])
    return out.getvalue()


def without(run: Run, workload: str, target: str) -> Run:
    """The run with one target of one workload left out."""
    workloads = [
        dataclasses.replace(w, targets=[t for t in w.targets if t.name != target]) if w.name == workload else w
        for w in run.workloads
    ]
    return dataclasses.replace(run, workloads=workloads)


def test_every_target_is_on_the_first_screen_beside_its_reference_figure(quick: Run, reference: Run) -> None:
    """Each target of a real run is one cell, judged met or not met by its goal, beside the reference
    figure that has its full-run name; the backends of a target share a line."""
    summary = summarize(judged(quick), reference)
    cells = [(line, cell) for line in summary.lines for cell in line.cells.values()]
    measured = sorted(cell.target.name for _, cell in cells if cell.target is not None)
    assert measured == sorted(target.name for workload in quick.workloads for target in workload.targets)
    published = {(w.name, t.name): t for w in reference.workloads for t in w.targets}
    for line, cell in cells:
        assert cell.target is not None, line
        assert cell.state == ("met" if goal_met(cell.target) else "not met"), cell.target
        assert cell.reference is published[(line.workload, cell.target.reference_key)]
    assert {cell.state for _, cell in cells} == {"met", "not met"}
    # The quick run's gate and scale sizes differ from the full run's: those targets are found by key.
    assert sum(cell.other_sizes for _, cell in cells) == 3 + 2 * 2
    assert summary.backends == ["asyncio", "trio"]
    by_label = {f"{line.workload}: {line.label}": line for line in summary.lines}
    assert set(by_label["batches: 5. batches/s: dispatcher / anyio task group per batch (same adapter)"].cells) == {
        "asyncio",
        "trio",
    }
    assert set(by_label["mixed: dispatcher makespan / ideal"].cells) == {"asyncio"}
    text = first_screen(summary)
    counts = f"targets: {summary.count('met')} met, {summary.count('not met')} not met."
    assert counts in text and "missing" not in text
    mixed = next(w for w in quick.workloads if w.name == "mixed").targets[0]
    assert mixed.spread is not None
    row = next(line for line in text.splitlines() if "mixed: dispatcher makespan / ideal" in line)
    verdict = "met" if goal_met(mixed) else "NOT MET"
    assert f"{mixed.value:.3f} ({mixed.spread.q1:.2f}-{mixed.spread.q3:.2f}) {verdict}" in row
    assert row.rstrip().endswith(f"{published[('mixed', mixed.name)].value:.3f}")


def test_the_verdicts_agree_with_those_the_reference_run_recorded(reference: Run) -> None:
    """Summarised, benchmarks/reference.json gets the verdicts its own run wrote into it, target by target."""
    recorded = json.loads(REFERENCE.read_text())["workloads"]
    summary = summarize(reference, reference)
    for line in summary.lines:
        for cell in line.cells.values():
            assert cell.target is not None and cell.reference is cell.target
            [written] = [t for t in recorded[line.workload]["targets"] if t["name"] == cell.target.name]
            assert (cell.state == "met") is written["met"], cell.target.name
    assert summary.count("not met") == 10 and summary.count("met") == 28


def test_a_figure_this_run_lacks_is_missing_and_one_the_reference_lacks_has_none(quick: Run, reference: Run) -> None:
    """A target the reference has and a full run's workload did not report is missing (not run, in the quick
    run); a target the reference lacks, a new workload's included, shows with no reference figure."""
    stall = "trio: 3. longest event-loop stall while 10,000 calls dispatch (ms)"
    summary = summarize(without(judged(quick), "scale", stall), reference)
    [line] = [line for line in summary.lines if "longest event-loop stall" in line.label]
    assert line.cells["trio"].state == "missing" and line.cells["trio"].target is None
    assert line.cells["trio"].reference is not None and line.cells["asyncio"].target is not None
    assert summary.count("missing") == 1
    text = first_screen(summary)
    assert ", 1 missing from this run." in text
    assert re.search(r"3\. longest event-loop stall while 10,000 calls dispatch \(ms\).*\bmissing\b", text)
    summary = summarize(without(quick, "scale", stall), reference)
    [line] = [line for line in summary.lines if "longest event-loop stall" in line.label]
    assert line.cells["trio"].state == "not in this run" and VERDICT.search(first_screen(summary)) is None

    new = WorkloadResult(
        name="limits",
        title="10. Adaptive limits",
        params={"backend": "trio"},
        targets=[
            Target(name="adaptive / best fixed limit", value=1.2, op="<=", threshold=1.1),
            Target(name="trio: [bold]one name twice", value=1.0, op=">=", threshold=1.0),
            Target(name="trio: [bold]one name twice", value=0.5, op=">=", threshold=1.0),
        ],
    )
    run = dataclasses.replace(judged(quick), workloads=[*quick.workloads, new])
    gate = "gate time per call at 100,000 / at 10,000 calls, 10 keys"
    summary = summarize(run, without(reference, "keys", gate))
    lines = {f"{line.workload}: {line.label}": line for line in summary.lines}
    added = lines["limits: adaptive / best fixed limit"]
    assert set(added.cells) == {"trio"} and added.cells["trio"].state == "not met"
    assert added.cells["trio"].reference is None
    assert lines["keys: gate time per call at 10,000 / at 1,000 calls, 10 keys"].cells["asyncio"].reference is None
    rows = {line.split("  ")[0].strip(): line for line in first_screen(summary).splitlines() if ": " in line}
    assert re.search(r"<= 1\.1 +1\.200 NOT MET +none$", rows["limits: adaptive / best fixed limit"].rstrip())
    # Two targets of one name each keep their line; their names are text, not rich markup.
    twice = [line for line in summary.lines if line.label == "[bold]one name twice"]
    assert [line.cells["trio"].state for line in twice] == ["met", "not met"]
    assert first_screen(summary).count("limits: [bold]one name twice") == 2


def test_the_quick_run_shows_figures_and_says_why_there_are_no_verdicts(quick: Run, reference: Run) -> None:
    """The quick run's first screen gives every figure with the reference beside it, no met, NOT MET or
    missing, and says in words why; a figure at other sizes than the reference's is marked."""
    summary = summarize(quick, reference)
    assert {cell.state for line in summary.lines for cell in line.cells.values()} == {"figure"}
    text = first_screen(summary)
    assert " ".join(QUICK_NOTE.split()) in " ".join(text.split())
    assert VERDICT.search(text) is None
    assert "targets: 14 figures, no verdicts (quick run)." in text
    assert "* measured at this run's smaller sizes; the reference figure is the full run's." in text
    gate = next(line for line in text.splitlines() if "gate time per call at 10,000 / at 1,000 calls, 1 keys" in line)
    assert re.search(r"\d\.\d{3}\*\s+1\.059$", gate.rstrip()), gate


def test_the_report_prints_its_first_screen_before_the_details(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`python -m benchmarks --show FILE --output DIR` prints the first screen (under 50 lines here), then
    every workload's tables in order; it draws every plot (none blank) and says where."""
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    main(["--show", str(RUN_FILE), "--output", str(tmp_path)])
    out = capsys.readouterr().out
    screen, _, details = out.partition("The details follow, workload by workload.")
    assert screen.startswith("─") and "Benchmark report" in screen.splitlines()[0]
    assert len(screen.splitlines()) < 50
    measured = {result.name for result in Run.load(RUN_FILE).workloads}
    paths = [tmp_path / name for name, workload, _ in PLOTS if workload in measured]
    assert len(paths) >= 4
    assert "plots: " + ", ".join(map(str, paths)) in " ".join(screen.split())
    for path in paths:
        pixels = imread(path)
        colours = {tuple(pixel) for pixel in pixels[::7, ::7, :3].reshape(-1, 3).round(2).tolist()}
        assert pixels.shape[0] > 300 and len(colours) > 20, path
    titles = [w.title for w in Run.load(RUN_FILE).workloads]
    positions = [details.index(title) for title in titles]
    assert positions == sorted(positions)
    assert [title.split(".")[0] for title in titles] == ["2", "3", "4", "5", "7", "8"]
    assert "every target is on the report's first screen" in out.splitlines()[-1]


def test_the_scale_plot_draws_one_line_per_variant_and_backend(quick: Run) -> None:
    """One panel per backend, each line that backend's points alone in order of batch size: no line joins
    asyncio and trio."""
    numpy = pytest.importorskip("numpy")
    pytest.importorskip("matplotlib")
    [scale] = [w for w in quick.workloads if w.name == "scale"]
    figure = scale_figure(scale)
    assert figure is not None
    points = scale.series["time_per_call"]
    assert [ax.get_title() for ax in figure.axes] == ["asyncio", "trio"]
    for ax in figure.axes:
        backend = ax.get_title()
        mine = sorted((p for p in points if p["backend"] == backend), key=lambda p: p["calls"])
        lines = ax.get_lines()
        assert len(lines) == 4
        for line, key in zip(
            lines, ("dispatcher_us", "dispatcher_no_gc_us", "reference_us", "reference_bare_us"), strict=True
        ):
            assert str(line.get_label()).endswith(f"({backend})")
            xs = numpy.asarray(line.get_xdata()).tolist()
            assert xs == [p["calls"] for p in mine] == sorted({p["calls"] for p in points})
            assert numpy.asarray(line.get_ydata()).tolist() == [p[key] for p in mine]


def test_the_headline_and_faults_plots_show_the_measured_figures(quick: Run) -> None:
    """The mixed-turns plot has a bar per strategy at its median and the ideal as a line; the faults plot a
    bar per fault rate and setting at its share of calls OK."""
    pytest.importorskip("matplotlib")
    from matplotlib.patches import Rectangle

    from benchmarks import faults, mixed

    numpy = pytest.importorskip("numpy")
    workloads = {w.name: w for w in quick.workloads}
    medians = {row.variant: row.stat.median for row in workloads["mixed"].rows}
    figure = mixed_figure(workloads["mixed"])
    assert figure is not None
    [ax] = figure.axes
    widths = [patch.get_width() for patch in ax.patches if isinstance(patch, Rectangle)]
    assert widths == [medians[v] for v in (mixed.SERIAL, mixed.BARRIERS, mixed.DISPATCHER, mixed.ALL_AT_ONCE)]
    [ideal] = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert numpy.asarray(ideal.get_xdata()).tolist() == [medians[mixed.IDEAL]] * 2
    assert [label.get_text() for label in ax.get_yticklabels()][2] == "dispatcher"

    figure = faults_figure(workloads["faults"])
    assert figure is not None
    ok = {(row.case, row.variant): row.stat.median for row in workloads["faults"].rows if row.unit == "% calls OK"}
    heights = [patch.get_height() for patch in figure.axes[0].patches if isinstance(patch, Rectangle)]
    expected = [ok[(rate, v)] for v in (faults.RETRY, faults.NO_RETRY) for rate in ("fault rate 10%", "fault rate 30%")]
    assert heights == expected


def test_a_target_of_a_run_on_one_backend_is_labelled_with_that_backend(quick: Run) -> None:
    """A workload run on trio only (params "backends": ["trio"]) has its unprefixed targets in a trio column."""
    target = Target(name="goodput >= 95% of the oracle's", value=0.97, op=">=", threshold=0.95)

    def run_on(params: dict[str, object]) -> Summary:
        workload = WorkloadResult(name="adaptive", title="adaptive", params=params, targets=[target])
        return summarize(dataclasses.replace(quick, workloads=[workload]), None)

    trio_only = run_on({"backends": ["trio"]})
    assert trio_only.backends == ["trio"] and set(trio_only.lines[0].cells) == {"trio"}
    header = next(line for line in first_screen(trio_only).splitlines() if "median (IQR)" in line)
    assert "trio: median (IQR)" in header and "asyncio" not in header, header
    assert run_on({"backend": "trio"}).backends == ["trio"]
    assert run_on({"backends": ["asyncio", "trio"]}).backends == ["asyncio"]  # a figure over both: the first
    assert run_on({}).backends == ["asyncio"]  # none named: anyio's default
