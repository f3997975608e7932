"""The shared limit under hostile or odd state: garbage in Redis, other bounds, pauses, lost holds, a FLUSHALL.

What the shared limit trusts (docs/fleet.md, "What the shared limit trusts"): its own scripts' arithmetic,
never a value found in the `limit` hash or sent as a move. Each test writes the odd state into a real
redis-server (tests/fleet/conftest.py) or makes a process odd (a frozen event loop), and checks that the
level stays within floor..ceiling and that nothing moves it that should not. In-process dispatchers run on
both anyio backends, on the real clock: assertions are bands and orders.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import anyio
import pytest
import redis
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from dispatcher import AdaptiveLimit, CallStatus, ConfigurationError, Dispatcher, ToolCall
from dispatcher.fleet import FleetServer
from dispatcher.fleet._lua import LIMIT, MAX_PAUSE_MS
from tests.fleet.test_shared_limit import Service, calls, coordinator, fleet_of, level, until

if TYPE_CHECKING:
    import pathlib
    import subprocess

    from benchmarks._redis import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


def client_of(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, decode_responses=True)


def key_of(namespace: str) -> str:
    return f"{namespace}:server:svc:limit"


def bounds_in(server: RedisServer, namespace: str) -> str | None:
    client = client_of(server)
    try:
        found = client.hget(key_of(namespace), "bounds")
    finally:
        client.close()
    return None if found is None else str(found)


def pause_left(server: RedisServer, namespace: str) -> float | None:
    """Milliseconds left of the fleet's pause by Redis' clock, or None when the hash holds none."""
    client = client_of(server)
    try:
        until_ms = client.hget(key_of(namespace), "pause_until")
        seconds, micros = client.time()
    finally:
        client.close()
    return None if until_ms is None else float(until_ms) - (seconds * 1000 + micros // 1000)


class Service2(Service):
    """`Service` whose overload words are `message`, and whose key ``"freeze"`` blocks its event loop."""

    def __init__(self, delay: float = 0.05, message: str = "429 Too Many Requests: rate limit exceeded") -> None:
        super().__init__(delay)
        self.message = message
        self.ran: list[str] = []

        @self.server.tool(annotations=ToolAnnotations(read_only_hint=True))
        async def fetch(key: str) -> str:
            """Fetches a key."""
            self.ran.append(key)
            if key == "freeze":
                # The process stops (a GC pause, SIGSTOP, a swapped-out VM): no task of its loop runs,
                # neither the renewals nor the watch of the leases.
                time.sleep(1.2)  # noqa: ASYNC251  # the point: the whole loop stops
                raise ToolError(self.message)
            await anyio.sleep(self.delay)
            if self.overloaded:
                raise ToolError(self.message)
            return key


# The LIMIT script on its own --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "shown"),
    [("nan", 8.0), ("-nan", 8.0), ("inf", 8.0), ("-inf", 8.0), ("1e400", 8.0), ("junk", 8.0), ("", 8.0),
     ("0x10", 10.0), ("999", 10.0), ("-5", 2.0), ("0", 2.0), ("3.5", 3.5)],
)  # fmt: skip
def test_a_level_that_is_not_a_finite_number_reads_as_the_initial_and_any_other_stays_in_bounds(
    redis_server: RedisServer, stored: str, shown: float
) -> None:
    """LIMIT reads NaN, infinities and junk as the initial level (8), and clamps any number into floor..ceiling."""
    client = client_of(redis_server)
    try:
        client.hset("t:limit", mapping={"level": stored, "epoch": "0"})
        script = client.register_script(LIMIT)
        reply = script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])
        assert float(reply[0]) == shown and int(reply[1]) == 0
        assert float(client.hget("t:limit", "level") or "nan") == shown  # written back sane
    finally:
        client.close()


def test_garbage_moves_and_epochs_move_nothing(redis_server: RedisServer) -> None:
    """Cuts and growths by NaN, infinities or junk are not applied; an epoch that is not a whole number reads 0."""
    client = client_of(redis_server)
    try:
        script = client.register_script(LIMIT)

        def run(op: str, epoch: int | str, value: str) -> tuple[float, int, int]:
            reply = script(keys=["t:limit"], args=[2, 10, 8, op, epoch, value])
            return float(reply[0]), int(reply[1]), int(reply[2])

        for value in ("nan", "inf", "-inf", "junk", "1e400", "-1"):
            assert run("grow", 0, value) == (8.0, 0, 0), value
            assert run("cut", 0, value) == (8.0, 0, 0), value
            assert run("pause", 0, value)[2] == 0, value
        for epoch in ("nan", "inf", "junk"):
            assert run("cut", epoch, "0.5") == (8.0, 0, 0), epoch
        assert run("frobnicate", 0, "0.5") == (8.0, 0, 0)
        for stored in ("nan", "inf", "-3", "1.5", "1e300", "junk"):
            client.hset("t:limit", "epoch", stored)
            assert run("read", -1, "0.0")[1] == 0, stored
        # The oracle: a sane cut under the epoch read is applied.
        assert run("cut", 0, "0.5") == (4.0, 1, 1)
    finally:
        client.close()


def test_a_key_of_another_type_is_replaced_not_an_error(redis_server: RedisServer) -> None:
    """A string (or list) where the limit hash should be: LIMIT starts again from the initial level."""
    client = client_of(redis_server)
    try:
        script = client.register_script(LIMIT)
        client.set("t:limit", "garbage")
        assert script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[:3] == ["8.000000", 0, 0]
        assert client.type("t:limit") == "hash"
        client.delete("t:limit")
        client.rpush("t:limit", "x")
        assert script(keys=["t:limit"], args=[2, 10, 8, "grow", 0, "1.0"])[:3] == ["9.000000", 0, 1]
    finally:
        client.close()


def test_the_first_bounds_win_and_invalid_ones_are_replaced(redis_server: RedisServer) -> None:
    """The bounds written first clamp every later caller's level; bounds that make no sense are overwritten."""
    client = client_of(redis_server)
    try:
        script = client.register_script(LIMIT)
        assert script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[4] == "2:10:8"
        # Another process's wider bounds: the fleet's (2..10) still hold its growth.
        reply = script(keys=["t:limit"], args=[1, 100, 50, "grow", 0, "500.0"])
        assert float(reply[0]) == 10.0 and reply[4] == "2:10:8"
        for junk in ("5:1:3", "0:4:2", "nan:inf:1", "1:2", "a:b:c", "1:99999999999:2"):
            client.hset("t:limit", "bounds", junk)
            reply = script(keys=["t:limit"], args=[1, 6, 3, "read", -1, "0.0"])
            assert reply[4] == "1:6:3" and 1.0 <= float(reply[0]) <= 6.0, junk
    finally:
        client.close()


def test_a_pause_is_capped_at_an_hour_and_what_is_left_is_returned(redis_server: RedisServer) -> None:
    """A pause's milliseconds left come back in every reply, never more than an hour, and a longer one wins."""
    client = client_of(redis_server)
    try:
        script = client.register_script(LIMIT)
        reply = script(keys=["t:limit"], args=[2, 10, 8, "pause", 0, "2.0"])
        assert reply[2] == 1 and 1900 <= reply[3] <= 2000
        assert 1800 <= script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[3] <= 2000
        assert script(keys=["t:limit"], args=[2, 10, 8, "pause", 0, "0.5"])[3] > 1000  # a shorter one: kept
        assert script(keys=["t:limit"], args=[2, 10, 8, "pause", 0, "1e9"])[3] == MAX_PAUSE_MS
        # A pause written into the hash by hand, beyond an hour, or not a time at all.
        client.hset("t:limit", "pause_until", "1e300")
        assert script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[3] == MAX_PAUSE_MS
        for junk in ("nan", "inf", "junk", "-5"):
            client.hset("t:limit", "pause_until", junk)
            assert script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[3] == 0, junk
        # A pause moves no level.
        assert float(script(keys=["t:limit"], args=[2, 10, 8, "read", -1, "0.0"])[0]) == 8.0
    finally:
        client.close()


def test_max_call_time_is_accepted_under_share_limit_without_a_limit() -> None:
    """FleetServer(max_call_time=...) needs limit= or share_limit=True (the default); with neither it is refused."""
    assert FleetServer(max_call_time=5.0).call_bound == 5.0
    assert FleetServer(limit=4, share_limit=False, max_call_time=5.0).call_bound == 5.0
    with pytest.raises(ConfigurationError, match="share_limit=True"):
        FleetServer(share_limit=False, max_call_time=5.0)


class _Follower:
    """Records what a `SharedLimit` tells it."""

    probing = False

    def __init__(self) -> None:
        self.seen: list[tuple[float, int, float]] = []

    def follow_fleet(self, level: float, epoch: int, source: object, pause: float) -> None:
        self.seen.append((level, epoch, pause))


@pytest.mark.parametrize(
    "reply",
    [[1, "1", "e", 1, "nan", "3", "0", "2:6:4"], [1, "1", "e", 1, "inf", "3", "0", "2:6:4"],
     [1, "1", "e", 1, "1e9", "3", "1e300", "2:6:4"], [1, "1", "e", 1, "-7", "3", "-5", "junk"],
     [1, "1", "e", 1, "5", "nan", "0", "2:6:4"], [1, "1", "e", 1, "5", "3"], [1, "1", "e", 1, "", "", "", ""]],
)  # fmt: skip
def test_the_python_side_reads_a_reply_as_the_scripts_read_the_hash(reply: list[object]) -> None:
    """A grant's reply with garbage in it: whatever is followed stays in 2..6, a pause at most an hour."""
    from dispatcher.fleet._shared import SharedLimit

    shared = SharedLimit("k", AdaptiveLimit(floor=2, initial=4, ceiling=6), None, lambda: None)
    follower = _Follower()
    shared.follow(follower)
    shared.seen(reply)
    assert 2 <= shared.limit <= 6 and 2.0 <= shared.level <= 6.0
    for shown, epoch, pause in follower.seen:
        assert 2.0 <= shown <= 6.0 and epoch >= 0 and 0 <= pause <= MAX_PAUSE_MS / 1000
    assert shared.conflict is None


def test_the_python_side_follows_the_fleets_bounds_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A reply showing bounds 2:6:4 to a process configured 1:32:16: a warning, `conflict`, the level clamped."""
    from dispatcher.fleet._shared import SharedLimit

    shared = SharedLimit("k", AdaptiveLimit(floor=1, initial=16, ceiling=32), None, lambda: None)
    with caplog.at_level(logging.WARNING, logger="dispatcher"):
        shared.seen([1, "1", "e", 1, "30.000000", "0", "0", "2:6:4"])
    assert shared.bounds == (2, 6, 4) and shared.limit == 6
    assert shared.conflict == "floor:ceiling:initial 1:32:16 here, 2:6:4 in the fleet"
    assert len([record for record in caplog.records if "other bounds" in record.getMessage()]) == 1
    # The oracle: the same process's own bounds shown back are no conflict.
    alike = SharedLimit("k", AdaptiveLimit(floor=1, initial=16, ceiling=32), None, lambda: None)
    alike.seen([1, "1", "e", 1, "30.000000", "0", "0", "1:32:16"])
    assert alike.conflict is None and alike.limit == 30


# Processes --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stored", ["inf", "1e9", "nan", "junk"])
async def test_a_hostile_level_in_redis_admits_no_more_than_the_ceiling(
    redis_server: RedisServer, namespace: str, stored: str
) -> None:
    """A level of inf, 1e9, NaN or junk written into the hash: the fleet still admits at most its ceiling (6)."""
    service = Service(delay=0.1)
    setting = AdaptiveLimit(floor=2, initial=4, ceiling=6, tolerance=3.0)
    async with AsyncExitStack() as stack:
        a, b = await fleet_of(stack, redis_server, namespace, service, setting)
        client = client_of(redis_server)
        try:
            client.hset(key_of(namespace), mapping={"level": stored, "epoch": stored})
        finally:
            client.close()
        service.peak = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.dispatch, calls(12, "a"))
            tg.start_soon(b.dispatch, calls(12, "b"))
        assert 1 <= service.peak <= 6
        for dispatcher in (a, b):
            assert 2 <= (dispatcher.server_limit("svc") or 0) <= 6
        fleet_level, epoch = level(redis_server, namespace)
        assert 2.0 <= fleet_level <= 6.0
        assert epoch == (1_000_000_000 if stored == "1e9" else 0)  # a whole number in range is an epoch


async def test_a_second_process_with_other_bounds_is_warned_and_follows_the_fleets(
    redis_server: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """B configured floor 1, ceiling 32 where A (first) set 2..6: B warns, records the conflict, never passes 6."""
    service = Service(delay=0.05)
    first = AdaptiveLimit(floor=2, initial=4, ceiling=6, tolerance=3.0)
    other = AdaptiveLimit(floor=1, initial=16, ceiling=32, tolerance=3.0)
    async with AsyncExitStack() as stack:
        fleet_a = await stack.enter_async_context(coordinator(redis_server, namespace))
        fleet_b = await stack.enter_async_context(coordinator(redis_server, namespace))
        a = await stack.enter_async_context(Dispatcher(coordinator=fleet_a, max_concurrency=None, retry=None))
        await a.connect("svc", service.server, trusted=True, max_concurrency=first)
        await until(lambda: bounds_in(redis_server, namespace) == "2:6:4", "A wrote the fleet's bounds")
        shared_a, shared_b = fleet_a.shared_limit("svc", first), fleet_b.shared_limit("svc", other)
        assert shared_a is not None and shared_b is not None
        with caplog.at_level(logging.WARNING, logger="dispatcher"):
            b = await stack.enter_async_context(Dispatcher(coordinator=fleet_b, max_concurrency=None, retry=None))
            await b.connect("svc", service.server, trusted=True, max_concurrency=other)
            await until(lambda: shared_b.conflict is not None, "B saw the fleet's bounds")
        assert shared_a.conflict is None
        assert shared_b.bounds == (2, 6, 4)
        assert shared_b.conflict == "floor:ceiling:initial 1:32:16 here, 2:6:4 in the fleet"
        assert any("other bounds" in record.getMessage() for record in caplog.records)
        assert b.server_limit("svc") == 4  # the fleet's level, not B's initial 16
        service.peak = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.dispatch, calls(30, "a"))
            tg.start_soon(b.dispatch, calls(30, "b"))
        assert service.peak <= 6
        assert level(redis_server, namespace)[0] <= 6.0
        assert (b.server_limit("svc") or 0) <= 6


async def test_a_trusted_retry_after_pauses_the_whole_fleet(redis_server: RedisServer, namespace: str) -> None:
    """A's server says "retry after 1.5 s": the pause is in the hash, and B's next call waits it out."""
    service = Service2(delay=0.05, message="429 Too Many Requests: rate limit exceeded, retry after 1.5 s")
    setting = AdaptiveLimit(initial=4, ceiling=8, tolerance=3.0, max_wait=10.0)
    async with AsyncExitStack() as stack:
        a, b = await fleet_of(stack, redis_server, namespace, service, setting)
        service.overloaded = True
        [result] = await a.dispatch([_fetch("a", "k")])
        assert result.status is CallStatus.TOOL_ERROR
        service.overloaded = False
        await until(lambda: pause_left(redis_server, namespace) is not None, "the pause reached Redis")
        left = pause_left(redis_server, namespace) or 0.0
        assert 0 < left <= 1500
        started = anyio.current_time()
        [result] = await b.dispatch(calls(1, "b"))
        waited = anyio.current_time() - started
        assert result.ok
        # B waited for what was left of the pause (the band allows a loaded machine's delays).
        assert waited >= left / 1000 - 0.3, (waited, left)


async def test_a_retry_after_is_capped_at_the_calls_max_wait(redis_server: RedisServer, namespace: str) -> None:
    """A server asking for an hour's pause from a process whose max_wait is 1 s pauses the fleet 1 s at most."""
    service = Service2(delay=0.05, message="rate limit exceeded: retry after 3600 s")
    setting = AdaptiveLimit(initial=4, ceiling=8, tolerance=3.0, max_wait=1.0)
    async with AsyncExitStack() as stack:
        a, b = await fleet_of(stack, redis_server, namespace, service, setting)
        service.overloaded = True
        await a.dispatch([_fetch("a", "k")])
        service.overloaded = False
        await until(lambda: pause_left(redis_server, namespace) is not None, "the pause reached Redis")
        left = pause_left(redis_server, namespace) or 0.0
        assert left <= 1000
        started = anyio.current_time()
        [result] = await b.dispatch(calls(1, "b"))
        assert result.ok and anyio.current_time() - started < 5.0


async def test_an_untrusted_servers_retry_after_pauses_nothing(redis_server: RedisServer, namespace: str) -> None:
    """The same "retry after 30 s" from an untrusted server: no pause in the hash, B's calls do not wait."""
    service = Service2(delay=0.05, message="429 Too Many Requests: rate limit exceeded, retry after 30 s")
    setting = AdaptiveLimit(initial=4, ceiling=4, tolerance=3.0, max_wait=60.0)
    async with AsyncExitStack() as stack:
        a, b = await fleet_of(stack, redis_server, namespace, service, setting, trusted=False)
        service.overloaded = True
        await a.dispatch([_fetch(f"a{i}", "k") for i in range(4)])
        started = anyio.current_time()
        await b.dispatch([_fetch(f"b{i}", "k") for i in range(4)])
        assert anyio.current_time() - started < 10.0  # well short of the 30 s asked for
        assert pause_left(redis_server, namespace) is None
        assert level(redis_server, namespace) == (4.0, 0)


@pytest.mark.parametrize("max_call_time", [None, 5.0])
async def test_a_call_whose_lease_ran_out_moves_no_limit(
    redis_server: RedisServer, namespace: str, max_call_time: float | None
) -> None:
    """A frozen past its lease while its call runs, then told "rate limit": no cut; the same within its lease cuts.

    With a max_call_time Redis still has the hold when the process wakes, and a renewal may come first:
    it does not revive a lease that ran out here.
    """
    service = Service2(delay=0.05)
    setting = AdaptiveLimit(initial=8, ceiling=8, tolerance=3.0)
    config = FleetServer(max_call_time=max_call_time)
    async with AsyncExitStack() as stack:
        a, _ = await fleet_of(stack, redis_server, namespace, service, setting, config=config)
        await a.dispatch([_fetch("frozen", "freeze")])
        assert "freeze" in service.ran  # it ran, and answered an overload after its lease had run out
        await anyio.sleep(0.3)  # any move it queued would have been sent by now
        assert level(redis_server, namespace) == (8.0, 0)
        assert a.server_limit("svc") == 8
        # The oracle: the same overload within its lease cuts the fleet's level.
        service.overloaded = True
        await a.dispatch([_fetch("live", "k")])
        await until(lambda: level(redis_server, namespace) == (4.0, 1), "an overload within its lease cuts")


async def test_after_a_flushall_the_fleet_starts_again_from_the_initial_level(
    redis_server: RedisServer, namespace: str
) -> None:
    """Cut to 4 (epoch 1), then FLUSHALL: the fleet reads initial 8 and epoch 0, both follow, and can cut again."""
    service = Service(delay=0.05)
    setting = AdaptiveLimit(initial=8, ceiling=16, tolerance=3.0)
    async with AsyncExitStack() as stack:
        a, b = await fleet_of(stack, redis_server, namespace, service, setting)
        service.overloaded = True
        await a.dispatch(calls(1, "a"))
        await until(lambda: level(redis_server, namespace) == (4.0, 1), "cut to 4 under epoch 1")
        await until(lambda: b.server_limit("svc") == 4, "B follows the cut")
        service.overloaded = False
        client = client_of(redis_server)
        try:
            client.flushall()
        finally:
            client.close()
        # Calls after the namespace's quiet period: a grant's reply, or the idle read, shows the new state.
        results = await b.dispatch(calls(2, "b"))
        assert all(result.ok for result in results)
        await until(lambda: level(redis_server, namespace)[1] == 0, "the hash is written again")
        await until(lambda: a.server_limit("svc") == b.server_limit("svc"), "both follow the fleet again", 5.0)
        fleet_level, epoch = level(redis_server, namespace)
        assert epoch == 0 and 8.0 <= fleet_level <= 16.0  # the initial, grown by B's answers at most
        # Moves under the new epoch 0 apply: a cut from either process is the fleet's first again.
        service.overloaded = True
        await a.dispatch(calls(1, "a2-"))
        await until(lambda: level(redis_server, namespace)[1] == 1, "a cut under the new epoch")
        assert level(redis_server, namespace)[0] <= fleet_level / 2 + 1


def _fetch(call_id: str, key: str) -> ToolCall:
    return ToolCall(call_id, "fetch", {"key": key})


# Real processes ---------------------------------------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.parametrize(("fault", "backend"), [("kill", "asyncio"), ("stop", "trio")])
def test_a_process_killed_or_stopped_holding_slots_leaves_the_others_carrying_on(
    tmp_path: pathlib.Path,
    redis_server: RedisServer,
    namespace: str,
    workspace: tuple[str, pathlib.Path],
    fault: str,
    backend: str,
) -> None:
    """P0 SIGKILLed or SIGSTOPped holding slots of the shared level: P1 and P2 get every call done, never above 4."""
    from tests.fleet.test_processes import read_ledger, spawn, wait_all

    mcp, ledger = workspace
    ceiling = 4

    def config(index: int, rounds: int) -> dict[str, object]:
        return {
            "redis": redis_server.url, "namespace": namespace, "mcp": mcp, "mode": "reads", "agents": 4,
            "rounds": rounds, "adaptive": [1, ceiling, 2], "max_call_time": 0.5, "ttl": 1.0, "recheck": 0.2,
            "backend": ("asyncio", "trio")[index % 2] if index else backend, "name": f"p{index}",
            "out": str(tmp_path / f"results-{index}.json"),
        }  # fmt: skip

    client = client_of(redis_server)
    victim = spawn(config(0, 30))
    others: list[subprocess.Popen[bytes]] = []
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == b"READY"
        holders = f"{namespace}:server:ws:holders"
        deadline = time.monotonic() + 20
        while client.hlen(holders) == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        victim.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        held = client.hlen(holders)
        assert held >= 1, "the victim held no slot when it was stopped"
        stopped = time.monotonic()
        others = [spawn(config(index, 10)) for index in (1, 2)]
        wait_all(others, timeout=60)
        carried_on = time.monotonic() - stopped
        if fault == "stop":
            victim.send_signal(signal.SIGCONT)
            # It wakes to find its holds gone, finishes its rounds and exits; every call has its result.
            assert victim.wait(60) == 0
            with open(tmp_path / "results-0.json") as file:
                assert len(json.load(file)) == 4 * 30 * 2
        results = []
        for index in (1, 2):
            with open(tmp_path / f"results-{index}.json") as file:
                results.extend(json.load(file))
        assert len(results) == 2 * 4 * 10 * 2
        assert all(result["status"] == "ok" for result in results), [r for r in results if r["status"] != "ok"][:3]
        # The victim's slots came free within its lease and max_call_time: P1 and P2 finished while it was
        # still dead or stopped. The band is wait_all's: their start (two interpreters importing the SDK)
        # takes most of it on a loaded machine (35 s seen at load 10 on 2 cores).
        assert carried_on < 60.0
        seen = read_ledger(ledger)
        assert seen.peak <= ceiling, f"{seen.peak} calls ran at once; the fleet's ceiling is {ceiling}"
        fleet_level, epoch = level_of(redis_server, namespace)
        assert 1.0 <= fleet_level <= ceiling and epoch >= 0
    finally:
        client.close()
        for process in (victim, *others):
            if process.poll() is None:
                if fault == "stop":
                    process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


def level_of(server: RedisServer, namespace: str) -> tuple[float, int]:
    client = client_of(server)
    try:
        found = client.hmget(f"{namespace}:server:ws:limit", ["level", "epoch"])
    finally:
        client.close()
    return float(found[0] or "nan"), int(found[1] or "0")
