"""The suite's own rules: the markers of costly tests (tests/markers.py) and make test-quick's selection."""

from __future__ import annotations

import pathlib
import sys

from tests import markers

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_process_started_by_an_unmarked_test_is_seen() -> None:
    """The audit hook records a process start while the running test has no ``subprocess`` marker.

    ``sys.audit`` raises the event that ``subprocess.Popen`` raises, without starting anything.
    """
    running = markers.Watch.started
    markers.Watch.started = []
    try:
        sys.audit("subprocess.Popen", "server", ["server", "--stdio"], None, None)
        sys.audit("os.getcwd")  # not a process
    finally:
        seen, markers.Watch.started = markers.Watch.started, running
    assert seen == ["subprocess.Popen 'server'"]


def test_a_marked_test_is_not_watched() -> None:
    """While a test with the marker runs there is no list to add to (the hook ignores its processes)."""
    running = markers.Watch.started
    markers.Watch.started = None
    try:
        sys.audit("subprocess.Popen", "server", ["server"], None, None)
    finally:
        seen, markers.Watch.started = markers.Watch.started, running
    assert seen is None


def test_make_test_quick_leaves_out_the_three_markers() -> None:
    """make test-quick selects with the expression the process check recognises as a quick run."""
    makefile = (ROOT / "Makefile").read_text()
    assert '-m "not subprocess and not redis and not slow"' in makefile
    pyproject = (ROOT / "pyproject.toml").read_text()
    for marker in ("subprocess", "redis", "slow"):
        assert f'"{marker}: ' in pyproject
