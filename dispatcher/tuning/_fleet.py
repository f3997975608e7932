"""`tune --fleet`: one setting of a fleet-wide limit, measured by a fleet of real processes.

Each process is a dispatcher of its own with a `RedisCoordinator` that gives the server a fleet-wide
`FleetServer(limit=setting)`, connected to the server over streamable HTTP on its own, and running its
share of the closed loop (`_measure.closed_loop`): the callers, the warm-up and the measured calls are
split across the processes. The processes connect, say READY, and start together when told GO; each
sends back every call's result and its window. The figures are those of the whole fleet: its calls
merged on the host's monotonic clock (the same clock in every process on one machine), over the span
when every process was measuring.

The sweep's time budget reaches the processes as a deadline on that clock: when it runs out mid-setting,
each process closes its window there, cancels the calls still running (counted as cut off, timed up to
that moment) and sends what it measured, so that the setting is kept, marked `partial`, as a
single-process sweep keeps it.

A process runs `main()` of this module, started by `fleet_measure`, which sends its
configuration as the first line of its stdin (never on the command line: the Redis URL may hold a
password).
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
import uuid
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from dispatcher._core._calls import CallStatus, ToolCall
from dispatcher._core._lifecycle import build_result as settled_result

from .._core._errors import FleetTuneError
from ._measure import summarise

if TYPE_CHECKING:
    from collections.abc import Sequence

    from anyio.abc import Process

    from dispatcher._core._calls import ToolResult

    from ._measure import SettingResult, Window

__all__ = ["check_redis", "fleet_measure", "shares"]

# Seconds a process may take to start and connect, beyond the connection timeout it is given.
_START_SLACK = 30.0
# The longest line a process sends (its results: a few dozen bytes a call).
_MAX_LINE = 256 * 1024 * 1024


def shares(total: int, processes: int) -> list[int]:
    """`total` split into `processes` near-equal whole shares (the first ones get the remainder)."""
    base, extra = divmod(total, processes)
    return [base + (1 if index < extra else 0) for index in range(processes)]


async def check_redis(url: str, socket_timeout: float) -> None:
    """Raise `FleetTuneError` unless the Redis at `url` answers PING.

    Raises:
        ConfigurationError: The `redis` package is not installed.
    """
    from dispatcher.fleet._links import safe_url
    from dispatcher.fleet._redis import RedisCoordinator

    RedisCoordinator(url, servers={})  # checks the URL and the extra
    import redis

    def ping() -> None:
        client = redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout)
        try:
            client.ping()
        finally:
            client.close()

    try:
        await anyio.to_thread.run_sync(ping)
    except (redis.RedisError, OSError) as exc:
        raise FleetTuneError(f"cannot reach Redis at {safe_url(url)}: {type(exc).__name__}: {exc}") from None


async def fleet_measure(
    url: str,
    workload: Sequence[ToolCall],
    *,
    redis: str,
    processes: int,
    limit: int,
    clients: int,
    warmup: int,
    calls: int | None,
    duration: float | None,
    trusted: bool,
    server: str,
    mode: str,
    call_timeout: float | None,
    connect_timeout: float | None,
    lease_ttl: float = 10.0,
    deadline: float = math.inf,
) -> SettingResult:
    """Measure one setting of the fleet-wide limit with `processes` processes sharing it through Redis.

    `deadline` (this loop's clock) is when the sweep's time budget runs out: the processes close their
    windows there, and the setting is `partial`.
    """
    # The processes run asyncio, whose clock is the host's monotonic one; this loop's may be another (trio's
    # has an offset), so the deadline travels as a moment on the host's clock.
    at = None if math.isinf(deadline) else time.monotonic() + (deadline - anyio.current_time())
    namespace = f"dispatcher-tune-{uuid.uuid4().hex[:12]}"  # a fleet of its own for each setting
    base = {
        "url": url,
        "redis": redis,
        "namespace": namespace,
        "server": server,
        "limit": limit,
        "trusted": trusted,
        "mode": mode,
        "call_timeout": call_timeout,
        "connect_timeout": connect_timeout,
        "lease_ttl": lease_ttl,
        "duration": duration,
        "deadline": at,
        "workload": [[call.name, call.arguments, call.server] for call in workload],
    }
    per_clients = shares(clients, processes)
    # Every process measures at least one call, so that each has a window of its own.
    per_calls = [max(1, n) for n in shares(calls, processes)] if calls is not None else [None] * processes
    per_warmup = [-(-warmup // processes)] * processes
    configs = [
        {**base, "clients": c, "calls": n, "warmup": w}
        for c, n, w in zip(per_clients, per_calls, per_warmup, strict=True)
        if c > 0
    ]
    started = (connect_timeout or 0.0) + _START_SLACK
    async with contextlib.AsyncExitStack() as stack:
        # Last out: whatever ended the sweep (a failed process, a cancellation), the setting's keys go.
        stack.push_async_callback(_forget, redis, namespace, server)
        running: list[tuple[Process, BufferedByteReceiveStream, Any]] = []
        stack.push_async_callback(_stop_all, running)
        for config in configs:
            log = stack.enter_context(tempfile.TemporaryFile("w+b"))
            process = await anyio.open_process(
                # Not `-m dispatcher.tuning._fleet`: `dispatcher.cli` imports this module, and runpy warns.
                [sys.executable, "-c", "from dispatcher.tuning._fleet import main; main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
            assert process.stdin is not None and process.stdout is not None
            # On stdin, not the command line: the Redis URL may hold a password, which `ps` would show.
            await process.stdin.send(json.dumps(config).encode() + b"\n")
            running.append((process, BufferedByteReceiveStream(process.stdout), log))
        with anyio.fail_after(started):
            for process, lines, log in running:
                await _expect(lines, b"READY", process, log)
        for process, _, _ in running:
            assert process.stdin is not None
            await process.stdin.send(b"GO\n")
        windows = []
        for process, lines, log in running:
            windows.append(json.loads(await _expect(lines, None, process, log)))
    return _merge(limit, windows)


async def _forget(url: str, namespace: str, server: str) -> None:
    """Delete what a setting's fleet left in Redis: its marker and counter, and after a process was killed
    or the sweep cancelled, its holds and queue too. The namespace is the setting's own."""
    import redis

    def delete() -> None:
        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            keys = [*client.scan_iter(match=f"{namespace}:*", count=1000)]
            keys += [f"{namespace}:server:{server}:{name}" for name in ("meta", "seq")]
            client.delete(*keys)
        finally:
            client.close()

    with anyio.CancelScope(shield=True), contextlib.suppress(redis.RedisError, OSError):
        await anyio.to_thread.run_sync(delete)


async def _expect(lines: BufferedByteReceiveStream, word: bytes | None, process: Process, log: Any) -> bytes:
    """The next line from a process (which must be `word`, if given); its stderr's tail if it ended instead."""
    try:
        line = await lines.receive_until(b"\n", _MAX_LINE)
    except (anyio.EndOfStream, anyio.IncompleteRead):
        line = b""
    if line and (word is None or line.strip() == word):
        return line
    await process.wait()
    log.seek(0)
    tail = log.read().decode("utf-8", "replace").strip().splitlines()[-5:]
    code = process.returncode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
    said = f": {'; '.join(tail)}" if tail else ""
    raise FleetTuneError(f"a process of the fleet failed ({how}){said}")


async def _stop_all(running: list[tuple[Process, BufferedByteReceiveStream, Any]]) -> None:
    with anyio.CancelScope(shield=True):
        for process, _, _ in running:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await process.wait()
            await process.aclose()


def _merge(limit: int, windows: list[dict[str, Any]]) -> SettingResult:
    """The fleet's figures: every process's calls, over the span when all of them were measuring."""
    results: list[ToolResult] = []
    abandoned = [(queued, began) for window in windows for queued, began in window["abandoned"]]
    for window in windows:
        for status, queued, started, finished, error in window["results"]:
            call = ToolCall(str(len(results)), "fleet", {})
            results.append(
                settled_result(
                    call, CallStatus(status), None, error, 1, None, None, queued, started, finished, (), False
                )
            )
    start = max(window["start"] for window in windows)
    stop = min(window["stop"] for window in windows)
    if stop <= start:
        # The processes' windows did not overlap (very short settings): take the span of them all.
        start, stop = min(window["start"] for window in windows), max(window["stop"] for window in windows)
    return summarise(
        limit,
        results,
        start,
        stop,
        inclusive=all(window["inclusive"] for window in windows),
        abandoned=abandoned,
        partial=any(window["partial"] for window in windows),
    )


# The process side ---------------------------------------------------------------------------------


async def _process(config: dict[str, Any]) -> None:
    from dispatcher._dispatcher import Dispatcher
    from dispatcher.fleet._config import FleetServer
    from dispatcher.fleet._redis import RedisCoordinator

    from ._connection import connected
    from ._measure import closed_loop

    server = config["server"]
    coordinator = RedisCoordinator(
        config["redis"],
        namespace=config["namespace"],
        servers={server: FleetServer(limit=config["limit"], share_retry_budget=False)},
        lease_ttl=config["lease_ttl"],
        recheck=min(1.0, config["lease_ttl"] / 2),
    )
    workload = [ToolCall(str(index), name, arguments, server=on) for index, (name, arguments, on) in enumerate(
        config["workload"]
    )]  # fmt: skip
    async with (
        connected(config["url"], mode=config["mode"], connect_timeout=config["connect_timeout"]) as client,
        coordinator,
        Dispatcher(max_concurrency=None, call_timeout=config["call_timeout"], retry=None, coordinator=coordinator) as d,
    ):
        await d.add_mcp_server(server, client, trusted=config["trusted"])
        print("READY", flush=True)
        if (await anyio.to_thread.run_sync(sys.stdin.readline)).strip() != "GO":
            return  # the sweep ended before this process was needed (its parent stopped, or died)
        window = await closed_loop(
            d,
            workload,
            clients=config["clients"],
            warmup=config["warmup"],
            calls=config["calls"],
            duration=config["duration"],
            report=None,
            deadline=math.inf if config["deadline"] is None else config["deadline"],
        )
        if window.partial:
            # The budget ran out, and closing up gets a few seconds at most: the figures go before closing.
            _send(window)
    if not window.partial:
        # After closing: the parent stops this process once it has the figures, and the server's session
        # and the fleet's holds are released first.
        _send(window)


def _send(window: Window) -> None:
    rows = [[r.status.value, r.queued_at, r.started_at, r.finished_at, r.error] for r in window.results]
    line = {
        "results": rows,
        "start": window.start,
        "stop": window.stop,
        "inclusive": window.inclusive,
        "abandoned": [list(pair) for pair in window.abandoned],
        "partial": window.partial,
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def main() -> None:
    """Run one process of a fleet sweep, configured by stdin's first line (asyncio: one clock with the others)."""
    anyio.run(_process, json.loads(sys.stdin.readline()))


if __name__ == "__main__":
    main()
