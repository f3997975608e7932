"""`tune` against servers that misbehave mid-sweep: the settings measured so far are still reported."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

import dispatcher
from dispatcher.cli import main
from dispatcher.tuning import load_workload, recommend, tune

from .test_tune import setting

if TYPE_CHECKING:
    from collections.abc import Iterator

SOURCE_ROOT = str(pathlib.Path(dispatcher.__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)}
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
# The probe and the first setting's 10 calls are answered; the server exits during the second setting.
ANSWERED = 16


def stdio() -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "tests.dying_server", str(ANSWERED)], env=ENV, cwd=SOURCE_ROOT
    )


@contextlib.contextmanager
def http() -> Iterator[str]:
    """The dying server over streamable HTTP, in a process of its own, and its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "tests.dying_server", str(ANSWERED), str(port)]
    process = subprocess.Popen(command, env=ENV, cwd=SOURCE_ROOT, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert process.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


@pytest.mark.subprocess
@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio")
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_that_exits_mid_sweep_leaves_the_settings_measured(transport: str) -> None:
    """The sweep stops where the server did: the settings before are reported, marked cut short, not raised."""
    with contextlib.ExitStack() as stack:
        target: Any = stdio() if transport == "stdio" else stack.enter_context(http())
        report = await tune(
            target, "reads", (1, 2, 4), trusted=True, calls=10, warmup=0, repeats=1, connect_timeout=30, call_timeout=10
        )
    assert report.cut_short == "server_lost"
    limits = [setting.limit for setting in report.settings]
    assert limits[0] == 1 and 4 not in limits, limits
    assert report.settings[0].calls == 10 and report.settings[0].errors == 0
    # Fewer than two settings measured before the server went: nothing compared, so nothing recommended.
    assert report.recommended is None and "nothing to recommend" in report.explanation, report.explanation
    # Over stdio the calls of 2 fail one by one (counted as errors); over HTTP the client's tasks end with it.
    assert any(
        "the server stopped answering" in note and re.search(r"not measured: \[(2, )?4\]", note)
        for note in report.notes
    ), report.notes
    assert report.to_json()["cut_short"] == "server_lost"


@pytest.mark.subprocess
def test_the_command_line_prints_the_settings_measured_and_exits_1(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    monkeypatch.chdir(SOURCE_ROOT)
    out = tmp_path / "report.json"
    command = f"{sys.executable} -m tests.dying_server {ANSWERED}"
    argv = ["tune", "--stdio", command, "--synthetic", "reads", "--trusted", "--calls", "10", "--warmup", "0"]
    status = main([*argv, "--range", "1,2,4", "--repeats", "1", "--quiet", "--json", str(out)])
    printed = capsys.readouterr()
    assert status == 1
    assert "Traceback" not in printed.err
    assert "cut short: the server stopped answering" in printed.out
    # Only 1 was measured whole: the calls of 2 failed with the connection, which says nothing of 2.
    assert "<- recommended" not in printed.out and "recommended:" not in printed.out
    assert "only 1 was measured (" in printed.out and "before the server stopped answering while 2 was" in printed.out
    assert "one setting compares with nothing, so there is nothing to recommend" in printed.out
    assert "as calls do when a server rejects" not in printed.out
    assert '"cut_short": "server_lost"' in out.read_text()


def test_the_setting_the_server_was_lost_during_is_left_out_of_the_advice() -> None:
    """Its calls failed with the connection: not read as a server rejecting calls above some concurrency."""
    from dispatcher.tuning._report import conclude

    lost = replace(setting(4, 30.0), errors=60)
    measured = {1: [setting(1, 10.0)], 2: [setting(2, 20.0)], 4: [lost], 8: []}
    verdict = conclude(
        measured,
        share=1.0,
        tolerance=0.05,
        planned_top=8,
        synthetic=False,
        repeats=1,
        cut_short="server_lost",
        max_time=None,
        lost="Connection closed, before measuring 8",
        lost_during=4,
    )
    assert [s.limit for s in verdict.settings] == [1, 2, 4]  # the table still shows it
    assert verdict.recommended == 2 and "Left out: the settings where more calls failed" not in verdict.explanation
    assert "4 is left out: the server stopped answering while it was measured" in verdict.explanation
    assert any("not measured: [8]" in note for note in verdict.notes), verdict.notes


def changing_server(after: int) -> MCPServer[Any]:
    """A server whose read-only `lookup` declares itself destructive after `after` calls (None: never)."""
    server: MCPServer[Any] = MCPServer("changing")
    count = 0

    async def lookup(name: str) -> str:
        """Look a name up."""
        nonlocal count
        count += 1
        if count == after:
            server.remove_tool("lookup")
            server.add_tool(lookup, annotations=DESTRUCTIVE, structured_output=False)
        await anyio.sleep(0.01)
        return name

    server.add_tool(lookup, annotations=READ, structured_output=False)
    return server


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_tools_that_change_under_the_sweep_are_noted() -> None:
    """A workload tool declared anew between settings: the report says the settings ran different workloads."""
    # The change comes during the first setting (after the probe and 4 of its calls), seen when 2 is set up.
    report = await tune(changing_server(after=5), "reads", (1, 2, 4), trusted=True, calls=10, warmup=0, repeats=1)
    [note] = [note for note in report.notes if "tools changed during the sweep" in note]
    assert "seen when 2 was set up" in note and "lookup declares other annotations (it now runs alone" in note
    steady = await tune(changing_server(after=-1), "reads", (1, 2, 4), trusted=True, calls=10, warmup=0, repeats=1)
    assert not [note for note in steady.notes if "tools changed" in note]


class Spec(BaseModel):
    """A nested argument, with a slow default of its own."""

    label: str
    pause: float = 3.0


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_synthetic_calls_skip_nested_and_required_slow_values_and_say_so() -> None:
    """A nested default, an optional number that may be null, and a required time without default: all fast."""
    server: MCPServer[Any] = MCPServer("slow-arguments")

    async def operation(spec: Spec, seconds: int, delay_ms: int | None = 5000) -> str:
        """Waits spec.pause + seconds + delay_ms."""
        await anyio.sleep(0.01 + spec.pause + seconds + (delay_ms or 0) / 1000)
        return spec.label

    server.add_tool(operation, annotations=READ, structured_output=False)
    report = await tune(server, "reads", (1, 2), trusted=True, calls=10, warmup=0, repeats=1)
    # A generated `seconds` ranges over 0..9, and the defaults add 8 s: any of them makes a call last seconds.
    # At least the 10 measured calls (in real time a few more may end in the window's last loop turn).
    assert all(10 <= s.calls <= 20 and s.run_p95 < 1.0 for s in report.settings), report.settings
    [note] = [n for n in report.notes if n.startswith("the synthetic calls of operation")]
    assert "set spec.pause=0, seconds=0, delay_ms=0 instead of the schema's defaults (spec.pause=3.0, " in note
    assert "delay_ms=5000) and generated values for seconds (required, without a default)" in note


def rejecting_server(most: int) -> MCPServer[Any]:
    """A server answering -32000 ("rate limited") to calls beyond `most` in flight, at once, as a rate limiter."""
    server: MCPServer[Any] = MCPServer("rejecting")
    running = 0

    async def lookup(name: str) -> str:
        """Look a name up."""
        nonlocal running
        if running >= most:
            raise MCPError(-32000, "rate limited")
        running += 1
        try:
            await anyio.sleep(0.02)
        finally:
            running -= 1
        return name

    server.add_tool(lookup, annotations=READ, structured_output=False)
    return server


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_settings_where_the_server_rejects_calls_are_not_recommended() -> None:
    """Above 4 in flight most calls are rejected, and those answered come as fast: 4 is recommended, not 16.

    On the mock clock too, where a rejection takes no time at all: the calls after the warm-up count even
    when they end at the instant the window opened (they were counted as neither calls nor errors).
    """
    report = await tune(rejecting_server(4), "reads", (1, 4, 8, 16), trusted=True, calls=40, repeats=1)
    rejected = {s.limit: s for s in report.settings}
    assert rejected[8].errors > 0 and rejected[16].errors > 0, report.settings
    assert report.recommended == 4, report.explanation
    assert "Left out: the settings where more calls failed (" in report.explanation
    assert "at 16" in report.explanation and "largest setting at which calls do not fail" in report.explanation
    assert "wider range" not in report.explanation


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_calls_in_flight_count_those_that_fail() -> None:
    """Calls that fail after 20 ms held their slots: 4 in flight at 4 (the column counted successes only: 0)."""
    server: MCPServer[Any] = MCPServer("failing")

    async def lookup(name: str) -> str:
        """Look a name up."""
        await anyio.sleep(0.02)
        raise ToolError(f"no {name}")

    server.add_tool(lookup, annotations=READ, structured_output=False)
    workload = load_workload(['{"name": "lookup", "arguments": {"name": "a"}}'])
    report = await tune(server, workload, (1, 4), trusted=True, calls=40, repeats=1)
    by = {s.limit: s for s in report.settings}
    assert by[1].calls == by[4].calls == 0 and by[4].errors >= 40, report.settings
    # Bands: on a loaded machine the slots stand empty for a moment between a failure and the next call.
    assert 0.8 <= by[1].in_flight <= 1.01 and 2.5 <= by[4].in_flight <= 4.01, report.settings


def test_errors_that_do_not_grow_with_the_setting_leave_it_eligible() -> None:
    """A workload whose calls fail alike at every setting (a generated argument) is judged on throughput."""
    results = [replace(setting(limit, rate), errors=10) for limit, rate in ((1, 10.0), (2, 20.0), (4, 21.0))]
    recommended, _, explanation = recommend(results)
    assert recommended == 2 and "Left out" not in explanation
    rejected = [*results[:2], replace(results[2], throughput=40.0, errors=60)]
    recommended, best, explanation = recommend(rejected)
    assert (recommended, best) == (2, 2) and "Left out: the settings where more calls failed (38% at 4" in explanation


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_calls_that_never_answer_are_not_taken_for_slow_ones() -> None:
    """Every call after the probe hangs until call_timeout: no advice to measure longer, since none would end."""
    server: MCPServer[Any] = MCPServer("hanging")
    answered = 0

    async def lookup(name: str) -> str:
        """Look a name up (once)."""
        nonlocal answered
        answered += 1
        if answered > 1:
            await anyio.sleep(3600)
        return name

    server.add_tool(lookup, annotations=READ, structured_output=False)
    report = await tune(
        server, "reads", (1, 2), trusted=True, calls=None, duration=0.2, warmup=0, repeats=1, call_timeout=0.6
    )
    assert report.recommended is None
    assert [(s.calls, s.cut_off, s.cut_off_failed) for s in report.settings] == [(0, 1, 1), (0, 2, 2)]
    assert "none of the 3 calls still running when it closed succeeded afterwards" in report.explanation
    assert "a larger --duration would not help" in report.explanation


@pytest.mark.subprocess
def test_a_json_path_that_cannot_be_written_still_prints_the_table(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json into a folder that cannot exist: the table is printed, then the error, exit status 1."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    command = f"{sys.executable} -m tests.dying_server 1000"
    argv = ["tune", "--stdio", command, "--env", f"PYTHONPATH={ENV['PYTHONPATH']}", "--synthetic", "reads"]
    argv += ["--trusted", "--calls", "5", "--range", "1,2", "--repeats", "1", "--quiet"]
    assert main([*argv, "--json", str(blocker / "report.json")]) == 1
    printed = capsys.readouterr()
    assert "<- recommended" in printed.out
    assert "Traceback" not in printed.err
    assert f"cannot write the JSON report to {blocker / 'report.json'}" in printed.err
