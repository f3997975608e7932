"""One tiny iteration of every benchmark workload: they run and report well-formed, plausible results."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from benchmarks import batches, executors, keys, mixed, overhead, parallel, peers, scale, through_mcp
from benchmarks._cli import SKIPPED, WORKLOADS, chosen, main
from benchmarks._report import NO_VERDICTS, RESULTS_DIR, Progress, new_run, render, save_plots, write_results
from benchmarks._results import Run
from benchmarks._summary import QUICK_NOTE

if TYPE_CHECKING:
    from pathlib import Path

    from benchmarks._results import WorkloadResult

QUIET = Progress(enabled=False)


def check_well_formed(result: WorkloadResult) -> None:
    assert (result.name in WORKLOADS or result.name in SKIPPED) and result.title
    assert result.rows, "no measurements"
    for row in result.rows:
        stat = row.stat
        assert stat.n >= 1 and math.isfinite(stat.median) and stat.median > 0, row
        assert stat.min <= stat.q1 <= stat.median <= stat.q3 <= stat.max, row
    for comparison in result.comparisons:
        assert math.isfinite(comparison.ratio.median) and comparison.ratio.median > 0, comparison
    for target in result.targets:
        assert math.isfinite(target.value), target
    json.dumps(result.to_json())


def tiny(monkeypatch: pytest.MonkeyPatch, name: str, config: object) -> None:
    """Give the command line's workload `name` a small `config` for both its full and its quick run.

    The command-line tests check the command line (its options, its output, what it writes); the full and
    quick sizes are run by make bench and make bench-quick (which CI runs).
    """
    monkeypatch.setitem(WORKLOADS, name, dataclasses.replace(WORKLOADS[name], full=config, quick=config))


def medians(result: WorkloadResult, case: str) -> dict[str, float]:
    return {row.variant: row.stat.median for row in result.rows if row.case == case}


@pytest.mark.slow
def test_overhead() -> None:
    """The overhead workload times the dispatcher and every reference on both backends."""
    result = overhead.run(overhead.Config(calls=20, repeat=1), QUIET)
    check_well_formed(result)
    assert set(medians(result, "asyncio")) == {
        overhead.DISPATCHER,
        overhead.UNLIMITED,
        overhead.FLOOR,
        overhead.TASKS_BARE,
        overhead.TASKS_ADAPTER,
        overhead.GATHER_BARE,
        overhead.GATHER_ADAPTER,
    }
    assert set(medians(result, "trio")) == {
        overhead.DISPATCHER,
        overhead.UNLIMITED,
        overhead.FLOOR,
        overhead.TASKS_BARE,
        overhead.TASKS_ADAPTER,
    }
    assert [target.name.split(": ", 1)[1][:2] for target in result.targets] == ["1.", "2.", "2."] * 2


def test_parallel_reads_never_beat_the_ideal() -> None:
    """Parallel reads take at least (about) ceil(calls / limit) x latency, for the dispatcher and the reference."""
    config = parallel.Config(calls=8, latency=0.005, limits=(2, None), repeat=1)
    result = parallel.run(config, QUIET)
    check_well_formed(result)
    for limit, rounds in ((2, 4), (None, 1)):
        found = medians(result, f"max_concurrency={limit}")
        ideal_ms = rounds * 5.0
        assert found["ideal"] == pytest.approx(ideal_ms)
        assert found[parallel.DISPATCHER] >= ideal_ms * 0.9
        assert found[parallel.LIMITER] >= ideal_ms * 0.9
    assert [point["limit"] for point in result.series["makespan"]] == [2, "none"]


@pytest.mark.slow
def test_mixed_turns_order_the_strategies() -> None:
    """Mixed turns: all-at-once <= dispatcher, the dispatcher never beats the ideal, serial is slowest."""
    # Two wall-clock runs are compared: 50 ms calls keep the strategies about 150 ms apart, and the median
    # of three runs each, so that a loaded machine stalling one run does not reorder them.
    config = mixed.Config(batches=1, size=8, latency=0.05, repeat=3)
    result = mixed.run(config, QUIET)
    check_well_formed(result)
    found = medians(result, "1 batches")
    ideal = found[mixed.IDEAL]
    assert ideal == pytest.approx(mixed.ideal_total(config) * 1000)
    assert found[mixed.DISPATCHER] >= ideal * 0.9
    assert found[mixed.BARRIERS] >= ideal * 0.9
    assert found[mixed.SERIAL] >= found[mixed.DISPATCHER] * 0.9
    assert found[mixed.ALL_AT_ONCE] <= found[mixed.DISPATCHER] * 1.1


def test_keyed_turns_and_admission_cost() -> None:
    """Keyed turns: never faster than the ideal keyed schedule, which beats barriers; fail-fast runs no dependent
    and skips no independent call; the gate is timed per call."""
    config = keys.Config(turns=1, size=6, files=3, latency=0.005, repeat=1, gate_sizes=(100, 200), gate_keys=(1, 10))
    result = keys.run(config, QUIET)
    check_well_formed(result)
    found = medians(result, "2 turns")
    assert found[keys.IDEAL_KEYED] == pytest.approx(keys.ideal_keyed(config) * 1000)
    assert found[keys.IDEAL_KEYED] < found[keys.IDEAL_BARRIERS]
    assert found[keys.KEYED] >= found[keys.IDEAL_KEYED] * 0.9
    assert [point["calls"] for point in result.series["gate_us_per_call"]] == [100, 200, 100, 200]
    assert len(result.targets) == 6
    failing = medians(result, keys.FAIL_CASE)
    assert set(failing) == {keys.FAIL_FAST, keys.NO_FAIL_FAST, keys.IDEAL_INDEPENDENT}
    assert failing[keys.FAIL_FAST] >= failing[keys.IDEAL_INDEPENDENT] * 0.9
    counts = {target.name: target.value for target in result.targets if target.threshold == 0}
    assert counts == {
        "fail-fast: dependent calls run after the failed write": 0,
        "fail-fast: independent calls skipped": 0,
    }


def test_many_small_batches() -> None:
    """The batches workload reports batches per second for the dispatcher and both references."""
    result = batches.run(batches.Config(batches=20, repeat=1), QUIET)
    check_well_formed(result)
    assert {row.unit for row in result.rows} == {"batches/s"}
    assert len(result.comparisons) == 4
    assert [target.threshold for target in result.targets] == [1.0, 1.0]


@pytest.mark.slow
def test_scale_reports_time_and_memory_per_call() -> None:
    """The scale workload gives time per call for each size and a positive memory figure per call."""
    config = scale.Config(sizes=(10, 1000, 1500), repeat=1, min_calls_per_sample=10, backends=("asyncio",))
    result = scale.run(config, QUIET)
    check_well_formed(result)
    points = result.series["time_per_call"]
    assert [point["calls"] for point in points] == [10, 1000, 1500]
    for point in points:
        assert point["dispatcher_peak_bytes_per_call"] > 0
    assert [target.name for target in result.targets] == [
        "asyncio: 4. time per call at 1,500 / at 1,000",
        "asyncio: 4. objects per finished call the cyclic collector must free",
        "asyncio: 3. longest event-loop stall while 1,500 calls dispatch (ms)",
    ]
    # Found in the reference by the names they have in the full run.
    assert [target.reference_key for target in result.targets] == [
        "asyncio: 4. time per call at 100,000 / at 1,000",
        "asyncio: 4. objects per finished call the cyclic collector must free",
        "asyncio: 3. longest event-loop stall while 100,000 calls dispatch (ms)",
    ]


@pytest.mark.slow
def test_executors_compares_with_the_workers_and_with_another_run(tmp_path: Path) -> None:
    """The executors benchmark measures the dispatcher and the 16 workers on both backends, and renders a
    run beside another one (--json / --against)."""
    config = executors.Config(calls=20, reads_1ms=20, reads_5ms=5, repeat=1, big=200, big_repeat=1)
    run = executors.measure(config, QUIET)
    assert set(run["samples"]) == {"asyncio", "trio"}
    for cases in run["samples"].values():
        assert len(cases) == 7
        for samples in cases.values():
            assert set(samples) == {executors.DISPATCHER, executors.WORKERS}
    first = executors.render(run)
    assert first.count("\n") == 1 + 14
    out = tmp_path / "run.json"
    out.write_text(json.dumps(run))
    beside = executors.render(run, json.loads(out.read_text()))
    assert beside.count("| asyncio |") == 7 and "Other run:" in beside
    older = json.loads(out.read_text())  # a run from before the unlimited case
    for cases in older["samples"].values():
        del cases[next(case for case in cases if "no limit" in case)]
    assert executors.render(run, older).count("not measured") == 2


@pytest.mark.slow
def test_through_mcp_compares_at_the_same_concurrency() -> None:
    """In-process MCP: every target compares the dispatcher with direct calls at its own concurrency."""
    config = through_mcp.Config(
        transports=("in-process",), calls=10, wide=8, batches=1, size=8, latency=0.005, repeat=1
    )
    result = through_mcp.run(config, QUIET)
    check_well_formed(result)
    for backend in ("asyncio", "trio"):
        found = medians(result, f"{backend}, in-process: mixed turns")
        assert found[through_mcp.DISPATCHER] >= found[through_mcp.IDEAL] * 0.9
        # 8 reads of 5 ms take at least one round of 5 ms, whoever runs them.
        assert min(medians(result, f"{backend}, in-process: 8 reads of 5 ms").values()) >= 5 * 0.9
    pairs = {(c.numerator, c.denominator) for c in result.comparisons}
    assert (through_mcp.DISPATCHER, through_mcp.DIRECT_LIMITED) in pairs
    assert (through_mcp.DISPATCHER_UNLIMITED, through_mcp.DIRECT) in pairs
    # Three targets per backend, each the median of paired ratios with its spread.
    assert len(result.targets) == 6
    assert all(t.threshold == 1.05 and "min-max" in t.detail for t in result.targets)


@pytest.mark.slow
@pytest.mark.skipif(peers.missing() is not None, reason=f"the peers workload {peers.missing()}")
def test_peers() -> None:
    """The peers workload runs the same calls through every framework and reports each as a ratio to the dispatcher."""
    result = peers.run(peers.Config(calls=5, sleep_calls=4, sleep=0.002, repeat=1), QUIET)
    check_well_formed(result)
    assert set(medians(result, "asyncio: 5 calls, zero latency")) == {
        peers.DISPATCHER,
        peers.DISPATCHER_UNLIMITED,
        peers.TASKS,
        peers.GATHER,
        peers.LANGGRAPH,
        peers.PYDANTIC_AI,
        peers.OPENAI_AGENTS,
    }
    assert set(medians(result, "trio: 4 calls of 2 ms")) == {peers.DISPATCHER, peers.DISPATCHER_UNLIMITED, peers.TASKS}
    # 4 calls of 2 ms take at least one round of 2 ms, whoever runs them.
    assert min(medians(result, "asyncio: 4 calls of 2 ms").values()) >= 2 * 0.9
    assert {c.denominator for c in result.comparisons} == {peers.DISPATCHER, peers.DISPATCHER_UNLIMITED}


def test_peers_without_the_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the peers extra the workload names the missing packages and the extra that installs them."""
    monkeypatch.setattr(peers, "PACKAGES", {"no_such_module_for_the_benchmarks": "no-such-dist"})
    why = peers.missing()
    assert why is not None and "no-such-dist" in why and ".[peers]" in why
    with pytest.raises(RuntimeError, match=r"\.\[peers\]"):
        peers.run(peers.Config(calls=1, sleep_calls=1, repeat=1), QUIET)


@pytest.mark.subprocess
def test_report_json_and_plots(tmp_path: Path) -> None:
    """Results render as a table and are written as JSON with machine info, which reads back as the same run."""
    results = [batches.run(batches.Config(batches=5, repeat=1), QUIET)]
    out = io.StringIO()
    render(results, out)
    assert "Many small batches" in out.getvalue()
    run = new_run(results, command="test", quick=False, elapsed=1.0)
    stamped, latest = write_results(run, tmp_path)
    document = json.loads(latest.read_text())
    assert stamped.read_text() == latest.read_text()
    assert document["verdicts"] is True
    assert document["machine"]["cpu_count"] >= 1
    assert document["machine"]["packages"]["anyio"]
    assert document["workloads"]["batches"]["rows"]
    assert all(target["spread"]["n"] == 1 for target in document["workloads"]["batches"]["targets"])
    assert Run.load(latest) == run
    # The batches workload has no plot.
    assert save_plots(results, tmp_path) == []


@pytest.mark.subprocess
def test_quick_run_gives_no_verdicts(tmp_path: Path) -> None:
    """A quick run prints and saves the targets' figures but says neither met nor NOT MET."""
    results = [
        through_mcp.run(
            through_mcp.Config(
                transports=("in-process",),
                calls=4,
                wide=2,
                batches=1,
                size=4,
                latency=0.001,
                repeat=1,
                backends=("asyncio",),
            ),
            QUIET,
        )
    ]
    assert results[0].targets
    out = io.StringIO()
    render(results, out, verdicts=False)
    text = out.getvalue()
    assert "figures only: no verdicts in the quick run" in text
    assert "NOT MET" not in text and " met " not in text
    _, latest = write_results(new_run(results, command="test", quick=True, elapsed=1.0), tmp_path)
    document = json.loads(latest.read_text())
    assert document["verdicts"] is False
    assert all(target["met"] is None for target in document["workloads"]["mcp"]["targets"])


@pytest.mark.subprocess
def test_results_never_land_in_tracked_files() -> None:
    """The default results directory is ignored by git, so `make bench` leaves the checkout unchanged."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    root = RESULTS_DIR.parent.parent
    if subprocess.run([git, "rev-parse", "--git-dir"], cwd=root, capture_output=True, check=False).returncode:
        pytest.skip("not a git checkout")
    for name in ("latest.json", "20260101T000000Z.json", "makespan_vs_concurrency.png"):
        ignored = subprocess.run(
            [git, "check-ignore", "-q", str(RESULTS_DIR / name)], cwd=root, capture_output=True, check=False
        )
        assert ignored.returncode == 0, f"benchmarks/results/{name} would be tracked"
    tracked = subprocess.run(
        [git, "ls-files", "--", str(RESULTS_DIR)], cwd=root, capture_output=True, text=True, check=True
    )
    assert tracked.stdout == "", tracked.stdout


@pytest.mark.subprocess
def test_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m benchmarks --only overhead --repeat 1 --output DIR` prints the table and writes DIR only."""
    tiny(monkeypatch, "overhead", overhead.Config(calls=20))
    main(["--only", "overhead", "--repeat", "1", "--output", str(tmp_path / "out")])
    assert "us/call" in capsys.readouterr().out
    assert (tmp_path / "out" / "latest.json").is_file()
    with pytest.raises(SystemExit):
        main(["--only", "nonsense"])


@pytest.mark.subprocess
def test_quick_command_line_gives_no_verdicts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--quick` says on stderr and on the report's first screen that it gives no verdicts, and gives none."""
    tiny(monkeypatch, "batches", batches.Config(batches=20))
    main(["--quick", "--only", "batches", "--repeat", "1", "--no-save"])
    captured = capsys.readouterr()
    assert NO_VERDICTS in captured.err
    first_screen, _, details = captured.out.partition("The details follow")
    assert " ".join(QUICK_NOTE.split()) in " ".join(first_screen.split())
    assert "batches: 5. batches/s" in first_screen and details
    assert re.search(r"\b(met|MET|missing)\b", captured.out) is None


def test_the_quick_run_leaves_out_the_peers() -> None:
    """The peers run in the full suite when installed, never in the quick run unless named; naming them
    without the extra is an error that says how to install it."""
    assert "peers" not in chosen(None, quick=True)
    assert {"overhead", "mcp"} <= set(chosen(None, quick=True))
    if "peers" in WORKLOADS:
        assert "peers" in chosen(None, quick=False)
        assert chosen(["peers"], quick=True) == ["peers"]
    else:
        with pytest.raises(ValueError, match=r"\.\[peers\]"):
            chosen(["peers"], quick=False)
    with pytest.raises(ValueError, match="unknown workload"):
        chosen(["overhead,nonsense"], quick=False)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_rich_on_a_terminal_and_one_line_per_step_elsewhere() -> None:
    """On a terminal steps show in rich's status line and only finished lines stay; in a log, one line per step."""
    terminal = _Terminal()
    progress = Progress(terminal)
    progress.section("overhead")
    progress.update("step [1]")
    progress.done("fine")
    progress.note("skipped [bold]peers")
    shown = terminal.getvalue()
    assert "overhead: step [1]" in shown  # escaped: brackets are text, not rich markup
    assert re.search(r"overhead: done in [\d.]+ s\. fine\nskipped \[bold\]peers\n$", shown), shown
    log = io.StringIO()
    progress = Progress(log)
    progress.section("overhead")
    progress.update("step 1")
    progress.done("fine")
    assert re.fullmatch(r"overhead \.\.\.\noverhead: done in [\d.]+ s\. fine\n", log.getvalue())
