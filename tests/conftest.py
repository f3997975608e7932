"""Shared fixtures and the suite's rules (tests/README.md): backends and clocks, and the markers of costly tests.

Every async test runs on asyncio and on trio. A marker changes that set:

- ``@pytest.mark.virtual_time``: trio alone, under a fresh ``MockClock(autojump_threshold=0)``: time
  moves only when every task waits, so a 30 s timeout costs nothing and times are exact;
- ``@pytest.mark.all_clocks``: asyncio, trio and trio under the mock clock (the test reads `virtual_clock`
  to know which, and checks exact times only there);
- ``@pytest.mark.backends("asyncio")``: those backends alone (a framework that runs only on asyncio).

The marker nearest the test wins (a test's own over its module's ``pytestmark``). The ids are
``asyncio``, ``trio`` and ``trio-mockclock``.

The markers of costly tests (``subprocess``, ``redis``, ``slow``) are tests/markers.py's.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

# The markers of costly tests (the subprocess marker enforced), and the chaos figures summed over workers.
pytest_plugins = ["tests.markers", "tests.chaos.session"]

ASYNCIO, TRIO, TRIO_MOCKCLOCK = "asyncio", "trio", "trio-mockclock"
DEFAULT_BACKENDS = (ASYNCIO, TRIO)
ALL_CLOCKS = (ASYNCIO, TRIO, TRIO_MOCKCLOCK)
_CLOCK_MARKERS = ("virtual_time", "all_clocks", "backends")


def backends_of(definition: pytest.Function | pytest.Item) -> tuple[str, ...]:
    """The backend ids a test runs on: set by the nearest of its clock markers, else asyncio and trio."""
    for marker in definition.iter_markers():
        if marker.name == "virtual_time":
            return (TRIO_MOCKCLOCK,)
        if marker.name == "all_clocks":
            return ALL_CLOCKS
        if marker.name == "backends":
            unknown = [name for name in marker.args if name not in ALL_CLOCKS]
            if not marker.args or unknown:
                raise pytest.UsageError(f"backends() takes some of {ALL_CLOCKS}, got {marker.args}")
            return tuple(marker.args)
    return DEFAULT_BACKENDS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Give every test that runs under anyio its backends, as its markers say."""
    if "anyio_backend" not in metafunc.fixturenames:
        return
    if any("anyio_backend" in _argnames(marker) for marker in metafunc.definition.iter_markers("parametrize")):
        return  # spelled out by hand: tests/test_suite_rules.py asks for a marker instead
    metafunc.parametrize("anyio_backend", backends_of(metafunc.definition), indirect=True)


def _argnames(marker: pytest.Mark) -> list[str]:
    names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
    return [name.strip() for name in names.split(",")] if isinstance(names, str) else list(names)


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The backend for the anyio plugin: a name, or trio with a fresh virtual clock of its own."""
    name = getattr(request, "param", ASYNCIO)
    if name == TRIO_MOCKCLOCK:
        from trio.testing import MockClock

        return (TRIO, {"clock": MockClock(autojump_threshold=0)})
    return name


@pytest.fixture
def anyio_backend_name(anyio_backend: Any) -> str:
    """The backend name alone, whatever options the backend was given."""
    return anyio_backend if isinstance(anyio_backend, str) else str(anyio_backend[0])


@pytest.fixture
def virtual_clock(anyio_backend: Any) -> bool:
    """Whether the test's loop runs on a virtual clock (trio's MockClock): its times are exact, waits free.

    On a real clock a loaded machine can stall the loop for a good fraction of a second, so a call that
    must finish in time gets a limit with room for that, and exact times are checked on the virtual one.
    """
    return not isinstance(anyio_backend, str) and "clock" in anyio_backend[1]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (about 350,000 objects: every test module and what it imported).

    They live to the end of the session anyway; frozen, the cyclic collector stops walking them, and a
    `gc.collect()` (the benchmarks call one before each timed run, the memory tests many) costs about a
    millisecond instead of about 0.4 s of CPU. Objects the tests create are collected as before.
    """
    gc.freeze()
