"""Quiet by default: the example server and a dispatcher leave the application's logging as it was.

Each check runs tests/quiet_probe.py in a fresh interpreter, where nothing has configured logging (as in
a user's script; under pytest the root logger already has handlers, so the SDK's `basicConfig` would do
nothing and hide the fault). The probe serves the workspace in process, over stdio and over HTTP.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "quiet_probe.py"


def _probe(backend: str, *options: str) -> tuple[dict[str, Any], str]:
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(PROBE), backend, *options],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": pythonpath},
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def _loud(report: dict[str, Any], stderr: str) -> list[str]:
    """What the checks object to: a changed root or SDK logger, a record below WARNING, anything on stderr."""
    found = [f"{moment}: {report[moment]}" for moment in ("created", "after") if report[moment] != report["before"]]
    found += [f"record {record}" for record in report["records"] if record[0] in ("DEBUG", "INFO")]
    if stderr.strip():
        found.append(f"stderr: {stderr[:500]}")
    return found


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.subprocess
def test_the_example_server_and_a_dispatcher_leave_logging_alone(backend: str) -> None:
    """Root level and handlers, SDK loggers unchanged; no INFO record reaches the root; nothing on stderr."""
    report, stderr = _probe(backend)
    assert report["statuses"] == ["ok"] * 6
    assert report["before"]["root_level"] == 30 and report["before"]["root_handlers"] == []
    assert _loud(report, stderr) == []


@pytest.mark.subprocess
def test_the_check_catches_a_server_that_configures_the_root_logger() -> None:
    """A bare MCPServer() sets the root to INFO with a handler: the same check then fails."""
    report, stderr = _probe("asyncio", "--unguarded")
    problems = _loud(report, stderr)
    assert any(problem.startswith("created:") for problem in problems)
    assert any("HTTP Request" in problem for problem in problems), problems
