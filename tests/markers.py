"""The markers of costly tests, which ``make test-quick`` leaves out (tests/README.md).

- ``@pytest.mark.subprocess``: the test starts a process (a stdio server, an HTTP server in a subprocess,
  the command line, git, redis-server). An unmarked test that starts one fails, saying so, so the quick
  run can trust the marker: the check is an audit hook on process creation (``subprocess.Popen``,
  ``os.fork``, ``os.posix_spawn``...), which every way of starting a process in the suite goes through
  (anyio's and the SDK's stdio client included).
- ``@pytest.mark.redis``: the test needs redis-server; a test using the `redis_server` fixture (tests/fleet)
  gets it by itself. A fixture that starts a process is listed in `PROCESS_FIXTURES`, so that the tests
  using it get ``subprocess``.
- ``@pytest.mark.slow``: the test takes seconds even on an idle machine.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"})
_spawned: list[str] | None = None
"""While a test without the `subprocess` marker runs: what it started (None while a marked one runs)."""


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _spawned is not None and event in _PROCESS_EVENTS:
        _spawned.append(f"{event} {args[0]!r}" if args else event)


sys.addaudithook(_audit)


PROCESS_FIXTURES = frozenset({"redis_server", "workspace", "fenced_workspace", "slow_workspace"})
"""Fixtures that start a process (tests/fleet/conftest.py): a test using one starts a process too."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers that follow from others and from fixtures, added before ``-m`` selects.

    A test using redis-server is a Redis test; one using a fixture of `PROCESS_FIXTURES`, or against the
    reference servers of the package index (which run over stdio), starts a process.
    """
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "redis_server" in fixtures:
            item.add_marker(pytest.mark.redis)
        if fixtures & PROCESS_FIXTURES or item.get_closest_marker("reference_servers"):
            item.add_marker(pytest.mark.subprocess)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Watch for processes started by a test that does not carry the `subprocess` marker."""
    global _spawned
    _spawned = None if item.get_closest_marker("subprocess") else []
    try:
        return (yield)
    finally:
        _spawned = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """Fail a test that started a process (in its fixtures or its body) without the `subprocess` marker."""
    try:
        result = yield
    finally:
        if _spawned:
            started, _spawned[:] = list(_spawned), []
            pytest.fail(
                f"this test starts a process ({started[0]}) without @pytest.mark.subprocess: add the marker"
                " (make test-quick skips the tests that have it; tests/README.md)",
                pytrace=False,
            )
    return result
