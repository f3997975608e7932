"""Times in Redis set further ahead than any fleet process could set them are junk: lost state, never an outage.

A hostile or broken process writes a quiet period (`meta.quiet_until`) or a hold's expiry (`holders_exp`)
far in the future but finite (1e300, ten years from now) or infinite: before, the first held every grant
back and the second kept a dead hold in force for as long as the value stayed. Past the horizon (the longest
`lease_ttl` plus the longest `max_write_time` / `max_call_time` a process may be configured with) such a value
reads as lost state: a bounded quiet period and a new epoch. Within the horizon a value is a legitimate one,
so a fleet whose processes run different `lease_ttl` values keeps the long-ttl process's holds and quiet
periods. Each test runs on asyncio and trio, on the real clock: assertions are bands and orders.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import pytest
import redis

from dispatcher import ConfigurationError
from dispatcher.fleet import FleetServer, RedisCoordinator
from dispatcher.fleet._lua import ACQUIRE, HORIZON_MS, MAX_LEASE_TTL, MAX_OVERRUN

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

TTL = 1.2  # renewed every ttl/3: a loaded machine stalls a loop for most of a second
LONG = 4.0  # the long-ttl process of a mixed fleet
FENCED = {"ws": FleetServer(shared_state=True, fence_meta="example.com/fence")}
RESUMED = 12.0  # the most service may take to resume after the junk: one quiet period (TTL) and a loaded machine
YEAR_MS = 365 * 86_400_000


def fleet(server: RedisServer, namespace: str, lease_ttl: float = TTL) -> RedisCoordinator:
    return RedisCoordinator(server.url, namespace=namespace, servers=FENCED, lease_ttl=lease_ttl, recheck=0.1)


def never_lost(reason: str) -> None:
    raise AssertionError(f"a hold was lost: {reason}")


def key(namespace: str, name: str) -> str:
    return f"{namespace}:server:ws:{name}"


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def far(client: redis.Redis, value: str) -> str:
    """A time as a hostile writer sets it: as is, or ``+10y`` / ``+horizon`` from Redis' clock now."""
    if value == "+10y":
        return str(redis_ms(client) + 10 * YEAR_MS)
    if value == "+horizon":  # one minute past the furthest a legitimate writer reaches
        return str(redis_ms(client) + HORIZON_MS + 60_000)
    return value


@pytest.mark.parametrize("value", ["1e300", "+10y", "+horizon", "inf"])
async def test_a_quiet_period_set_beyond_the_horizon_is_lost_state_not_an_outage(
    redis_server: RedisServer, namespace: str, value: str
) -> None:
    """A `quiet_until` past the horizon: writes of two processes are granted again within one quiet period."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    first, second = fleet(redis_server, namespace), fleet(redis_server, namespace)
    inside: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    granted: list[float] = []

    async def write(coordinator: RedisCoordinator, who: str) -> None:
        async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
            granted.append(time.monotonic())
            if inside:
                overlaps.append((*inside, who))
            inside.append(who)
            await anyio.sleep(0.05)
            inside.remove(who)

    try:
        async with first, second:
            with anyio.fail_after(40):
                await write(first, "warm-up")
                junk = await anyio.to_thread.run_sync(far, client, value)
                await anyio.to_thread.run_sync(client.hset, key(namespace, "meta"), "quiet_until", junk)
                spoiled = time.monotonic()
                async with anyio.create_task_group() as tg:
                    for number in range(4):
                        tg.start_soon(write, (first, second)[number % 2], f"w{number}")
    finally:
        client.close()
    assert len(granted) == 5 and overlaps == [], (granted, overlaps)
    resumed = granted[1] - spoiled
    assert TTL * 0.9 <= resumed <= RESUMED, f"granted {resumed:.2f}s after the junk: not one quiet period"


async def write_dead_hold(client: redis.Redis, namespace: str, expiry: str) -> None:
    """A hold of a process that is gone, its expiry as given, with `meta`'s counts kept whole."""

    def run() -> None:
        pipe = client.pipeline(transaction=True)
        pipe.hset(key(namespace, "holders"), "dead:1", '["",3]')
        pipe.zadd(key(namespace, "holders_exp"), {"dead:1": float(expiry)})
        pipe.hset(key(namespace, "tokens"), "dead:1", "5")
        pipe.hincrby(key(namespace, "meta"), "held", 1)
        pipe.execute()

    await anyio.to_thread.run_sync(run)


@pytest.mark.parametrize("value", ["inf", "1e300", "+10y", "+horizon"])
async def test_a_dead_hold_expiring_beyond_the_horizon_is_lost_state_not_an_outage(
    redis_server: RedisServer, namespace: str, value: str
) -> None:
    """A dead holder's entry whose expiry is past the horizon: the next write is granted within one quiet period.

    Before, the entry was never purged (its expiry never came), so every later write waited for good.
    """
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    coordinator = fleet(redis_server, namespace)
    try:
        async with coordinator:
            with anyio.fail_after(40):
                async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
                    pass
                expiry = await anyio.to_thread.run_sync(far, client, value)
                await write_dead_hold(client, namespace, expiry)
                spoiled = time.monotonic()
                async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost) as lease:
                    resumed = time.monotonic() - spoiled
                    assert lease is not None and lease.token is not None
                dead = await anyio.to_thread.run_sync(client.hexists, key(namespace, "holders"), "dead:1")
    finally:
        client.close()
    assert not dead, "the dead hold is still in force"
    assert TTL * 0.9 <= resumed <= RESUMED, f"granted {resumed:.2f}s after the junk: not one quiet period"


async def test_a_dead_hold_expiring_within_the_horizon_is_kept_until_it_expires(
    redis_server: RedisServer, namespace: str
) -> None:
    """The other side: a dead hold expiring in 3 s (as a long-ttl process's would) blocks writes until then."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    coordinator = fleet(redis_server, namespace)
    try:
        async with coordinator:
            with anyio.fail_after(40):
                async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
                    pass
                expiry = await anyio.to_thread.run_sync(redis_ms, client)
                await write_dead_hold(client, namespace, str(expiry + 3000))
                spoiled = time.monotonic()
                async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
                    waited = time.monotonic() - spoiled
    finally:
        client.close()
    assert waited >= 2.7, f"granted {waited:.2f}s after a hold that expires in 3 s"


async def test_a_long_ttl_processs_hold_is_respected_by_a_short_ttl_process(
    redis_server: RedisServer, namespace: str
) -> None:
    """A mixed fleet: a write held past the short ttl by a 4 s-ttl process keeps the 1.2 s-ttl process waiting.

    Its expiry in Redis (renewal + 4 s) is further ahead than the short-ttl process could set one: a horizon
    measured from the reader's own ttl would read it as junk and drop the hold.
    """
    long, short = fleet(redis_server, namespace, LONG), fleet(redis_server, namespace, TTL)
    events: list[str] = []
    holding = anyio.Event()

    async def hold_long() -> None:
        async with long.hold(server="ws", exclusive=True, on_lost=never_lost):
            events.append("long in")
            holding.set()
            await anyio.sleep(LONG * 0.8)  # two renewals of the long lease, past three of the short one
            events.append("long out")

    async def hold_short() -> None:
        await holding.wait()
        async with short.hold(server="ws", exclusive=True, on_lost=never_lost):
            events.append("short in")

    async with long, short:
        with anyio.fail_after(40):
            async with short.hold(server="ws", exclusive=True, on_lost=never_lost):
                pass  # past the fresh namespace's quiet period
            async with anyio.create_task_group() as tg:
                tg.start_soon(hold_long)
                tg.start_soon(hold_short)
    assert events == ["long in", "long out", "short in"], events


async def test_a_long_ttl_processs_quiet_period_is_kept_by_a_short_ttl_process(
    redis_server: RedisServer, namespace: str
) -> None:
    """A fresh namespace first seen by the 4 s-ttl process: the 1.2 s-ttl process's reads wait out its 4 s too."""
    long, short = fleet(redis_server, namespace, LONG), fleet(redis_server, namespace, TTL)
    granted: dict[str, float] = {}
    asked = anyio.Event()

    async def read(coordinator: RedisCoordinator, who: str) -> None:
        if who == "long":
            asked.set()
        else:
            await asked.wait()
            await anyio.sleep(0.2)  # the long process's request has set the quiet period
        async with coordinator.hold(server="ws", exclusive=False, on_lost=never_lost):
            granted[who] = time.monotonic() - started

    async with long, short:
        started = time.monotonic()
        with anyio.fail_after(40):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read, long, "long")
                tg.start_soon(read, short, "short")
    assert granted["short"] >= LONG * 0.9, f"the short-ttl process was granted after {granted['short']:.2f}s"


async def test_a_loss_noticed_by_a_short_ttl_process_waits_out_the_long_ttl_hold_it_drops(
    redis_server: RedisServer, namespace: str
) -> None:
    """State lost under a 4 s-ttl holder: the 1.2 s-ttl waiter is granted only after that holder's lease ended.

    The waiter, checking every 0.1 s, notices the loss first; a quiet period of its own ttl alone would end
    while the dropped holder still counts its lease (up to 4 s after its last renewal) and may still write.
    """
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    long, short = fleet(redis_server, namespace, LONG), fleet(redis_server, namespace, TTL)
    lost = anyio.Event()
    waiting = anyio.Event()
    granted: list[float] = []

    def on_lost(reason: str) -> None:
        lost.set()

    async def wait_for_it() -> None:
        waiting.set()
        async with short.hold(server="ws", exclusive=True, on_lost=never_lost):
            granted.append(anyio.current_time())

    try:
        async with long, short:
            with anyio.fail_after(40):
                async with short.hold(server="ws", exclusive=True, on_lost=never_lost):
                    pass  # past the fresh namespace's quiet period
                async with anyio.create_task_group() as tg:
                    async with long.hold(server="ws", exclusive=True, on_lost=on_lost) as lease:
                        assert lease is not None
                        tg.start_soon(wait_for_it)
                        await waiting.wait()
                        await anyio.sleep(LONG / 3 + 0.2)  # one renewal of the long lease
                        await anyio.to_thread.run_sync(client.delete, key(namespace, "tokens"))
                        valid_until = lease.valid_until
                        await lost.wait()
    finally:
        client.close()
    assert granted and granted[0] >= valid_until, (
        f"granted {valid_until - granted[0]:.2f}s before the dropped hold's lease ended"
    )


def test_the_oracle_a_horizon_of_the_readers_own_ttl_drops_a_long_ttl_hold(
    redis_server: RedisServer, namespace: str
) -> None:
    """Switched to the reader's own ttl, the horizon check drops a 3 s-ttl hold on a 1.2 s-ttl request."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = fleet(redis_server, namespace)._keys("ws")
    naive = ACQUIRE.replace(f"local HORIZON = {HORIZON_MS}", "local HORIZON = ttl + math.max(extra, callx)")
    assert naive != ACQUIRE
    try:
        real, oracle = client.register_script(ACQUIRE), client.register_script(naive)
        deadline = time.monotonic() + 20
        long: list[str | int] = [3000, 0, f"{namespace}:wake:", 0, 0, "long:1", '["",3]']
        while real(keys=keys, args=long)[0] != 1:
            assert time.monotonic() < deadline, "the long-ttl hold was never granted"
            time.sleep(0.05)
        short: list[str | int] = [1200, 0, f"{namespace}:wake:", 0, 0, "short:1", '["",3]']
        assert real(keys=keys, args=short) == [0]
        assert client.hexists(key(namespace, "holders"), "long:1"), "the real horizon dropped the long hold"
        oracle(keys=keys, args=short)
        assert not client.hexists(key(namespace, "holders"), "long:1"), "the oracle kept the long hold"
    finally:
        client.close()


def test_lease_ttl_and_the_max_times_past_the_horizon_are_refused_with_the_reason() -> None:
    """A lease_ttl over an hour, or a max write or call time over an hour, is refused: Redis would read it as junk."""
    assert MAX_LEASE_TTL == MAX_OVERRUN == 3600.0 and HORIZON_MS == 7_200_000
    RedisCoordinator(servers=FENCED, lease_ttl=MAX_LEASE_TTL)
    FleetServer(shared_state=True, max_write_time=MAX_OVERRUN, limit=2, max_call_time=MAX_OVERRUN)
    with pytest.raises(ConfigurationError, match=r"lease_ttl must be .* at most 3600, got 3601.*as junk"):
        RedisCoordinator(servers=FENCED, lease_ttl=3601.0)
    with pytest.raises(ConfigurationError, match=r"max_write_time must be .* at most 3600, got 86400.*as junk"):
        FleetServer(shared_state=True, max_write_time=86_400)
    with pytest.raises(ConfigurationError, match=r"max_call_time must be .* at most 3600, got 3600.5.*as junk"):
        FleetServer(limit=2, max_call_time=3600.5)
