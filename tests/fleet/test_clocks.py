"""Clocks a holder cannot trust: a loop clock far from everyone else's, and one that runs slow.

Leases are Redis' time; a holder measures its own lease on its event loop's clock, from before the request
that granted it. So its clock's reading never matters, only its rate: a holder whose clock runs slow by less
than `recheck / lease_ttl` still stops sending before Redis could hand its turn on, and one that runs at
half speed does not (the oracle of the assumption docs/fleet.md states). Each run is a real process's event
loop on asyncio (a loop whose `time()` is scaled) and trio (a `trio.abc.Clock`), against a real Redis.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import trio

from dispatcher.fleet import FleetServer, RedisCoordinator

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer

TTL, RECHECK = 1.0, 0.2
OFFSET = 1e6
"""Seconds the holder's clock reads ahead of every other clock."""


class _TrioClock(trio.abc.Clock):
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.base = time.perf_counter()

    def start_clock(self) -> None:
        self.base = time.perf_counter()

    def current_time(self) -> float:
        return OFFSET + (time.perf_counter() - self.base) * self.rate

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return max(0.0, (deadline - self.current_time()) / self.rate)


def _asyncio_loop(rate: float) -> Any:
    class Loop(asyncio.SelectorEventLoop):
        base = time.monotonic()

        def time(self) -> float:
            return OFFSET + (time.monotonic() - self.base) * rate

    return Loop


class _CutOff(RedisCoordinator):
    """A holder whose renewals never reach Redis: its lease ends `lease_ttl` after its grant, in Redis' time."""

    async def _renew(self, *args: Any) -> None:
        return None


async def _last_send_after_grant(url: str, namespace: str) -> float:
    """Real seconds from just before the grant's request to the last request the lease let through."""
    servers = {"ws": FleetServer(shared_state=True, max_write_time=0)}
    coordinator = _CutOff(url, namespace=namespace, servers=servers, lease_ttl=TTL, recheck=RECHECK)
    async with coordinator:
        # Past the new namespace's quiet period first, so that the grant below is immediate.
        async with coordinator.hold(server="ws", exclusive=False, on_lost=print):
            pass
        before = time.perf_counter()
        last = before
        async with coordinator.hold(server="ws", exclusive=True, on_lost=lambda reason: None) as lease:
            assert lease is not None
            while True:
                try:
                    lease.confirm()  # what the invocation does right before each send
                except Exception:
                    break
                last = time.perf_counter()
                await anyio.sleep(0.01)
    return last - before


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("rate", [1.0, 0.9, 0.5])
def test_a_holder_stops_sending_before_redis_ends_its_lease_unless_its_clock_runs_too_slow(
    redis_server: RedisServer, namespace: str, backend: str, rate: float
) -> None:
    """A clock 1e6 s ahead at rate 1 or 0.9: no send a lease_ttl after the grant; at rate 0.5 (the oracle), sends."""
    options: dict[str, Any] = (
        {"clock": _TrioClock(rate)} if backend == "trio" else {"loop_factory": _asyncio_loop(rate)}
    )
    elapsed = anyio.run(_last_send_after_grant, redis_server.url, namespace, backend=backend, backend_options=options)
    # Redis ends the lease TTL after it ran the grant, which is after `before`: a send past TTL is unsafe.
    if rate >= 1 - RECHECK / TTL:
        assert elapsed < TTL, f"at rate {rate} the holder still sent {elapsed:.2f}s after its grant"
        assert elapsed > (TTL - RECHECK) / rate * 0.5, "the holder gave up far earlier than its lease allows"
    else:
        assert elapsed > TTL, f"the oracle: at rate {rate} the holder should send past its lease ({elapsed:.2f}s)"
