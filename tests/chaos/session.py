"""The chaos suite's figures at the end of a session (a plugin of tests/conftest.py, so it sees every worker).

Under pytest-xdist each worker counts what its tests did in its own `FIGURES`; a worker hands them to the
controller when it finishes, and the controller prints the sum. In the long form (`make stress`) they are
also written to tests/chaos/results/stress.json.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from .harness import FIGURES, RESULTS, STRESS

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

_STARTED = time.monotonic()
_KEY = "chaos_figures"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker, hand this worker's figures to the controller."""
    workeroutput: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_KEY] = FIGURES.as_json()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """In the pytest-xdist controller, add a finished worker's figures to the session's."""
    figures = getattr(node, "workeroutput", {}).get(_KEY)
    if figures:
        FIGURES.add(figures)


def pytest_terminal_summary(terminalreporter: TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """Print what the chaos suite did; in the long form, also write it to tests/chaos/results/stress.json."""
    if not FIGURES.batches or hasattr(config, "workeroutput"):
        return
    figures = FIGURES.as_json()
    terminalreporter.section("chaos figures")
    terminalreporter.write_line(json.dumps(figures))
    if not STRESS:
        return
    stats = terminalreporter.stats
    summary = {
        "form": "stress",
        "command": "make stress",
        "pytest_args": list(config.invocation_params.args),
        "passed": len(stats.get("passed", [])),
        "failed": len(stats.get("failed", [])),
        "errors": len(stats.get("error", [])),
        "exit_status": int(exitstatus),
        "duration_seconds": round(time.monotonic() - _STARTED, 1),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "figures": figures,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "stress.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    terminalreporter.write_line(f"written to {path}")
