"""Fixtures of the fleet tests: a real redis-server per test, started on a free port and stopped after."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from benchmarks._redis import RedisServer, redis_server_binary, skip_or_fail

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Iterator


@pytest.fixture
def redis_server(tmp_path: pathlib.Path) -> Iterator[RedisServer]:
    """A fresh, empty redis-server for one test (skipped, or failed under CI=true, if none is installed)."""
    binary = redis_server_binary()
    if binary is None:
        skip_or_fail("redis-server is not installed: run .ci/redis, or install Redis 7 (Debian: redis-server)")
        raise AssertionError("unreachable")
    server = RedisServer(binary, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace() -> str:
    """A fleet name of its own for each test."""
    return f"test-{uuid.uuid4().hex[:8]}"
