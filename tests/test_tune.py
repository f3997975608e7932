"""`dispatcher tune`: the sweep finds a server's saturation knee, in-process and through the CLI over stdio."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from trio.testing import MockClock

import dispatcher
from dispatcher import ConfigurationError, Dispatcher, ToolCall
from dispatcher.cli import main
from dispatcher.cli._tune_command import doubling
from dispatcher.examples import Workspace
from dispatcher.tuning import (
    DEFAULT_SETTINGS,
    SettingResult,
    TuneProgress,
    TuneReport,
    load_workload,
    recommend,
    render_table,
    synthetic_workload,
    tune,
)
from dispatcher.tuning._measure import combine
from tests import forkserver

if TYPE_CHECKING:
    from collections.abc import Iterator

# The folder holding the `dispatcher` package, so subprocesses import this checkout.
SOURCE_ROOT = str(pathlib.Path(dispatcher.__file__).resolve().parents[1])
PYTHONPATH = os.pathsep.join(p for p in (SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)


def workspace_command() -> str:
    """The example workspace over stdio as a command line, forked from tests/forkserver.py's zygote."""
    return forkserver.command(["-m", "dispatcher.examples.workspace"])


def setting(limit: int, throughput: float, p95: float = 0.05, *, calls: int = 100) -> SettingResult:
    """A measurement with the figures `recommend` reads."""
    return SettingResult(
        limit=limit,
        calls=calls,
        errors=0,
        elapsed=calls / throughput if throughput else 0.0,
        throughput=throughput,
        run_p50=p95,
        run_p95=p95,
        queue_p50=0.0,
        queue_p95=0.0,
        in_flight=throughput * p95,
    )


def by_limit(report: TuneReport) -> dict[int, SettingResult]:
    """The report's measurements by setting."""
    return {s.limit: s for s in report.settings}


# The recommendation ------------------------------------------------------------------------------


def test_recommends_the_knee_of_throughput_and_run_time() -> None:
    """The smallest setting within 5% of the best throughput per run time wins, and the sentence says why."""
    settings = [setting(1, 20), setting(4, 80), setting(8, 153, 0.05), setting(16, 158, 0.1), setting(32, 160, 0.2)]
    recommended, best, why = recommend(list(reversed(settings)))
    assert (recommended, best) == (8, 32)
    assert why == (
        "8 gives 96% of the best throughput (160 calls/s at 32); beyond it, each call's p95 run time grows "
        "from 50.0 ms to 200 ms (at 32) for at most 5% more throughput."
    )
    # Throughput creeping up past the knee (round trips hidden by more calls) does not move it.
    creeping = [setting(4, 76, 0.05), setting(8, 140, 0.055), setting(16, 152, 0.1), setting(32, 159, 0.2)]
    assert recommend(creeping)[0] == 8
    # The old rule (smallest within 5% of the best throughput) would say 16 here: 2x above the knee.
    assert next(s.limit for s in creeping if s.throughput >= 0.95 * 159) == 16


def test_explanations_for_the_edges_of_the_range() -> None:
    """A best setting at the top asks for a wider range only while throughput still grows; flat says so."""
    _, _, growing = recommend([setting(1, 20), setting(2, 40)])
    assert growing.startswith("2 gives the best throughput (40.0 calls/s), 100% more than 1; it is the largest")
    assert "try a wider range" in growing
    _, _, stopped = recommend([setting(1, 20), setting(2, 40)], planned_top=8)
    assert stopped.endswith("the sweep stopped before the larger settings were measured.")
    assert "wider" not in stopped
    # Cut short with the last setting measured only in part, no better than the one before: the sentence
    # speaks of the settings measured, never of "larger settings" the sweep did not reach.
    part = replace(setting(4, 40.1, calls=4), partial=True)
    assert recommend([setting(1, 20), setting(2, 40), part], planned_top=8)[2] == (
        "2 gives the best throughput to within 1% (40.1 calls/s at 4); the settings above it (up to 4, measured "
        "only in part) give no more throughput, and the sweep stopped before the larger settings were measured."
    )
    slower = replace(setting(4, 40.1, 0.1, calls=4), partial=True)
    assert recommend([setting(1, 20), setting(2, 40), slower], planned_top=8)[2].endswith(
        "without more throughput; the sweep stopped before the larger settings were measured."
    )
    assert recommend([setting(1, 20), setting(2, 40), setting(4, 40.1)])[2].endswith(
        "larger settings give no more throughput."
    )
    assert recommend([setting(8, 0, calls=0)])[:2] == (None, None)
    # A sweep cut short after one setting says it compared nothing, not that 1 gives the best throughput.
    assert recommend([setting(1, 20)], planned_top=64) == (
        1,
        1,
        "only 1 was measured (20.0 calls/s), so there is no knee to find: the sweep stopped before the other "
        "settings; give it more time.",
    )
    assert recommend([setting(8, 20)])[2].endswith("measure more than one setting to compare them.")
    # A knee well below the best throughput says what the best would cost per call, and lets the user choose.
    soft = [setting(1, 100, 0.004), setting(4, 300, 0.02), setting(16, 460, 0.034)]
    assert recommend(soft) == (
        1,
        16,
        "1 is the knee: the most throughput per unit of run time (100 calls/s at a median run time of 4.00 ms); "
        "16 gives 360% more (460 calls/s) with each call taking 8.5x as long (34.0 ms): set it instead if "
        "throughput matters more to you than each call's latency.",
    )


def test_flat_throughput_with_growing_latency_says_no_setting_matters() -> None:
    """Flat throughput and growing run time (a server that serializes): the smallest, never a wider range."""
    flat = [setting(limit, 20.0 + limit / 64, 0.05 * limit) for limit in (1, 2, 4, 8, 16)]
    recommended, best, why = recommend(flat)
    assert (recommended, best) == (1, 16)
    assert why.startswith("no setting matters here: throughput stays at 20.0 to 20.2 calls/s from 1 to 16")
    assert "grows from 50.0 ms to 800 ms" in why
    assert "wider" not in why
    # Within the spread of the repeats counts as flat too, even when the medians differ by more than 10%.
    noisy = [
        replace(setting(1, 20), throughput_range=(15, 26)),
        replace(setting(4, 25, 0.2), throughput_range=(24, 30)),
    ]
    assert recommend(noisy)[2].startswith("no setting matters here")
    same = [setting(1, 20), setting(2, 20.5)]
    assert "and each call's p95 run time stays near 50.0 ms;" in recommend(same)[2]


def test_one_fast_repeat_does_not_make_a_growing_curve_flat() -> None:
    """A repeat that ran on an idle machine widens the smallest's range; fourfold throughput is still no flat."""
    # mcp-server-time on the loaded 2-core box: 77 to 249 calls/s at 1, median 84; 325 at 16.
    growing = [
        replace(setting(1, 84, 0.011), throughput_range=(77, 249)),
        replace(setting(2, 144, 0.013), throughput_range=(122, 316)),
        replace(setting(4, 205, 0.019), throughput_range=(98, 304)),
        replace(setting(16, 325, 0.047), throughput_range=(250, 400)),
    ]
    recommended, best, why = recommend(growing)
    assert not why.startswith("no setting matters"), why
    assert (recommended, best) == (2, 16), why
    # When one of the smallest's repeats did reach the best's median, the difference is noise: flat.
    reached = [replace(growing[0], throughput_range=(77, 330)), *growing[1:]]
    assert recommend(reached)[2].startswith("no setting matters here")


def test_combine_takes_medians_and_ranges() -> None:
    """Repeats combine into medians (one disturbed repeat moves nothing), summed counts and the range."""
    runs = [setting(4, 80), replace(setting(4, 20, 0.5), cut_off=2), setting(4, 82)]
    combined = combine(runs)
    assert (combined.throughput, combined.run_p95, combined.repeats) == (80, 0.05, 3)
    assert (combined.calls, combined.cut_off, combined.throughput_range) == (300, 2, (20, 82))
    assert combined.spread == pytest.approx(31 / 80)
    assert combined.to_json()["throughput_range"] == [20, 82]
    with pytest.raises(ValueError, match="one setting"):
        combine([setting(1, 1), setting(2, 1)])


# Workloads ---------------------------------------------------------------------------------------


def test_load_workload_reads_jsonl() -> None:
    """One call a line; ids are optional and replaced, blank lines skipped."""
    calls = load_workload(['{"name": "search_notes", "arguments": {"query": "a"}, "id": "x"}', "", '{"name": "b"}'])
    assert calls == [ToolCall("0", "search_notes", {"query": "a"}), ToolCall("1", "b", {})]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{"], "w.jsonl, line 1: not JSON"),
        (["", "[1]"], "w.jsonl, line 2: expected a JSON object"),
        (['{"arguments": {}}'], '"name" must be a tool name'),
        (['{"name": "a", "arguments": [1]}'], '"arguments" must be a JSON object'),
        (['{"name": "a", "input": {}}'], "unknown keys ['input']"),
        ([""], "w.jsonl has no calls"),
    ],
)
def test_load_workload_rejects_bad_lines(lines: list[str], message: str) -> None:
    """A bad line is reported with its number."""
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        load_workload(lines, source="w.jsonl")


@pytest.mark.anyio
async def test_synthetic_workloads_only_call_safe_tools() -> None:
    """reads calls read-only closed-world tools; mixed adds additive writes, never destroying or open-world ones."""
    async with Dispatcher() as d:
        entries = await d.connect("notes", Workspace().server)
    reads = synthetic_workload(entries, "reads")
    assert {call.name for call in reads} == {"search_notes", "read_note"}
    assert reads[0].arguments == {"query": "tune-0"}
    mixed = synthetic_workload(entries, "mixed", seed=1)
    assert {call.name for call in mixed} == {"search_notes", "read_note", "create_note", "append_note"}
    writes = sum(call.name in ("create_note", "append_note") for call in mixed)
    assert 15 <= writes <= 45
    assert mixed == synthetic_workload(entries, "mixed", seed=1)


def test_generated_arguments_follow_the_schema() -> None:
    """Required properties get values of their type, enum, format, bounds and $ref; optional ones are left out."""
    from dispatcher.tuning._workloads import _arguments

    schema = {
        "type": "object",
        "$defs": {"Mode": {"enum": ["fast", "slow"]}},
        "properties": {
            "url": {"type": "string", "format": "uri"},
            "n": {"type": "integer", "minimum": 3, "maximum": 5},
            "ratio": {"type": "number"},
            "flag": {"type": "boolean"},
            "mode": {"$ref": "#/$defs/Mode"},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 8}, "minItems": 1},
            "nested": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
            "optional": {"type": "string"},
        },
        "required": ["url", "n", "ratio", "flag", "mode", "tags", "nested", "maybe"],
    }
    assert _arguments(schema, 1) == {
        "url": "https://example.com/",
        "n": 4,
        "ratio": 1.0,
        "flag": False,
        "mode": "slow",
        "tags": ["tune-1xx"],
        "nested": {"k": "tune-1"},
        "maybe": 1,
    }


def test_generated_arguments_and_slow_values_read_references_alike() -> None:
    """One pointer lookup for both walks over a schema (it was written twice): an escaped name (``~1`` for a
    slash) resolves for the arguments as for the slow values inside a referenced object."""
    from dispatcher.tuning._workloads import _arguments, _walk

    schema = {
        "type": "object",
        "$defs": {"a/b": {"enum": ["x", "y"]}, "Spec": {"properties": {"pause": {"type": "number", "default": 3.0}}}},
        "properties": {"mode": {"$ref": "#/$defs/a~1b"}, "spec": {"$ref": "#/$defs/Spec"}},
        "required": ["mode", "spec"],
    }
    assert _arguments(schema, 1)["mode"] == "y"
    found: dict[str, tuple[Any, Any]] = {}
    _walk(schema, schema, "", found, depth=0)
    assert found == {"spec.pause": (3.0, 0)}


def test_doubling() -> None:
    """--from/--to double from the start and always end at the stop."""
    assert doubling(1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert doubling(3, 20) == [3, 6, 12, 20]
    assert doubling(4, 4) == [4]
    with pytest.raises(ConfigurationError, match="--from must be >= 1"):
        doubling(8, 4)


# The sweep in-process ----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
@pytest.mark.slow
async def test_recommendation_lands_at_the_saturation_knee() -> None:
    """A server that saturates at 8 in flight: throughput stops at 8 / latency, and 8 is recommended."""
    workspace = Workspace(latency=0.05, saturation=8)
    report = await tune(workspace.server, "reads", trusted=True, calls=100)
    assert report.recommended == 8
    assert report.how_to_apply == "Dispatcher(max_concurrency=8)"
    measured = by_limit(report)
    assert list(measured) == [1, 2, 4, 8, 16, 32, 64]
    for limit, result in measured.items():
        assert result.throughput == pytest.approx(min(limit, 8) / 0.05, rel=0.02)
        assert result.run_p95 == pytest.approx(0.05 * max(1, limit / 8), rel=0.02)
        assert result.in_flight == pytest.approx(limit, rel=0.02)
        assert result.calls >= 100 and result.errors == 0  # a burst of completions ending the window counts whole
    # 64 callers: below the knee they wait in the dispatcher's queue, past it at the server.
    assert measured[8].queue_p50 == pytest.approx((64 - 8) / 160, rel=0.02)
    assert measured[64].queue_p95 < 0.001
    assert re.match(r"8 gives the best throughput to within 1% \(16\d calls/s at \d+\)", report.explanation)
    assert "p95 run time grows from 50.0 ms to 400 ms (at 64) without more throughput" in report.explanation
    assert report.workload == "synthetic reads (search_notes)"  # read_note's generated call found no note
    assert workspace.max_in_flight == 64


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_online_reports_where_the_adaptive_limit_settles_beside_the_sweep() -> None:
    """online=True runs AdaptiveLimit on the same workload: against a knee of 8 it settles within 20% of the
    sweep's recommendation, with its trace, and the plain-text report prints it next to the recommendation."""
    workspace = Workspace(latency=0.05, saturation=8)
    report = await tune(workspace.server, "reads", [1, 2, 4, 8, 16, 32], trusted=True, calls=100, online=True)
    assert report.recommended == 8
    online = report.online
    assert online is not None and online.setting.ceiling == 32
    assert abs(online.settled - 8) <= 0.2 * 8 and online.low >= 4 and online.high <= 16
    assert online.trace[0] == (0.0, 4) and online.changes == len(online.trace) - 1 > 0
    assert online.measured.throughput == pytest.approx(8 / 0.05, rel=0.1)
    assert online.measured.run_p95 <= 1.5 * 0.05
    assert report.to_json()["online"]["settled"] == online.settled
    online_line = r"online limit \(max_concurrency=AdaptiveLimit\(ceiling=32\)\): settled at \d"
    assert re.search(online_line, render_table(report))
    plain = await tune(workspace.server, "reads", [1, 8], trusted=True, calls=20)
    assert plain.online is None and plain.to_json()["online"] is None


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_per_server_limit_and_time_budget() -> None:
    """--per-server sweeps add_mcp_server's limit; a duration bounds each setting's measurement."""
    workspace = Workspace(latency=0.05, saturation=8)
    report = await tune(workspace.server, "reads", (4, 8, 16), trusted=True, per_server=True, calls=None, duration=1.0)
    assert (report.knob, report.recommended) == ("per_server", 8)
    assert report.how_to_apply == "add_mcp_server(..., max_concurrency=8)"
    for result in report.settings:
        assert result.elapsed == pytest.approx(3 * 1.0)  # three repeats of a 1 s window
        assert result.throughput == pytest.approx(min(result.limit, 8) / 0.05, rel=0.01)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_an_untrusted_server_makes_every_setting_alike() -> None:
    """Untrusted, every call runs alone: every setting measures the same, and a note says why."""
    report = await tune(Workspace(latency=0.05).server, "reads", (1, 4), calls=20)
    assert [round(s.throughput) for s in report.settings] == [20, 20]
    assert any("no limit can matter here: the server is untrusted" in note for note in report.notes)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_no_recommendation_when_no_limit_can_matter() -> None:
    """When every call runs alone, differences between settings are noise: nothing is recommended from them."""
    server = MCPServer("warming")
    answered = 0

    async def lookup(key: str) -> str:
        """A server that gets faster as it warms up, so later settings measure more calls per second."""
        nonlocal answered
        answered += 1
        await anyio.sleep(0.1 / (1 + answered / 10))
        return key

    server.add_tool(lookup, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    report = await tune(server, "reads", (1, 2, 4), calls=20)
    throughputs = [s.throughput for s in report.settings]
    assert throughputs == sorted(throughputs) and throughputs[-1] > 1.5 * throughputs[0]
    assert (report.recommended, report.best, report.how_to_apply) == (None, None, "no recommendation")
    assert report.explanation.startswith("no limit can matter here, so there is nothing to recommend")
    assert "<- recommended" not in render_table(report)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_workload_of_calls_with_failures() -> None:
    """A workload's calls repeat in order; calls that fail count as errors, not as throughput."""
    workload = load_workload(['{"name": "search_notes", "arguments": {"query": "a"}}', '{"name": "search_notes"}'])
    progress: list[TuneProgress] = []
    report = await tune(
        Workspace(latency=0.05).server,
        workload,
        (2,),
        trusted=True,
        calls=10,
        warmup=0,
        progress=progress.append,
        repeats=1,
    )
    [result] = report.settings
    assert result.errors == 5
    assert result.throughput == pytest.approx(2 / 0.05)  # the failures take no slot time
    assert result.error == "failed: invalid arguments: missing required 'query'"
    note, warning = report.notes
    assert re.fullmatch(r"at 2, 5 of 1\d measured calls did not succeed \(failed: invalid .* required 'query'\)", note)
    assert warning.startswith("failed calls count as errors, not throughput, and no setting is chosen from them")
    assert warning.endswith("check the workload's calls")
    assert progress[-1] == TuneProgress(2, 0, 1, 10, 10)
    assert report.workload == "2 calls of search_notes"


@pytest.mark.anyio
async def test_a_sweep_in_real_time_with_an_entered_client() -> None:
    """On asyncio and trio in real time, through a client the caller owns and keeps using afterwards.

    Only what does not depend on speed is asserted: every setting measured every call, and the
    recommendation is one of them. Where the knee lands in real time depends on how loaded the machine
    is (a busy CPU saturates before the server does); the virtual clock tests above pin it exactly.
    """
    workspace = Workspace(latency=0.1, saturation=8)
    async with Client(workspace.server) as client:
        report = await tune(client, "reads", (4, 8, 16), trusted=True, calls=16, repeats=1)
        # At least the 16 measured calls of each setting; on a loaded machine a few more end in the loop
        # turn that closes the window, and they count too (they ended inside it).
        assert [(s.limit, s.errors) for s in report.settings] == [(4, 0), (8, 0), (16, 0)]
        assert all(16 <= s.calls <= 32 for s in report.settings), [s.calls for s in report.settings]
        assert report.recommended in (4, 8, 16), render_table(report)
        assert report.target == "an entered mcp.Client"
        assert not (await client.call_tool("search_notes", {"query": "x"})).is_error


@pytest.mark.anyio
async def test_mistakes_are_configuration_errors() -> None:
    """Bad settings fail before connecting; tools the server lacks fail before measuring."""
    server = Workspace().server
    with pytest.raises(ConfigurationError, match="every setting must be an int >= 1, got \\[0\\]"):
        await tune(server, "reads", (0, 2))
    with pytest.raises(ConfigurationError, match="the synthetic workload is 'reads' or 'mixed', got 'writes'"):
        await tune(server, "writes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="give calls, duration or both"):
        await tune(server, "reads", calls=None)
    with pytest.raises(ConfigurationError, match="does not offer: \\['nope'\\]"):
        await tune(server, [ToolCall("1", "nope")], (1,), calls=1)


def test_table_rendering() -> None:
    """The table has a row per setting in ms, the recommendation marked, then what to set and why."""
    settings = (setting(1, 20.0), setting(8, 160.0), setting(16, 160.0, 0.1))
    recommended, best, why = recommend(settings)
    report = TuneReport(
        target="cmd",
        trusted=True,
        knob="max_concurrency",
        workload="synthetic reads (search_notes)",
        concurrent_share=1.0,
        clients=16,
        calls=100,
        duration=None,
        settings=settings,
        recommended=recommended,
        best=best,
        explanation=why,
        notes=("a note",),
    )
    lines = render_table(report).splitlines()
    assert lines[0] == "tuning max_concurrency against cmd (trusted)"
    assert lines[3].split() == [
        "max_concurrency",
        "calls/s",
        "spread",
        "of",
        "best",
        "in",
        "flight",
        "run",
        "p50",
        "run",
        "p95",
        "queue",
        "p50",
        "queue",
        "p95",
        "cut",
        "off",
        "errors",
    ]
    assert lines[5].split() == [
        "8",
        "160",
        "-",
        "100%",
        "8.00",
        "50.0",
        "50.0",
        "0.00",
        "0.00",
        "0",
        "0",
        "<-",
        "recommended",
    ]
    assert "recommended: Dispatcher(max_concurrency=8)" in lines
    assert lines[-1] == "note: a note"
    assert report.to_json()["settings"][1]["run_p95_ms"] == 50.0


# The command line --------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_cli_over_stdio_reports_the_sweep(tmp_path: pathlib.Path) -> None:
    """`python -m dispatcher tune --stdio ...`: every setting measured, and the table, JSON and plot agree.

    Real time over stdio on a loaded machine is noisy, so nothing here depends on speed: which setting
    wins depends on how busy the machine is (stdio round trips and a busy CPU move the knee, and a stall
    during one setting can make it lose to a smaller one). The virtual clock tests pin the knee exactly.
    """
    server = f"{workspace_command()} --latency 0.05 --saturation 8"
    out, plot = tmp_path / "tune.json", tmp_path / "tune.png"
    argv = ["--stdio", server, "--trusted", "--synthetic", "reads", "--range", "2,4,8,16,32", "--calls", "24"]
    argv += ["--repeats", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher", "tune", *argv, "--json", str(out), "--plot", str(plot)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["recommended"] in (2, 4, 8, 16, 32), done.stdout
    assert [(s["limit"], s["calls"], s["errors"]) for s in report["settings"]] == [
        (limit, 24, 0) for limit in (2, 4, 8, 16, 32)
    ], done.stdout
    assert all(s["throughput"] > 0 for s in report["settings"]), done.stdout
    assert report["machine"]["cpu_count"] == os.cpu_count()
    assert f"recommended: Dispatcher(max_concurrency={report['recommended']})" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.endswith("<- recommended"))
    assert row.split()[0] == str(report["recommended"])
    assert "probing: calling each tool of the synthetic workload once" in done.stderr
    assert "setting 5/5 (32): warming up" in done.stderr and "setting 5/5 (32): measuring" in done.stderr
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "--plot needs matplotlib" in done.stderr
    else:
        assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.subprocess
def test_cli_workload_file_per_server(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A JSONL workload against a stdio server, sweeping the per-server limit, with its JSON report."""
    workload, out = tmp_path / "calls.jsonl", tmp_path / "out" / "tune.json"
    workload.write_text(
        '{"name": "search_notes", "arguments": {"query": "a"}}\n{"name": "fetch_url", '
        '"arguments": {"url": "https://example.com/"}}\n'
    )
    status = main(
        [
            "tune",
            "--stdio",
            workspace_command(),
            "--env",
            f"PYTHONPATH={PYTHONPATH}",
            "--trusted",
            "--workload",
            str(workload),
            "--from",
            "1",
            "--to",
            "2",
            "--calls",
            "10",
            "--repeats",
            "1",
            "--per-server",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "tuning the per-server limit against" in captured.out
    report = json.loads(out.read_text())
    assert (report["knob"], report["workload"]) == ("per_server", "2 calls of search_notes, fetch_url")
    assert report["options"]["env"] == ["PYTHONPATH"]  # names only: values may be secrets
    assert [s["calls"] for s in report["settings"]] == [10, 10]


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--range", "1,2", "--from", "1"], 2, "give either --range or --from/--to, not both"),
        (["--range", "1,x"], 2, "--range takes integers separated by commas"),
        (["--range", "0,2"], 2, "every setting must be an int >= 1"),
        (["--from", "8", "--to", "2"], 2, "--from must be >= 1 and --to >= --from"),
        (["--repeats", "0"], 2, "repeats must be an int from 1 to 20"),
        (["--timeout", "2"], 1, "could not connect to http://127.0.0.1:9/mcp"),
    ],
)
def test_cli_failures(argv: list[str], status: int, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Usage mistakes exit 2, an unreachable server exits 1, each with one line on stderr."""
    assert main(["tune", "--url", "http://127.0.0.1:9/mcp", "--synthetic", "reads", "--quiet", *argv]) == status
    assert message in capsys.readouterr().err


def test_cli_bad_workload_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing or malformed workload file is a usage error."""
    missing = tmp_path / "missing.jsonl"
    assert main(["tune", "--url", "http://127.0.0.1:9/mcp", "--workload", str(missing)]) == 2
    assert "cannot read the workload" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert main(["tune", "--url", "http://127.0.0.1:9/mcp", "--workload", str(bad)]) == 2
    assert f'{bad}, line 1: "name" must be a tool name' in capsys.readouterr().err


def test_cli_without_matplotlib(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plot without matplotlib says how to install it, up front, and the sweep goes on without the plot."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    argv = ["tune", "--url", "http://127.0.0.1:9/mcp", "--synthetic", "reads", "--timeout", "2"]
    assert main([*argv, "--plot", str(tmp_path / "p.png")]) == 1
    err = capsys.readouterr().err
    assert "--plot needs matplotlib (pip install 'mcp-dispatcher[plot]')" in err.splitlines()[0]


def test_cli_needs_a_server_and_a_workload(capsys: pytest.CaptureFixture[str]) -> None:
    """tune needs one of --stdio/--url and one of --workload/--synthetic."""
    with pytest.raises(SystemExit) as caught:
        main(["tune", "--synthetic", "reads"])
    assert caught.value.code == 2
    assert "one of the arguments --stdio --url is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune", "--url", "u"])
    assert "one of the arguments --workload --synthetic is required" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--max-time", "--duration", "--call-timeout"])
def test_cli_time_options_take_positive_seconds(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A time option of 0 or text is a usage error that says to leave the option out, not to pass None."""
    for value in ("0", "soon"):
        with pytest.raises(SystemExit) as caught:
            main(["tune", "--url", "http://127.0.0.1:9/mcp", "--synthetic", "reads", option, value])
        assert caught.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {option}: takes " in err
        assert "None" not in err
        assert ("leave it out for no limit" if value == "0" else "a number of seconds, got 'soon'") in err


def test_the_guide_example_runs(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python example of docs/tuning.md runs and recommends the knee it describes.

    It runs as written, but on trio's virtual clock: in real time a loaded machine moves the knee.
    """
    guide = pathlib.Path(SOURCE_ROOT) / "docs" / "tuning.md"
    [block] = [b for b in re.findall(r"```python\n(.*?)```", guide.read_text(), re.S) if "# Fragment:" not in b]
    virtual = {"clock": MockClock(autojump_threshold=0)}
    monkeypatch.setattr(anyio, "run", functools.partial(anyio.run, backend="trio", backend_options=virtual))
    exec(compile(block, "docs/tuning.md", "exec"), {"__name__": "__main__"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "4 Dispatcher(max_concurrency=4)"
    assert lines[1] == "tuning max_concurrency against in-process MCPServer (trusted)"


# The first hour: what a new user runs into ---------------------------------------------------------


def time_server() -> MCPServer:
    """A server like mcp-server-time: read-only tools whose generated arguments ("tune-0") are no time zone."""
    server = MCPServer("time")
    closed = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

    def get_current_time(timezone: str) -> str:
        raise ToolError(f"Invalid timezone: {timezone}")

    def convert_time(source_timezone: str, time: str, target_timezone: str) -> str:
        raise ToolError(f"Invalid timezone: {source_timezone}")

    server.add_tool(get_current_time, annotations=closed)
    server.add_tool(convert_time, annotations=closed)
    return server


@pytest.mark.anyio
async def test_a_synthetic_workload_whose_calls_all_fail_is_not_measured() -> None:
    """Generated calls that all fail measure nothing: no sweep, no recommendation, a pointer to --workload."""
    with pytest.raises(ConfigurationError) as caught:
        await tune(time_server(), "reads", (1, 2), trusted=True, calls=10)
    message = str(caught.value)
    assert message.startswith("every generated read of the synthetic workload failed (")
    assert "get_current_time: Error executing tool get_current_time: Invalid timezone: tune-" in message
    assert "convert_time: " in message
    assert message.endswith("write the calls your agent makes to a --workload file")


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_calls_that_fail_are_errors_not_throughput() -> None:
    """Tool errors count in the errors column, not as throughput; all-failing settings recommend nothing."""
    failing = load_workload(['{"name": "read_note", "arguments": {"name": "missing"}}'])
    report = await tune(Workspace(latency=0.05).server, failing, (1, 2), trusted=True, calls=10, warmup=0)
    assert [(s.calls, s.throughput) for s in report.settings] == [(0, 0.0), (0, 0.0)]
    assert all(s.errors >= 10 for s in report.settings)
    assert report.recommended is None and report.how_to_apply == "no recommendation"
    assert report.explanation.startswith(
        "every measured call failed at 1 and 2 (read_note: tool_error: Error executing"
    )
    text = render_table(report)
    assert "warning: " in text and "measured calls failed; they are counted as errors, not throughput" in text
    assert "tool_error: Error executing tool read_note: there is no note named 'missing'" in text
    half = load_workload(['{"name": "read_note", "arguments": {"name": "missing"}}', '{"name": "search_notes"}'])
    half = [*half[:1], ToolCall("1", "search_notes", {"query": "x"})]
    [mixed] = (
        await tune(Workspace(latency=0.05).server, half, (2,), trusted=True, calls=20, warmup=0, repeats=1)
    ).settings
    assert mixed.calls == mixed.errors == 10
    assert mixed.throughput == pytest.approx(1 / 0.05)  # the successful half of 2 slots of 50 ms calls


@pytest.mark.subprocess
def test_cli_synthetic_against_a_server_whose_calls_fail(tmp_path: pathlib.Path) -> None:
    """The command line says why nothing was measured, on one line, and exits 2."""
    script = tmp_path / "time_server.py"
    script.write_text(
        "from tests.test_tune import time_server\ntime_server().run('stdio')\n",
        encoding="utf-8",
    )
    argv = ["tune", "--stdio", forkserver.command([str(script)]), "--env", f"PYTHONPATH={PYTHONPATH}"]
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher", *argv, "--trusted", "--synthetic", "reads", "--range", "1,2", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        check=False,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("dispatcher tune: every generated read of the synthetic workload failed")
    assert "--workload" in line and done.stdout == ""


@pytest.mark.parametrize("command", ["tune", "inspect"])
def test_an_unbalanced_quote_is_a_usage_error(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--stdio with an unbalanced quote exits 2 with one line, not a traceback."""
    extra = ["--synthetic", "reads"] if command == "tune" else []
    assert main([command, "--stdio", "python -c 'print(1)", *extra]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert (
        line
        == f'dispatcher {command}: --stdio "python -c \'print(1)" cannot be split into a command: No closing quotation'
    )


def test_help_shows_percent_signs(capsys: pytest.CaptureFixture[str]) -> None:
    """`tune --help` says 5%, not 5%%."""
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "within 5% of the best throughput" in text and "%%" not in text


def test_without_rich_the_command_line_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without rich (the cli extra) a command exits 1 saying how to install it."""
    monkeypatch.setitem(sys.modules, "rich", None)
    assert main(["tune", "--url", "http://127.0.0.1:9/mcp", "--synthetic", "reads"]) == 1
    assert capsys.readouterr().err == (
        "dispatcher tune: the dispatcher command line needs rich: pip install 'mcp-dispatcher[cli]'\n"
    )


NOISY = "; ".join(
    [
        "import sys",
        "print('NOI' + 'SE', file=sys.stderr, flush=True)",
        "from dispatcher.examples.workspace import main",
        "main()",
    ]
)


@pytest.mark.parametrize("to_file", [False, True])
@pytest.mark.subprocess
def test_a_servers_stderr_stays_out_of_the_terminal(to_file: bool, tmp_path: pathlib.Path) -> None:
    """A stdio server's stderr is kept off the terminal by default, or appended to --server-log PATH."""
    log = tmp_path / "server.log"
    argv = ["tune", "--stdio", forkserver.command(["-c", NOISY]), "--trusted"]
    argv += ["--synthetic", "reads", "--range", "1", "--calls", "2", "--quiet"]
    argv += ["--server-log", str(log)] if to_file else []
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "NOISE" not in done.stderr and "NOISE" not in done.stdout
    assert ("NOISE" in log.read_text()) if to_file else not log.exists()


@pytest.mark.subprocess
def test_a_server_that_fails_to_start_shows_its_last_words(capsys: pytest.CaptureFixture[str]) -> None:
    """When the server dies, the command exits 1 and shows the last lines of its stderr."""
    script = "import sys; print('fatal: no config file', file=sys.stderr); sys.exit(3)"
    argv = ["--stdio", forkserver.command(["-c", script]), "--timeout", "20"]
    assert main(["inspect", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dispatcher inspect: could not connect to server 'server'")
    assert "the server's stderr ended with (--server-log PATH keeps all of it):\n  fatal: no config file\n" in err


@pytest.mark.subprocess
def test_a_bare_python_missing_a_module_gets_a_hint(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bare `python` that lacks the server's packages: the error says which one ran and what to give instead."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'anyio'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert main(["inspect", "--stdio", "python -m my_server", "--timeout", "20"]) == 1
    err = capsys.readouterr().err
    assert f"hint: 'python' ran as {fake}, the first on PATH; a missing module means" in err
    assert "give the interpreter's full path" in err
    # A full path names its interpreter already: no hint.
    assert main(["inspect", "--stdio", f"{fake} -m my_server", "--timeout", "20"]) == 1
    assert "hint:" not in capsys.readouterr().err


@pytest.mark.subprocess
def test_a_closed_pipe_ends_quietly(tmp_path: pathlib.Path) -> None:
    """`dispatcher inspect ... | head` with the reader gone: no traceback, nothing on stderr."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dispatcher", "inspect", "--stdio", workspace_command()],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": PYTHONPATH},
            check=False,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 1


def test_ctrl_c_ends_the_sweep_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An interrupted sweep exits 130 with one line on stderr, not a traceback."""
    import dispatcher.cli._tune_command

    async def interrupted(*args: object, **kwargs: object) -> TuneReport:
        raise KeyboardInterrupt

    monkeypatch.setattr(dispatcher.cli._tune_command, "tune", interrupted)
    assert main(["tune", "--url", "http://127.0.0.1:9/mcp", "--synthetic", "reads", "--quiet"]) == 130
    assert capsys.readouterr().err == "dispatcher tune: interrupted\n"


# Advice that holds: repeats, windows, early ends, slow defaults --------------------------------


def slow_server(seconds: float) -> MCPServer:
    """A server whose one read-only tool takes `seconds`."""
    server = MCPServer("slow")

    async def crawl(key: str) -> str:
        """Takes its time."""
        await anyio.sleep(seconds)
        return key

    server.add_tool(crawl, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    return server


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_duration_window_closes_on_time_and_times_the_calls_it_cut_off() -> None:
    """Calls slower than the window: it closes on time, and the calls running then are timed, as cut off."""
    workload = [ToolCall("1", "crawl", {"key": "k"})]
    report = await tune(slow_server(3.0), workload, (2,), trusted=True, calls=None, duration=1.0, warmup=0, repeats=1)
    [result] = report.settings
    assert result.elapsed == pytest.approx(1.0)  # not 3 s: no call had to complete to close it
    assert (result.calls, result.cut_off, result.errors) == (0, 2, 0)
    assert result.run_p50 == pytest.approx(3.0)  # their whole run time, not a column of "-"
    assert result.throughput == pytest.approx(2 / 3)  # a third of each call fell inside the window
    assert "cut off = calls still running when the window closed" in render_table(report)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_the_warm_up_of_a_timed_window_ends_on_time_too() -> None:
    """With a duration, a warm-up of slow calls lasts at most that long: a setting takes 2 windows, not 2 calls."""
    workload = [ToolCall("1", "crawl", {"key": "k"})]
    started = anyio.current_time()
    report = await tune(slow_server(10.0), workload, (1,), trusted=True, calls=None, duration=1.0, repeats=1)
    # The warm-up (2 calls of 10 s) is cut at 1 s, the window at 2 s; the call running then finishes at 10 s.
    assert anyio.current_time() - started == pytest.approx(10.0)
    [result] = report.settings
    assert result.elapsed == pytest.approx(1.0)
    assert result.cut_off == 1


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_repeats_run_in_rounds_and_the_progress_says_what_happens() -> None:
    """Every setting once per round; progress says probing, then warming up and measuring, setting and repeat."""
    progress: list[TuneProgress] = []
    report = await tune(
        Workspace(latency=0.05, saturation=2).server,
        "reads",
        (1, 2),
        trusted=True,
        calls=8,
        repeats=2,
        progress=progress.append,
    )
    assert progress[0].phase == "probing"
    steps = list(dict.fromkeys((p.repeat, p.index, p.phase) for p in progress[1:]))
    assert steps == [
        (0, 0, "warming up"),
        (0, 0, "measuring"),
        (0, 1, "warming up"),
        (0, 1, "measuring"),
        (1, 0, "warming up"),
        (1, 0, "measuring"),
        (1, 1, "warming up"),
        (1, 1, "measuring"),
    ]
    assert all(p.repeats == 2 and p.total == 2 for p in progress)
    assert [(s.repeats, s.calls) for s in report.settings] == [(2, 16), (2, 16)]
    assert report.to_json()["repeats"] == 2
    from dispatcher.cli._present import describe_step

    assert describe_step(TuneProgress(8, 3, 7, 5, 100, 1, 3, "measuring")) == "setting 4/7 (8), repeat 2/3: measuring"


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_time_budget_reports_the_settings_measured_so_far() -> None:
    """max_time ends the sweep with the settings done so far, says so, and asks for no wider range."""
    # At 50 ms a call: the setting 1 takes 22 calls (1.1 s), 2 takes 0.6 s, 4 would end at 2.1 s.
    report = await tune(
        Workspace(latency=0.05).server, "reads", (1, 2, 4, 8), trusted=True, calls=20, repeats=1, max_time=2.0
    )
    assert report.cut_short == "max_time"
    # 1 and 2 were measured whole; 4, when its window had opened before the budget ran out, is kept as partial.
    assert [s.limit for s in report.settings if not s.partial] == [1, 2]
    assert [s.limit for s in report.settings if s.partial] in ([], [4])
    assert report.recommended in (2, 4)
    assert report.explanation.endswith("the sweep stopped before the larger settings were measured.")
    assert any("cut short by the time budget (2 s)" in n and "8]" in n for n in report.notes)
    assert "cut short by --max-time: the settings measured so far" in render_table(report)
    assert report.to_json()["cut_short"] == "max_time"


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_setting_stop_ends_the_sweep_with_what_it_measured() -> None:
    """The stop event (Ctrl-C on the command line) keeps the settings finished before it was set."""
    stop = anyio.Event()

    def on_progress(step: TuneProgress) -> None:
        if step.index == 1 and step.phase == "measuring":
            stop.set()

    report = await tune(
        Workspace(latency=0.05).server,
        "reads",
        (1, 2, 4),
        trusted=True,
        calls=10,
        repeats=1,
        progress=on_progress,
        stop=stop,
    )
    assert report.cut_short == "interrupted"
    assert [s.limit for s in report.settings] == [1]
    # Set once the sweep is over, it cuts nothing short.
    stop_late = anyio.Event()

    def stop_at_the_last_call(step: TuneProgress) -> None:
        if step.completed == step.planned:
            stop_late.set()

    done = await tune(
        Workspace(latency=0.05).server,
        "reads",
        (1,),
        trusted=True,
        calls=4,
        repeats=1,
        progress=stop_at_the_last_call,
        stop=stop_late,
    )
    assert done.cut_short is None and [s.limit for s in done.settings] == [1]
    empty = await tune(Workspace().server, "reads", (1,), trusted=True, calls=5, stop=_set_event())
    assert (empty.settings, empty.recommended, empty.cut_short) == ((), None, "interrupted")
    assert empty.explanation.startswith("the sweep was cut short before any setting was measured")


def _set_event() -> anyio.Event:
    event = anyio.Event()
    event.set()
    return event


@pytest.mark.subprocess
def test_cli_max_time_writes_what_it_measured_and_exits_124(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-time: the table and the JSON of the settings done, and an exit status that says cut short."""
    out = tmp_path / "tune.json"
    server = f"{workspace_command()} --latency 0.05"
    argv = ["tune", "--stdio", server, "--env", f"PYTHONPATH={PYTHONPATH}", "--trusted"]
    argv += ["--synthetic", "reads", "--range", "1,2,4", "--calls", "40", "--max-time", "2.5", "--quiet"]
    assert main([*argv, "--json", str(out)]) == 124
    report = json.loads(out.read_text())
    assert report["cut_short"] == "max_time" and len(report["settings"]) < 3
    assert "cut short by --max-time" in capsys.readouterr().out


@pytest.mark.parametrize("presses", [1, 2])
@pytest.mark.subprocess
def test_cli_ctrl_c_reports_the_settings_measured_so_far(
    presses: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first Ctrl-C (a real SIGINT) ends the sweep with the table of what was measured; a second quits now.

    Both exit 130; the second prints one line, not a traceback and not the table.
    """
    import signal

    import dispatcher.cli._tune_command

    real = dispatcher.tuning.tune

    async def interrupted_after_the_first_setting(*args: object, **kwargs: object) -> TuneReport:
        sent = False

        def on_progress(step: TuneProgress) -> None:
            nonlocal sent
            if step.index == 1 and not sent:
                sent = True
                for _ in range(presses):
                    os.kill(os.getpid(), signal.SIGINT)

        kwargs["progress"] = on_progress
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dispatcher.cli._tune_command, "tune", interrupted_after_the_first_setting)
    server = f"{workspace_command()} --latency 0.01"
    argv = ["tune", "--stdio", server, "--env", f"PYTHONPATH={PYTHONPATH}", "--trusted"]
    assert main([*argv, "--synthetic", "reads", "--range", "1,2", "--calls", "5", "--repeats", "1", "--quiet"]) == 130
    captured = capsys.readouterr()
    assert "interrupted; reporting the settings measured so far" in captured.err
    assert "Traceback" not in captured.err
    if presses == 1:
        assert "interrupted: the settings measured so far" in captured.out
        assert "not measured: [2]" in captured.out
    else:
        assert captured.out == ""
        assert captured.err.endswith("(Ctrl-C again to quit now)\ndispatcher tune: interrupted\n")


def test_synthetic_arguments_skip_defaults_that_make_calls_slow() -> None:
    """duration=10 or steps=5 as defaults: generated calls set the smallest allowed value instead."""
    from dispatcher.tuning._workloads import fast_value

    assert fast_value("duration", {"type": "number", "default": 10}) == 0
    assert fast_value("steps", {"type": "integer", "default": 5}) == 1
    assert fast_value("sleepMs", {"type": "integer", "default": 500, "minimum": 10}) == 10
    assert fast_value("delay_seconds", {"type": "number", "default": 2, "exclusiveMinimum": 0}) == 0.001
    assert fast_value("count", {"type": "integer", "default": 1}) is None  # already the smallest
    assert fast_value("name", {"type": "integer", "default": 10}) is None  # not a time or a count
    assert fast_value("duration", {"type": "string", "default": "10s"}) is None


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_synthetic_workload_does_not_inherit_a_slow_default_and_says_so() -> None:
    """A tool whose optional duration defaults to 10 s is measured at its fastest, with a note saying so."""
    server = MCPServer("operations")

    async def operation(label: str, duration: float = 10.0, steps: int = 5) -> str:
        """Runs `steps` steps over `duration` seconds (and 10 ms of its own)."""
        await anyio.sleep(0.01 + duration)
        return f"{label}: {steps} steps"

    server.add_tool(operation, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    report = await tune(server, "reads", (1, 2), trusted=True, calls=5, repeats=1)
    assert all(s.run_p95 < 0.1 for s in report.settings), report.settings  # not 10 s a call
    note = next(n for n in report.notes if n.startswith("the synthetic calls of operation"))
    assert "set duration=0, steps=1 instead of the schema's defaults (duration=10.0, steps=5)" in note


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_synthetic_write_that_did_nothing_is_reported() -> None:
    """A mixed workload's write that succeeds saying it changed nothing gets a note; one that acts does not."""
    server = MCPServer("tags")
    closed = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    additive = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)

    async def list_tags(prefix: str) -> str:
        """Lists tags."""
        return prefix

    async def tag(name: str) -> str:
        """Tags a note."""
        return f"nothing to tag: no note named {name}"

    async def log(text: str) -> str:
        """Appends to the log."""
        return "appended"

    server.add_tool(list_tags, annotations=closed)
    server.add_tool(tag, annotations=additive)
    server.add_tool(log, annotations=additive)
    report = await tune(server, "mixed", (1,), trusted=True, calls=5, repeats=1)
    [note] = [n for n in report.notes if n.startswith("the synthetic write")]
    assert note.startswith("the synthetic write tag succeeded but answered 'nothing to tag: no note named tune-")
    assert "as if it did nothing" in note


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_generated_lists_are_never_empty_and_empty_answers_count_as_doing_nothing() -> None:
    """As server-memory's create_entities: a list gets an item, so the write acts; "[]" and ENOENT get notes."""
    server = MCPServer("graph")
    closed = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    additive = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
    created: list[list[str]] = []

    async def create_entities(names: list[str]) -> str:
        """Creates entities, answering those it created (none for an empty list)."""
        created.append(names)
        return json.dumps(names)

    async def add_relations(pairs: list[str]) -> str:
        """Adds relations between entities that do not exist: answers the empty list."""
        return "[]"

    async def read_files(paths: list[str]) -> str:
        """Reads files, reporting each one missing inside a successful answer, as server-filesystem does."""
        return "\n".join(f"{path}: Error - ENOENT: no such file or directory" for path in paths)

    async def list_roots() -> str:
        """Lists the roots."""
        return "/srv"

    server.add_tool(create_entities, annotations=additive)
    server.add_tool(add_relations, annotations=additive)
    server.add_tool(read_files, annotations=closed)
    server.add_tool(list_roots, annotations=closed)
    report = await tune(server, "mixed", (1,), trusted=True, calls=5, repeats=1)
    assert created and all(len(names) == 1 for names in created), created
    nothing = [note for note in report.notes if "as if it" in note]
    assert len(nothing) == 2, report.notes
    assert any(n.startswith("the synthetic write add_relations succeeded but answered '[]'") for n in nothing)
    assert any(n.startswith("the synthetic read read_files succeeded but answered 'tune-") for n in nothing)
    assert not any("create_entities" in note or "list_roots" in note for note in nothing), nothing


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_an_override_is_measured_before_it_is_written_into_code() -> None:
    """An untrusted server with no hints: overriding search_notes as read-only makes concurrency count."""
    workspace = Workspace(latency=0.05, saturation=4)
    for tool in workspace.offered_tools:
        workspace.set_annotations(tool, None)
    with pytest.raises(ConfigurationError, match="declares no read-only"):
        await tune(workspace.server, "reads", (1, 4), calls=10, repeats=1)
    overrides = {"search_notes": ToolAnnotations(read_only_hint=True)}
    report = await tune(workspace.server, "reads", (1, 4, 16), calls=40, repeats=1, overrides=overrides)
    assert report.concurrent_share == 1.0 and report.recommended == 4
    assert report.workload == "synthetic reads (search_notes)"


# Stable advice: three runs agree within one setting ---------------------------------------------


def agree_within_one_setting(recommended: list[int | None], scale: tuple[int, ...]) -> bool:
    """Whether every recommendation is a setting of the sweep, all within one step of each other on its scale."""
    if any(r is None for r in recommended):
        return False
    steps = [scale.index(r) for r in recommended if r is not None]
    return max(steps) - min(steps) <= 1


def test_the_agreement_check_catches_advice_that_jumps() -> None:
    """The oracle of the stability tests: 64, 64, 16 (what the time server got before) do not agree."""
    assert not agree_within_one_setting([64, 64, 16], DEFAULT_SETTINGS)
    assert not agree_within_one_setting([8, None, 8], DEFAULT_SETTINGS)
    assert agree_within_one_setting([4, 8, 8], DEFAULT_SETTINGS)


# Real-clock sweeps of a stdio server: a machine loaded by other work moves their advice (seen once in four
# fresh-clone runs beside a second `make test`: 4, 1, 1 on the time server), so they run in the long form only.
_LONG_FORM = pytest.mark.skipif(
    os.environ.get("DISPATCHER_STRESS") != "1",
    reason="real-clock stability against a stdio server: run it with make stress (DISPATCHER_STRESS=1)",
)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "anyio_backend",
    [
        "trio-mockclock",
        # Real time moves with the machine's load (seen beside other jobs: 16, 8, 4): the long form's.
        pytest.param("asyncio", marks=_LONG_FORM),
        pytest.param("trio", marks=_LONG_FORM),
    ],
    indirect=True,  # tests/conftest.py's anyio_backend builds the loop each name stands for
)
async def test_three_runs_against_the_example_server_agree_near_its_saturation() -> None:
    """A server saturating at 8 gets 4 or 8 from each of three runs, never 16 or more (on the virtual clock
    in make test, on the real ones in make stress)."""
    scale = (4, 8, 16)  # 16 is the old advice, 2x above the knee
    runs = []
    for _ in range(3):
        workspace = Workspace(latency=0.03, saturation=8)
        runs.append(await tune(workspace.server, "reads", scale, trusted=True, calls=24))
    recommended = [report.recommended for report in runs]
    tables = "\n\n".join(render_table(report) for report in runs)
    assert agree_within_one_setting(recommended, scale), tables
    assert set(recommended) <= {4, 8}, tables


def reference(module: str, *args: str) -> StdioServerParameters:
    """A reference server from the package index, run with this interpreter over stdio."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install -e '.[reference-servers]'")
    return StdioServerParameters(command=sys.executable, args=["-m", module, *args])


@_LONG_FORM
@pytest.mark.reference_servers
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_three_runs_against_the_time_server_agree() -> None:
    """mcp-server-time over stdio, three sweeps: the advice agrees within one setting (it jumped 64/64/16)."""
    server = reference("mcp_server_time")
    workload = load_workload(['{"name": "get_current_time", "arguments": {"timezone": "UTC"}}'])
    scale = (1, 2, 4, 8, 16)
    runs = [await tune(server, workload, scale, trusted=True, calls=30) for _ in range(3)]
    tables = "\n\n".join(render_table(report) for report in runs)
    assert agree_within_one_setting([report.recommended for report in runs], scale), tables
    assert all(s.errors == 0 and s.repeats == 3 for report in runs for s in report.settings), tables


@pytest.fixture
def repository(tmp_path: pathlib.Path) -> pathlib.Path:
    """A git repository with five commits."""
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@example.com", "-c", "user.name=T"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    for number in range(5):
        (tmp_path / f"f{number}.txt").write_text(f"{number}\n")
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"commit {number}"], check=True)
    return tmp_path


# One backend each: stability is the server's property and the sweep's, and three sweeps over stdio are the
# longest tests here; every other test of the sweep runs on both.
@_LONG_FORM
@pytest.mark.reference_servers
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_three_runs_against_the_git_server_agree_and_never_ask_for_a_wider_range(
    repository: pathlib.Path,
) -> None:
    """mcp-server-git, whose throughput stays flat as latency grows: stable advice, no "try a wider range"."""
    server = reference("mcp_server_git", "--repository", str(repository))
    workload = load_workload([json.dumps({"name": "git_status", "arguments": {"repo_path": str(repository)}})])
    scale = (1, 2, 4, 8, 16)
    runs = [await tune(server, workload, scale, trusted=True, calls=16) for _ in range(3)]
    tables = "\n\n".join(render_table(report) for report in runs)
    assert agree_within_one_setting([report.recommended for report in runs], scale), tables
    assert not any("wider range" in report.explanation for report in runs), tables


class _Page(http.server.BaseHTTPRequestHandler):
    """One small HTML page at every path, for mcp-server-fetch to fetch from 127.0.0.1."""

    def do_GET(self) -> None:
        data = b"<html><body>" + b"<p>A paragraph of the page.</p>" * 50 + b"</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a sweep makes hundreds of requests."""


@pytest.fixture
def page() -> Iterator[str]:
    """The URL of a page served on 127.0.0.1: the fetch server's sweeps never reach the internet."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/page.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@_LONG_FORM
@pytest.mark.reference_servers
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_three_runs_against_the_fetch_server_agree(page: str) -> None:
    """mcp-server-fetch over stdio, raw fetches of a local page, three sweeps: the advice agrees within one
    setting. --allow-private-ips lets it fetch 127.0.0.1 (refused by default); --ignore-robots-txt spares each
    call a second request (and HTTP client) for robots.txt."""
    server = reference("mcp_server_fetch", "--allow-private-ips", "--ignore-robots-txt")
    workload = load_workload([json.dumps({"name": "fetch", "arguments": {"url": page, "raw": True}})])
    scale = (1, 2, 4, 8, 16)
    runs = [await tune(server, workload, scale, trusted=True, calls=16, duration=2) for _ in range(3)]
    tables = "\n\n".join(render_table(report) for report in runs)
    assert agree_within_one_setting([report.recommended for report in runs], scale), tables
    assert all(s.errors == 0 for report in runs for s in report.settings), tables


def test_cli_tune_override_mistakes_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """A bad --override item exits 2 before anything connects, saying what the hints are."""
    argv = ["tune", "--url", "http://127.0.0.1:9/mcp", "--synthetic", "reads", "--override", "search=fast"]
    assert main(argv) == 2
    assert (
        "unknown hint 'fast'; the hints are readOnly, destructive, idempotent and openWorld" in capsys.readouterr().err
    )


def _failing_server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("failing")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str) -> str:
        """Always fails."""
        await anyio.sleep(0.05)
        raise ToolError("boom")

    return server


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_online_on_a_tool_that_always_fails_reports_no_settled_limit() -> None:
    """Every call fails: the sweep stops after its first settings and the online run, which would only repeat
    the error, is not run; the text calls no limit settled."""
    report = await tune(
        _failing_server(), [ToolCall("x", "lookup", {"key": "k"})], [1, 2, 4], trusted=True, calls=20, online=True
    )
    assert report.recommended is None and report.online is None
    assert [s.limit for s in report.settings] == [1, 2]
    text = render_table(report)
    assert "every measured call failed at 1 and 2 (lookup: " in text, text
    assert "settled at" not in text and "nan" not in text, text
    json.dumps(report.to_json(), allow_nan=False)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_sweep_cut_short_says_how_many_measurements_each_figure_is_the_median_of() -> None:
    """Stopped in the second round, the table says the rows hold 1 to 2 of the 3 measurements planned."""
    stop = anyio.Event()

    def on_progress(step: TuneProgress) -> None:
        if step.repeat == 1 and step.index == 1 and step.phase == "measuring":
            stop.set()

    report = await tune(
        Workspace(latency=0.05).server, "reads", (1, 2), trusted=True, calls=10, progress=on_progress, stop=stop
    )
    assert [(s.limit, s.repeats) for s in report.settings] == [(1, 2), (2, 1)]
    table = render_table(report)
    assert "each figure is the median of its row's measurements (1 to 2, of 3 planned)" in table
    assert "median of 3 measurements" not in table
    whole = await tune(Workspace(latency=0.05).server, "reads", (1, 2), trusted=True, calls=10)
    assert "each figure is the median of 3 measurements;" in render_table(whole)


# The time budget, calls slower than the window, workloads that only fail ---------------------------


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_the_time_budget_includes_the_setting_in_progress_and_keeps_it_as_partial() -> None:
    """max_time cuts the measurement under way there, keeps it marked partial, and ends within a grace band."""
    begun = anyio.current_time()
    report = await tune(Workspace(latency=0.05).server, "reads", (1, 2), trusted=True, calls=1000, max_time=3.0)
    took = anyio.current_time() - begun
    assert 3.0 <= took <= 3.0 + 2.0  # the budget, plus at most the grace to close up
    assert report.cut_short == "max_time"
    [cut] = report.settings
    assert cut.limit == 1 and cut.partial and cut.to_json()["partial"] is True
    assert 1.0 < cut.elapsed < 3.0 and cut.calls > 10  # the window ran from the warm-up's end to the budget's
    assert "1 (1x, partial)" in render_table(report)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_calls_slower_than_the_window_are_cut_off_and_the_advice_says_so() -> None:
    """Calls of 10 s, windows of 1 s: cut off, timed, and advice to give a larger --duration, on budget."""
    workload = load_workload(['{"name": "search_notes", "arguments": {"query": "a"}}'])
    begun = anyio.current_time()
    report = await tune(
        Workspace(latency=10).server, workload, (1, 2, 4), trusted=True, calls=5, duration=1, max_time=3, repeats=1
    )
    assert 3.0 <= anyio.current_time() - begun <= 3.0 + 2.0  # not the 10 s the call running would take
    [first] = report.settings
    assert first.calls == 0 and first.cut_off >= 1 and first.errors == 0
    assert report.recommended is None
    assert "the calls take longer than the window" in report.explanation
    assert "larger --duration" in report.explanation
    assert "no setting got a successful answer" not in report.explanation
    # Without a budget too: every setting is measured, and the advice is the same.
    slow = await tune(Workspace(latency=3).server, workload, (1, 2), trusted=True, calls=5, duration=1, repeats=1)
    assert [s.limit for s in slow.settings] == [1, 2] and all(s.cut_off >= 1 for s in slow.settings)
    assert "the calls take longer than the window" in slow.explanation


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_workload_whose_calls_all_fail_stops_after_the_first_settings() -> None:
    """Every call fails: two settings are measured, not the whole sweep, and the message names tool and error."""
    workload = load_workload(['{"name": "read_note", "arguments": {"name": "missing"}}'])
    report = await tune(Workspace(latency=0.05).server, workload, (1, 2, 4, 8, 16), trusted=True, calls=10)
    assert [s.limit for s in report.settings] == [1, 2]
    assert all(s.repeats == 1 and s.calls == 0 and s.errors > 0 for s in report.settings)
    assert report.recommended is None and report.cut_short is None
    assert report.explanation.startswith("every measured call failed at 1 and 2 (read_note: tool_error: Error")
    assert "there is no note named 'missing'" in report.explanation
    assert report.to_json()["settings"][0]["errors"] > 0
    table = render_table(report)
    assert "every measured call failed" in table and "read_note" in table


def growing_server() -> MCPServer:
    """As server-memory with a store that grows: each call is slower than the one before (it reads it all)."""
    server = MCPServer("memory")
    reads = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    store: list[str] = []

    async def read_graph() -> str:
        store.append("entity")
        await anyio.sleep(0.01 * (1 + len(store) / 20))  # parses the whole store
        return f"{len(store)} entities"

    server.add_tool(read_graph, annotations=reads)
    return server


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_server_that_slows_down_round_after_round_is_said_to_drift() -> None:
    """Repeats that drift (a store that grows) get a note: the advice may not repeat, and why."""
    report = await tune(growing_server(), "reads", (1, 2, 4), trusted=True, calls=30)
    [drift] = [note for note in report.notes if "round after round" in note]
    assert "the server changed under the sweep" in drift and "fresh server" in drift
    assert report.explanation.endswith("It may not repeat: the server got slower during the sweep (see the notes).")
    # A steady server shows no drift.
    steady = await tune(Workspace(latency=0.05).server, "reads", (1, 2, 4), trusted=True, calls=30)
    assert not any("round after round" in note for note in steady.notes)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_an_online_run_whose_calls_all_fail_reports_no_settled_limit() -> None:
    """The online run on its own, every call failing: the text does not call its last limit settled."""
    from dispatcher import AdaptiveLimit
    from dispatcher.tuning._online import measure_online

    workload = [ToolCall("x", "lookup", {"key": "k"})]
    async with Client(_failing_server()) as client:
        online = await measure_online(
            client,
            workload,
            setting=AdaptiveLimit(ceiling=4),
            server="server",
            trusted=True,
            overrides=None,
            clients=4,
            calls=20,
            duration=None,
            call_timeout=60.0,
        )
    assert online.measured.calls == 0 and online.measured.errors > 0
    report = await tune(Workspace(latency=0.05).server, "reads", (1,), trusted=True, calls=5, repeats=1)
    text = render_table(replace(report, online=online))
    assert "online limit (max_concurrency=AdaptiveLimit(ceiling=4)): no call of its run succeeded" in text, text
    assert "settled at" not in text and "nan" not in text, text
