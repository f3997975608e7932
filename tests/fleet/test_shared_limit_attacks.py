"""The shared limit against a hostile writer of its hash and odd Retry-After values, on a real redis-server.

The faults suite (test_shared_limit_faults.py) checks what is read from the `limit` hash; this one checks the
one entry the fleet follows on purpose, the `bounds` written first: a writer that gets there first (or
rewrites them later) may narrow the fleet, never take a process past its own configured ceiling.
In-process dispatchers run on both anyio backends, on the real clock: assertions are bands and orders.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest
import redis

from dispatcher import AdaptiveLimit, Dispatcher
from dispatcher.fleet._lua import LIMIT, MAX_PAUSE_MS
from dispatcher.fleet._shared import SharedLimit
from tests.fleet.test_shared_limit import Service, calls, fleet_of, level

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable

    from benchmarks._redis import RedisServer
    from dispatcher.fleet._links import Link

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

HUGE = "1:1000000000:1000000000"


def client_of(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, decode_responses=True)


def key_of(namespace: str) -> str:
    return f"{namespace}:server:svc:limit"


@pytest.mark.parametrize("when", ["first", "between"])
async def test_hostile_bounds_never_take_a_process_past_its_own_ceiling(
    redis_server: RedisServer, namespace: str, when: str
) -> None:
    """Bounds 1:1e9:1e9 and level 1e9 written before the fleet starts, or between its moves: at most 6 run at once."""
    service = Service(delay=0.1)
    setting = AdaptiveLimit(floor=2, initial=4, ceiling=6, tolerance=3.0)
    client = client_of(redis_server)
    try:
        if when == "first":
            client.hset(key_of(namespace), mapping={"bounds": HUGE, "level": "1000000000", "epoch": "0"})
        async with AsyncExitStack() as stack:
            a, b = await fleet_of(stack, redis_server, namespace, service, setting)
            if when == "between":
                client.hset(key_of(namespace), mapping={"bounds": HUGE, "level": "1000000000", "epoch": "0"})
            service.peak = 0
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.dispatch, calls(20, "a"))
                tg.start_soon(b.dispatch, calls(20, "b"))
            assert 1 <= service.peak <= 6, f"{service.peak} calls ran at once; every process's ceiling is 6"
            for dispatcher in (a, b):
                assert 1 <= (dispatcher.server_limit("svc") or 0) <= 6
    finally:
        client.close()


def test_hostile_bounds_narrow_the_python_side_only_within_its_own() -> None:
    """A reply showing bounds 1e9:1e9:1e9: the process's limit stays at its own ceiling (6), a conflict recorded."""
    shared = SharedLimit("k", AdaptiveLimit(floor=2, initial=4, ceiling=6), None, lambda: None)
    shared.seen([1, "1", "0", 1, "1000000000.000000", "0", "0", "1000000000:1000000000:1000000000"])
    assert shared.limit == 6
    assert shared.conflict is not None
    # The oracle: narrower bounds are followed as they are.
    shared.seen([1, "1", "0", 1, "3.000000", "0", "0", "1:3:2"])
    assert shared.limit == 3


async def grow_past_knee(dispatcher: Dispatcher, service: Service, limit: Callable[[], float]) -> float:
    """Cut to a knee of 4 by one rate-limited answer, then unloaded bursts for up to 15 s: the level reached."""
    service.overloaded = True
    await dispatcher.dispatch(calls(1, "cut"))
    service.overloaded = False
    with anyio.move_on_after(15):
        burst = 0
        while limit() <= 4:
            burst += 1
            await dispatcher.dispatch(calls(12, f"b{burst}-"))
    return limit()


async def test_a_single_process_sharing_its_limit_probes_past_a_knee_as_a_local_limit_does(
    redis_server: RedisServer, namespace: str
) -> None:
    """One process alone with share_limit: after a cut to 4 a probe goes out and the level grows, as without a fleet."""
    setting = AdaptiveLimit(initial=8, ceiling=16, tolerance=3.0)
    # The oracle: the same process without a fleet grows past its knee.
    service = Service(delay=0.05)
    async with Dispatcher(max_concurrency=None, retry=None) as alone:
        await alone.connect("svc", service.server, trusted=True, max_concurrency=setting)
        await alone.dispatch(calls(1, "warm-up"))
        assert await grow_past_knee(alone, service, lambda: float(alone.server_limit("svc") or 0)) > 4
    service = Service(delay=0.05)
    async with AsyncExitStack() as stack:
        [one] = await fleet_of(stack, redis_server, namespace, service, setting, processes=1)
        assert await grow_past_knee(one, service, lambda: level(redis_server, namespace)[0]) > 4


def test_a_pause_is_not_stretched_by_redis_clock_going_back(redis_server: RedisServer) -> None:
    """A 30 s pause set "2 h from now" (Redis' clock stepped back 2 h since): over, not an hour's pause."""
    client = client_of(redis_server)
    try:
        script = client.register_script(LIMIT)
        # The oracle: a pause set now is kept, and one written by hand without `pause_at` still counts.
        assert 29_000 <= script(keys=["t:limit"], args=[2, 10, 8, "pause", 0, "30.0"])[3] <= 30_000
        seconds, micros = client.time()
        now = seconds * 1000 + micros // 1000
        client.hdel("t:limit", "pause_at")
        client.hset("t:limit", "pause_until", str(now + 7_200_000 + 30_000))
        assert script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[3] == MAX_PAUSE_MS
        # Set at a time later than Redis' clock now: the clock went back, the pause is over.
        client.hset("t:limit", mapping={"pause_at": str(now + 7_200_000), "pause_until": str(now + 7_230_000)})
        assert script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[3] == 0
        # A new pause after the step starts from Redis' clock now, and is kept.
        assert 4_000 <= script(keys=["t:limit"], args=[2, 10, 8, "pause", 0, "5.0"])[3] <= 5_000
        assert 3_000 <= script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[3] <= 5_000
    finally:
        client.close()


class Recording:
    """A link that records the moves sent to the limit script and answers as the script would."""

    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    async def run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        self.sent.append(args)
        return ["4.000000", 0, 1, 0, "2:6:4"]


async def test_a_pause_sent_late_asks_only_for_what_is_left_of_it() -> None:
    """A 2 s pause that waits 0.5 s behind a slow Redis asks for about 1.5 s; one that ran out is not sent."""
    shared = SharedLimit("k", AdaptiveLimit(floor=2, initial=4, ceiling=6), None, lambda: None)
    link = Recording()
    await shared.flush(cast("Link", link))  # the first read
    link.sent.clear()
    shared.move(None, "pause", 0, 2.0)
    await anyio.sleep(0.5)
    await shared.flush(cast("Link", link))
    [args] = link.sent
    assert args[3] == "pause" and 0.3 <= float(args[5]) <= 1.5 + 1e-6
    # The oracle's other side: a pause that ran out while it waited asks for nothing.
    link.sent.clear()
    shared.move(None, "pause", 0, 0.1)
    await anyio.sleep(0.3)
    await shared.flush(cast("Link", link))
    assert link.sent == []


@pytest.mark.subprocess
def test_real_processes_under_hostile_bounds_stay_within_their_own_ceiling(
    tmp_path: pathlib.Path, redis_server: RedisServer, namespace: str, workspace: tuple[str, pathlib.Path]
) -> None:
    """Bounds 1:1e9:1e9 written before two real processes (ceiling 4, one each backend) start: never above 4."""
    from tests.fleet.test_processes import read_ledger, spawn, wait_all

    mcp, ledger = workspace
    client = client_of(redis_server)
    try:
        client.hset(f"{namespace}:server:ws:limit", mapping={"bounds": HUGE, "level": "1000000000", "epoch": "0"})
    finally:
        client.close()
    processes = [
        spawn({
            "redis": redis_server.url, "namespace": namespace, "mcp": mcp, "mode": "reads", "agents": 6,
            "rounds": 5, "adaptive": [1, 4, 2], "ttl": 1.0, "recheck": 0.2, "backend": backend,
            "name": f"p{index}", "out": str(tmp_path / f"results-{index}.json"),
        })
        for index, backend in enumerate(("asyncio", "trio"))
    ]  # fmt: skip
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == b"READY"
        wait_all(processes, timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
    seen = read_ledger(ledger)
    assert 1 <= seen.peak <= 4, f"{seen.peak} calls ran at once; each process's ceiling is 4"


@pytest.mark.parametrize("bounds", [HUGE, "1000:1000000000:1000"])
def test_hostile_bounds_do_not_hold_a_cut_up(redis_server: RedisServer, bounds: str) -> None:
    """Level 1e9 under bounds 1:1e9:1e9, or a floor of 1000: a caller's cut (2..6, by half) takes it to 3."""
    client = client_of(redis_server)
    try:
        client.hset("t:limit", mapping={"bounds": bounds, "level": "1000000000", "epoch": "0"})
        reply = client.register_script(LIMIT)(keys=["t:limit"], args=[2, 6, 4, "cut", 0, "0.5"])
        assert reply[2] == 1 and float(reply[0]) == 3.0 and reply[4] == bounds
    finally:
        client.close()


def test_a_hostile_floor_above_a_processs_own_does_not_pin_its_controller() -> None:
    """A reply showing bounds 1000:1e9:1000 to a process configured 2..6: its controller keeps floor 2."""
    shared = SharedLimit("k", AdaptiveLimit(floor=2, initial=4, ceiling=6), None, lambda: None)
    shared.seen([1, "1", "0", 1, "3.000000", "0", "0", "1000:1000000000:1000"])
    assert shared.within == (2, 6) and shared.limit == 3


def test_bounds_flipped_back_and_forth_log_each_conflict_once(caplog: pytest.LogCaptureFixture) -> None:
    """Replies alternating bounds 2:6:4 and 1:3:2 twenty times: two warnings, not one per reply."""
    shared = SharedLimit("k", AdaptiveLimit(floor=1, initial=16, ceiling=32), None, lambda: None)
    with caplog.at_level(logging.WARNING, logger="dispatcher"):
        for index in range(20):
            bounds = ("2:6:4", "1:3:2")[index % 2]
            shared.seen([1, "1", "0", 1, "3.000000", "0", "0", bounds])
            assert shared.conflict is not None and shared.conflict.endswith(f"{bounds} in the fleet")
    assert len([record for record in caplog.records if "other bounds" in record.getMessage()]) == 2
