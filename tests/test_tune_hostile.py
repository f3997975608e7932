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
from typing import TYPE_CHECKING, Any

import pytest
from mcp import StdioServerParameters

import dispatcher
from dispatcher.cli import main
from dispatcher.tuning import tune

if TYPE_CHECKING:
    from collections.abc import Iterator

SOURCE_ROOT = str(pathlib.Path(dispatcher.__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)}
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
    assert "<- recommended" in printed.out
    assert '"cut_short": "server_lost"' in out.read_text()
