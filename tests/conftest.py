"""Shared fixtures: every async test runs on asyncio and on trio.

The markers of costly tests (``subprocess``, ``redis``, ``slow``) are tests/markers.py's; the chaos suite's
figures, summed over pytest-xdist workers, tests/chaos/session.py's.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

pytest_plugins = ["tests.markers", "tests.chaos.session"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Run each async test on both anyio backends."""
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
