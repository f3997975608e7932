"""A hostile (or broken) process sharing the fleet's Redis writes junk into its keys: junk moves nothing.

Each test writes values no fleet process writes (a counter at the edge of what a double counts exactly,
infinities, text, keys of another type) into one of the keys the scripts read, then checks what the fleet
promises still holds: conflicting holds get strictly growing fencing tokens, every call gets one result,
and nothing is granted that a fleet with clean keys would not grant. Each test runs on asyncio and trio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest
import redis

from dispatcher.fleet import FleetServer, RedisCoordinator
from dispatcher.fleet._lua import MAX_TOKEN

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

TTL = 0.6
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
