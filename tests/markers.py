"""The markers of costly tests, which ``make test-quick`` leaves out (tests/README.md).

- ``@pytest.mark.subprocess``: the test starts a process (a stdio server, an HTTP server in a subprocess,
  the command line, git, node, redis-server).
- ``@pytest.mark.redis``: the test needs redis-server; a test using the `redis_server` fixture (tests/fleet)
  gets it, and ``subprocess``, by itself.
- ``@pytest.mark.slow``: the test takes seconds without starting a process.

The ``subprocess`` marker is checked, not trusted: an audit hook sees every process a test starts
(``subprocess.Popen``, ``os.posix_spawn``, ``os.fork``..., which anyio's and the SDK's stdio clients go
through too). In a run that leaves the marked tests out (``make test-quick``), an unmarked test that starts
one fails, saying which marker it lacks; in a full run such tests are only listed at the end, so a test
added without the marker never breaks ``make test``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

    from _pytest.terminal import TerminalReporter

PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"})

PROCESS_FIXTURES = frozenset({"redis_server", "workspace", "fenced_workspace", "slow_workspace"})
"""Fixtures that start a process (tests/fleet/conftest.py): a test using one gets ``subprocess``."""

_UNMARKED = "started_a_process_unmarked"
"""The user property by which a worker tells the controller that an unmarked test started a process."""


class Watch:
    """What the running test started, while it carries no ``subprocess`` marker (None otherwise)."""

    started: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    started = Watch.started
    if started is not None and event in PROCESS_EVENTS:
        started.append(f"{event} {args[0]!r}" if args else event)


sys.addaudithook(_audit)


def _quick(config: pytest.Config) -> bool:
    """Whether this run leaves out the tests that start processes (``-m "not subprocess ..."``)."""
    return "not subprocess" in (config.getoption("markexpr", "") or "")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The markers that follow from fixtures and other markers, added before ``-m`` selects."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "redis_server" in fixtures:
            item.add_marker(pytest.mark.redis)
        if fixtures & PROCESS_FIXTURES or item.get_closest_marker("reference_servers"):
            item.add_marker(pytest.mark.subprocess)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Watch the processes started by a test without the ``subprocess`` marker (its fixtures included)."""
    Watch.started = None if item.get_closest_marker("subprocess") else []
    try:
        return (yield)
    finally:
        Watch.started = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    """On the teardown report (its fixtures gone too), say what an unmarked test started."""
    report = yield
    started = Watch.started
    if call.when == "teardown" and started and isinstance(report, pytest.TestReport):
        report.user_properties.append((_UNMARKED, started[0]))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """In a quick run, fail a test that started a process without the ``subprocess`` marker."""
    result = yield
    started = Watch.started
    if started and _quick(item.config):
        pytest.fail(
            f"this test starts a process ({started[0]}) without @pytest.mark.subprocess, which make test-quick"
            " would have skipped: add the marker (tests/README.md)",
            pytrace=False,
        )
    return result


_unmarked: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note the unmarked tests that started a process (reported by this process or by an xdist worker)."""
    for name, value in report.user_properties:
        if name == _UNMARKED:
            _unmarked[report.nodeid] = str(value)


def pytest_terminal_summary(terminalreporter: TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """List the tests that start a process without the ``subprocess`` marker (make test-quick runs them)."""
    if not _unmarked or hasattr(config, "workeroutput"):
        return
    terminalreporter.section("tests that start a process without @pytest.mark.subprocess")
    for nodeid, started in sorted(_unmarked.items()):
        terminalreporter.write_line(f"{nodeid}: {started}")
