"""The chaos suite's session: the long form's tests, and the figures printed (and saved) at the end."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from typing import TYPE_CHECKING

import pytest

from .harness import FIGURES, RESULTS, STRESS

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

_STARTED = time.monotonic()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``stress`` run only in the long form (`make stress`, ``DISPATCHER_STRESS=1``)."""
    if STRESS:
        return
    skip = pytest.mark.skip(reason="the long form of the chaos suite: run it with make stress")
    for item in items:
        if item.get_closest_marker("stress") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """Print what the chaos suite did; in the long form, also write it to tests/chaos/results/stress.json."""
    if not FIGURES.batches:
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
