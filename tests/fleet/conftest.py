"""Fixtures of the fleet tests: a real redis-server per test, started on a free port and stopped after."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import TYPE_CHECKING

import pytest

from benchmarks._redis import RedisServer, redis_server_binary, skip_or_fail

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


FENCE = "example.com/fence"
"""The `_meta` entry of the fenced workspace's tokens."""


@pytest.fixture
def workspace(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """The example workspace over HTTP with a ledger; yields its URL and the ledger's path."""
    yield from _workspace(tmp_path)


@pytest.fixture
def fenced_workspace(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """The same workspace in its fenced mode: writes with a stale token in _meta[FENCE] are refused."""
    yield from _workspace(tmp_path, "--fence", FENCE, "--latency", "0.06")


@pytest.fixture
def slow_workspace(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """The workspace with 0.2 s calls: a flush or a freeze finds writes in flight."""
    yield from _workspace(tmp_path, "--latency", "0.2")


def _workspace(tmp_path: pathlib.Path, *options: str) -> Iterator[tuple[str, pathlib.Path]]:
    ledger = tmp_path / "ledger.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.examples.workspace", "--http", "--port", "0", "--latency", "0.03",
         "--ledger", str(ledger), *options],
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("MCP_URL="), f"the workspace did not start: {line!r}"
        yield line.strip().split("=", 1)[1], ledger
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()
