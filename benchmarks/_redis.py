"""A throwaway redis-server on a free 127.0.0.1 port, with its own temporary directory and no persistence."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pathlib

__all__ = ["RedisServer", "redis_server_binary"]


def redis_server_binary() -> str | None:
    """The redis-server executable on PATH, or None."""
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One redis-server process that can be stopped, killed and started again on the same port."""

    def __init__(self, binary: str, directory: pathlib.Path) -> None:
        self.binary = binary
        self.directory = directory
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server (empty: it keeps nothing on disk) and wait until it answers PING."""
        assert self.process is None, "already running"
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--loglevel", "warning",
                "--logfile", str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text() if (self.directory / "redis.log").exists() else ""
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout}s")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill the server (SIGKILL: everything it held is gone, as in a crash) and reap it."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()


def skip_or_fail(reason: str) -> None:
    """Skip for want of redis-server, except in CI, where the fleet tests must run."""
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the fleet tests must run; .ci/redis installs it)")
    pytest.skip(reason)
