"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

from typing import Any

import pytest


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
