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
