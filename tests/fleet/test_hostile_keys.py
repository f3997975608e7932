"""A hostile (or broken) process sharing the fleet's Redis writes junk into its keys: junk moves nothing.

Each test writes values no fleet process writes (a counter at the edge of what a double counts exactly,
infinities, text, keys of another type) into one of the keys the scripts read, then checks what the fleet
promises still holds: conflicting holds get strictly growing fencing tokens, every call gets one result,
and nothing is granted that a fleet with clean keys would not grant. Each test runs on asyncio and trio.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import pytest
import redis

from dispatcher.fleet import FleetServer, RedisCoordinator
from dispatcher.fleet._lua import MAX_TOKEN, SPEND

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

TTL = 1.2  # renewed every ttl/3: a loaded machine stalls a loop for most of a second
FENCED = {"ws": FleetServer(shared_state=True, fence_meta="example.com/fence")}


def fleet(server: RedisServer, namespace: str) -> RedisCoordinator:
    return RedisCoordinator(server.url, namespace=namespace, servers=FENCED, lease_ttl=TTL, recheck=0.1)


def never_lost(reason: str) -> None:
    raise AssertionError(f"a hold was lost: {reason}")


def key(namespace: str, name: str) -> str:
    return f"{namespace}:server:ws:{name}"


async def write(server: RedisServer, name: str, value: str) -> None:
    client = redis.Redis.from_url(server.url)
    try:
        await anyio.to_thread.run_sync(client.set, name, value)
    finally:
        client.close()


@pytest.mark.parametrize(
    "junk", [str(2**53 + 1), str(MAX_TOKEN + 1), "1e300", "inf", "-inf", "nan", "-5", "1.5", "abc", ""]
)
async def test_a_junk_fence_counter_never_makes_two_writes_share_a_token(
    redis_server: RedisServer, namespace: str, junk: str
) -> None:
    """After junk in `fence`, consecutive writes still get strictly growing whole tokens a double holds exactly.

    A counter past 2**53 stayed there (its + 1 was lost in the double), so every later write carried the same
    token and a fencing server, refusing only lower tokens, let a stale holder's write through; "inf" and
    "nan" came back as tokens Python could not read, and the call's task group failed.
    """
    tokens: list[int] = []
    async with fleet(redis_server, namespace) as coordinator:
        with anyio.fail_after(20):
            async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost) as lease:
                assert lease is not None and lease.token is not None
                tokens.append(lease.token)
            await write(redis_server, key(namespace, "fence"), junk)
            for _ in range(4):
                async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost) as lease:
                    assert lease is not None and lease.token is not None
                    tokens.append(lease.token)
    later = tokens[1:]
    assert later == sorted(later) and len(set(later)) == len(later), tokens
    assert all(0 < token <= MAX_TOKEN for token in tokens), tokens


async def test_a_fence_counter_at_its_cap_starts_again_from_redis_clock_rather_than_repeating(
    redis_server: RedisServer, namespace: str
) -> None:
    """A valid counter one below the cap gives the cap once; past it, the next token is Redis' clock again."""
    async with fleet(redis_server, namespace) as coordinator:
        with anyio.fail_after(20):
            async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost) as lease:
                assert lease is not None and lease.token is not None
                clock = lease.token
            await write(redis_server, key(namespace, "fence"), str(MAX_TOKEN - 1))
            tokens = []
            for _ in range(3):
                async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost) as lease:
                    assert lease is not None and lease.token is not None
                    tokens.append(lease.token)
    assert tokens[0] == MAX_TOKEN, tokens
    assert clock < tokens[1] < tokens[2] < MAX_TOKEN, tokens


JUNK = [
    ("meta", "quiet_until", "abc"),
    ("meta", "held", "abc"),
    ("meta", None, "a string"),
    ("seq", None, "abc"),
    ("seq", None, str(2**63 - 1)),
    ("queue", None, "a string"),
    ("waiting", None, "a string"),
    ("holders", None, "a string"),
    ("holders_exp", None, "a string"),
    ("tokens", None, "a string"),
    ("fence", "a", "hash"),
]


async def spoil(server: RedisServer, name: str, field: str | None, value: str) -> None:
    client = redis.Redis.from_url(server.url)
    try:
        if field is None or name.endswith(":fence"):
            await anyio.to_thread.run_sync(client.delete, name)
        if field is None:
            await anyio.to_thread.run_sync(client.set, name, value)
        else:
            await anyio.to_thread.run_sync(client.hset, name, field, value)
    finally:
        client.close()


@pytest.mark.parametrize(("name", "field", "value"), JUNK)
async def test_junk_or_a_foreign_type_in_a_key_is_lost_state_not_an_outage(
    redis_server: RedisServer, namespace: str, name: str, field: str | None, value: str
) -> None:
    """After junk in any key the scripts read, writes from two coordinators are granted again, one at a time.

    Before, a `quiet_until` that was not a number, a key of another type or an arrival counter INCR could not
    add to made every script fail: every call FAILED, as "cannot reach Redis", for as long as the junk stayed.
    """
    first, second = fleet(redis_server, namespace), fleet(redis_server, namespace)
    inside: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    granted: list[str] = []

    async def write(coordinator: RedisCoordinator, who: str) -> None:
        async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
            if inside:
                overlaps.append((*inside, who))
            inside.append(who)
            await anyio.sleep(0.05)
            inside.remove(who)
            granted.append(who)

    async with first, second:
        with anyio.fail_after(30):
            await write(first, "warm-up")
            await spoil(redis_server, key(namespace, name), field, value)
            async with anyio.create_task_group() as tg:
                for number in range(6):
                    tg.start_soon(write, (first, second)[number % 2], f"w{number}")
    assert sorted(granted) == sorted(["warm-up", *(f"w{number}" for number in range(6))]), granted
    assert overlaps == []


async def test_a_lost_arrival_counter_lets_no_later_waiter_go_first(redis_server: RedisServer, namespace: str) -> None:
    """A DEL (or junk) of `seq` alone, with writes queued: the next waiter is still numbered after them."""
    coordinator = fleet(redis_server, namespace)
    order: list[str] = []
    holding = anyio.Event()

    async def write(who: str) -> None:
        async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
            order.append(who)
            if who == "holder":
                holding.set()
            await anyio.sleep(0.05 if who != "holder" else 0.6)

    client = redis.Redis.from_url(redis_server.url)
    try:
        async with coordinator:
            with anyio.fail_after(30):
                await write("warm-up")
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write, "holder")
                    await holding.wait()
                    for number in range(3):
                        tg.start_soon(write, f"queued{number}")
                        await anyio.sleep(0.05)
                    await anyio.to_thread.run_sync(client.delete, key(namespace, "seq"))
                    tg.start_soon(write, "later")
    finally:
        client.close()
    assert order == ["warm-up", "holder", "queued0", "queued1", "queued2", "later"], order


@pytest.mark.parametrize("junk", ["-inf", "inf", "nan", "abc", "-5", "a string"])
def test_junk_in_a_shared_retry_budget_neither_spends_it_for_good_nor_overfills_it(
    redis_server: RedisServer, junk: str
) -> None:
    """Tokens that are not a finite number, or a key of another type, count as a fresh (full) bucket.

    Before, "-inf" stayed for good (no retry ever again) and a string key failed every spend.
    """
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        spend = client.register_script(SPEND)
        if junk == "a string":
            client.set("budget", "junk")
        else:
            client.hset("budget", "tokens", junk)
        taken = [spend(keys=["budget"], args=[3, 0, 1]) for _ in range(5)]
        left = float(client.hget("budget", "tokens") or "nan")
    finally:
        client.close()
    if junk == "-5":  # a finite number: what is left of a bucket, never below empty
        assert taken == [0, 0, 0, 0, 0] and left == 0.0
    else:
        assert taken == [1, 1, 1, 0, 0] and left == 0.0


ENTRIES = ["not json", "", "{}", "[]", '{"1": "", "2": 3}', '["", 7]', '["", 1.5]', "[1, 3]", '[""]', "[null, 3]"]
"""A hold's locks as no fleet process writes them: not JSON, or not a list of (path, mode 0 to 3) pairs."""


@pytest.mark.parametrize("junk", ENTRIES)
async def test_a_junk_holder_entry_is_lost_state_not_an_outage(
    redis_server: RedisServer, namespace: str, junk: str
) -> None:
    """A holder's entry in `holders` replaced with junk: the holder loses its hold before anyone else gets one.

    Before, every script failed to decode the entry (as "cannot reach Redis") until its holder released or its
    lease ran out: every call FAILED meanwhile.
    """
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    holder, other = fleet(redis_server, namespace), fleet(redis_server, namespace)
    lost_at: list[float] = []
    try:
        async with holder, other:
            with anyio.fail_after(20):
                async with holder.hold(server="ws", exclusive=True, on_lost=lambda _: lost_at.append(time.monotonic())):
                    (entry,) = await anyio.to_thread.run_sync(client.hkeys, key(namespace, "holders"))
                    await anyio.to_thread.run_sync(client.hset, key(namespace, "holders"), entry, junk)
                    spoiled = time.monotonic()
                    async with other.hold(server="ws", exclusive=True, on_lost=never_lost) as lease:
                        granted = time.monotonic()
                        assert lease is not None and lease.token is not None
    finally:
        client.close()
    assert lost_at and lost_at[0] < granted, "granted to another while the first still held"
    assert granted - spoiled >= TTL * 0.9, f"granted {granted - spoiled:.2f}s after the junk, before one ttl"


@pytest.mark.parametrize("junk", ENTRIES)
async def test_a_junk_waiter_entry_is_lost_state_not_an_outage(
    redis_server: RedisServer, namespace: str, junk: str
) -> None:
    """A waiter's entry in `waiting` replaced with junk: the holder loses its hold, then the waiter is granted."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    holder, waiter = fleet(redis_server, namespace), fleet(redis_server, namespace)
    lost_at: list[float] = []
    granted: list[float] = []
    waiting, lost = anyio.Event(), anyio.Event()

    def on_lost(reason: str) -> None:
        lost_at.append(time.monotonic())
        lost.set()

    async def wait_for_it() -> None:
        waiting.set()
        async with waiter.hold(server="ws", exclusive=True, on_lost=never_lost) as lease:
            assert lease is not None and lease.token is not None
            granted.append(time.monotonic())

    try:
        async with holder, waiter:
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    async with holder.hold(server="ws", exclusive=True, on_lost=on_lost):
                        tg.start_soon(wait_for_it)
                        await waiting.wait()
                        entries: list[bytes | str] = []
                        while not entries:
                            await anyio.sleep(0.02)
                            entries = await anyio.to_thread.run_sync(client.hkeys, key(namespace, "waiting"))
                        await anyio.to_thread.run_sync(client.hset, key(namespace, "waiting"), entries[0], junk)
                        spoiled = time.monotonic()
                        await lost.wait()
    finally:
        client.close()
    assert granted and lost_at[0] < granted[0], "granted to the waiter while the holder still held"
    assert granted[0] - spoiled >= TTL * 0.9, f"granted {granted[0] - spoiled:.2f}s after the junk, before one ttl"
