"""Shared fixtures: every async test runs on asyncio and on trio, and on trio's MockClock when it asks.

A test (or a module, in its ``pytestmark``) chooses its loops with ``@pytest.mark.backends(...)``, from
``asyncio``, ``trio`` and ``trio-mockclock`` (trio under a fresh ``MockClock(autojump_threshold=0)``, where
times are exact and waits free): ``@pytest.mark.backends(*BACKENDS)`` for all three,
``@pytest.mark.backends("trio-mockclock")`` for a test about times alone. The closest marker wins (a test's
over its module's); a test that parametrizes ``anyio_backend`` itself keeps its own list.

The markers of costly tests (``subprocess``, ``redis``, ``slow``) are tests/markers.py's; the chaos suite's
figures, summed over pytest-xdist workers, tests/chaos/session.py's.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import trio.testing

from tests import forkserver

pytest_plugins = ["tests.markers", "tests.chaos.session"]


BACKENDS = ("asyncio", "trio", "trio-mockclock")
"""The loops a test may ask for with ``@pytest.mark.backends``; without the marker it runs on the first two."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "backends(*names): the anyio backends the test runs on, from asyncio, trio and trio-mockclock"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Turn a ``backends`` marker into the test's parametrization of ``anyio_backend``."""
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is None or "anyio_backend" not in metafunc.fixturenames:
        return
    if any("anyio_backend" in str(mark.args[0]) for mark in metafunc.definition.iter_markers("parametrize")):
        return
    unknown = set(marker.args) - set(BACKENDS)
    if unknown or not marker.args:
        raise pytest.UsageError(f"backends({', '.join(map(repr, marker.args))}): choose among {BACKENDS}")
    metafunc.definition.add_marker(pytest.mark.parametrize("anyio_backend", marker.args, indirect=True))


@pytest.fixture(params=BACKENDS[:2])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Run each async test on both anyio backends, or on those its ``backends`` marker names.

    ``trio-mockclock`` gets a clock of its own for each test, so no test starts at another's virtual time.
    """
    if request.param == "trio-mockclock":
        return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})
    return request.param


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
    """Freeze what collection built (some 350,000 objects: every test module and what it imported).

    They live to the end of the session anyway; frozen, the cyclic collector stops walking them, so a
    `gc.collect()` (the benchmark smoke tests call one before each timed run, the memory tests many) costs
    about a millisecond instead of about 0.4 s of CPU. Objects the tests create are collected as before.
    hypothesis is imported first (its pytest plugin imports it at the end of every run anyway): its import
    checks with `gc.get_referrers`, which does not see frozen objects, that the random generators it is
    handed are referenced elsewhere.
    """
    import hypothesis  # noqa: F401

    gc.freeze()
    if any(item.get_closest_marker("subprocess") for item in session.items):
        forkserver.start()  # its imports overlap the first tests; `pytest_runtest_setup` waits for it


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a test that starts processes, wait until the fork server is ready (tests/forkserver.py).

    Its start (the SDK's imports: seconds of wall time on a loaded machine) then falls in the test's setup,
    never inside a timeout of the test's own.
    """
    if item.get_closest_marker("subprocess"):
        forkserver.ready()
