"""One tiny iteration of every benchmark workload: they run and report well-formed, plausible results."""

from __future__ import annotations

import io
import json
import math
from typing import TYPE_CHECKING

import pytest

from benchmarks import batches, keys, mixed, overhead, parallel, scale, through_mcp
from benchmarks._cli import WORKLOADS, main
from benchmarks._report import Progress, render, save_plots, write_results

if TYPE_CHECKING:
    from pathlib import Path

    from benchmarks._results import WorkloadResult

QUIET = Progress(enabled=False)


def check_well_formed(result: WorkloadResult) -> None:
    assert result.name in WORKLOADS and result.title
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


def medians(result: WorkloadResult, case: str) -> dict[str, float]:
    return {row.variant: row.stat.median for row in result.rows if row.case == case}


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


def test_mixed_turns_order_the_strategies() -> None:
    """Mixed turns: all-at-once <= dispatcher, the dispatcher never beats the ideal, serial is slowest."""
    config = mixed.Config(batches=1, size=8, latency=0.005, repeat=1)
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
    """Keyed turns: never faster than the ideal keyed schedule, which beats barriers; the gate is timed per call."""
    config = keys.Config(turns=1, size=6, files=3, latency=0.005, repeat=1, gate_sizes=(100, 200), gate_keys=(1, 10))
    result = keys.run(config, QUIET)
    check_well_formed(result)
    found = medians(result, "2 turns")
    assert found[keys.IDEAL_KEYED] == pytest.approx(keys.ideal_keyed(config) * 1000)
    assert found[keys.IDEAL_KEYED] < found[keys.IDEAL_BARRIERS]
    assert found[keys.KEYED] >= found[keys.IDEAL_KEYED] * 0.9
    assert [point["calls"] for point in result.series["gate_us_per_call"]] == [100, 200, 100, 200]
    assert len(result.targets) == 3


def test_many_small_batches() -> None:
    """The batches workload reports batches per second for the dispatcher and both references."""
    result = batches.run(batches.Config(batches=20, repeat=1), QUIET)
    check_well_formed(result)
    assert {row.unit for row in result.rows} == {"batches/s"}
    assert len(result.comparisons) == 4
    assert [target.threshold for target in result.targets] == [1.0, 1.0]


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


def test_through_mcp_in_process() -> None:
    """Through an in-process MCPServer: the dispatcher and direct call_tool both run every call."""
    config = through_mcp.Config(transports=("in-process",), calls=10, batches=1, size=8, latency=0.005, repeat=1)
    result = through_mcp.run(config, QUIET)
    check_well_formed(result)
    found = medians(result, "in-process: mixed turns")
    assert found[through_mcp.DISPATCHER] >= found[through_mcp.IDEAL] * 0.9
    assert len(result.targets) == 3


def test_report_json_and_plots(tmp_path: Path) -> None:
    """Results render as a table and are written as JSON with machine info; plots are drawn or skipped."""
    results = [batches.run(batches.Config(batches=5, repeat=1), QUIET)]
    out = io.StringIO()
    render(results, out)
    assert "Many small batches" in out.getvalue()
    stamped, latest = write_results(results, command="test", quick=True, elapsed=1.0, directory=tmp_path)
    document = json.loads(latest.read_text())
    assert stamped.read_text() == latest.read_text()
    assert document["machine"]["cpu_count"] >= 1
    assert document["machine"]["packages"]["anyio"]
    assert document["workloads"]["batches"]["rows"]
    plots = save_plots(results, tmp_path)
    assert isinstance(plots, str | list)


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m benchmarks --only overhead --repeat 1 --no-save` prints the table."""
    main(["--only", "overhead", "--repeat", "1", "--no-save"])
    assert "us/call" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--only", "nonsense"])


def test_under_faults() -> None:
    """Under faults: retries bring every call to OK and cost extra attempts; without them some calls fail."""
    from benchmarks import faults

    config = faults.Config(rates=(0.5,), batches=1, size=8, latency=0.002, repeat=1)
    result = faults.run(config, QUIET)
    check_well_formed(result)
    rows = {(row.variant, row.unit): row.stat.median for row in result.rows if row.case == "fault rate 50%"}
    assert rows[(faults.RETRY, "attempts/call")] >= 1.0
    assert rows[(faults.NO_RETRY, "attempts/call")] == 1.0
    assert rows[(faults.RETRY, "% calls OK")] >= rows[(faults.NO_RETRY, "% calls OK")]
    assert rows[(faults.RETRY, "ms")] >= config.latency * 1000 * 0.9
