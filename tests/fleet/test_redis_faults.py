"""Faults of the fleet's Redis and races between its processes, against a real redis-server.

Six connections cutting the shared limit at one instant; redis-server killed (SIGKILL) and started again
on its port while calls hold and wait; redis-server frozen (SIGSTOP) past the lease, then resumed. Each
checks what the fleet promises: one result per call, no two writes holding at once, nothing hangs past
the configured waits.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest
import redis
from mcp.shared.exceptions import MCPError

from dispatcher.fleet import CoordinationError, FleetServer, RedisCoordinator
from dispatcher.fleet._lua import LIMIT
from dispatcher.testing import FencedResource

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer


def test_six_clients_cutting_the_shared_limit_at_once_cut_it_once_per_round_and_never_below_the_floor(
    redis_server: RedisServer,
) -> None:
    """Six connections send the same round's cut at one instant, forty rounds, with growths and stale cuts mixed in.

    Each round exactly one cut applies (the others were sent under the epoch it ended), the level stays
    within floor and ceiling, and the epoch moves by one per applied cut: no oscillation, no lost cut.
    """
    floor, ceiling, initial = 2, 64, 40
    clients = [redis.Redis.from_url(redis_server.url, decode_responses=True) for _ in range(6)]
    scripts = [client.register_script(LIMIT) for client in clients]
    barrier = threading.Barrier(len(clients))
    replies: list[list[Any]] = []
    lock = threading.Lock()

    def send(number: int, op: str, epoch: int, value: float) -> None:
        barrier.wait()
        reply = scripts[number](keys=["limit"], args=[floor, ceiling, initial, op, epoch, value, "inf"])
        with lock:
            replies.append([op, *reply])

    try:
        level, epoch = float(initial), 0
        for round_ in range(40):
            replies.clear()
            threads = []
            for number in range(len(clients)):
                # Four cut this round; one grows under it; one cuts under the round before (stale).
                op, sent, value = ("cut", epoch, 0.5) if number < 4 else ("grow", epoch, 3.0)
                if number == 5:
                    op, sent = "cut", epoch - 1
                threads.append(threading.Thread(target=send, args=(number, op, sent, value)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
            assert len(replies) == 6, replies
            cuts = [reply for reply in replies if reply[0] == "cut" and reply[3] == 1]
            assert len(cuts) == 1, (round_, replies)
            final_level, final_epoch = (
                float(clients[0].hget("limit", "level") or "nan"),
                int(clients[0].hget("limit", "epoch") or "-1"),
            )
            assert final_epoch == epoch + 1, (round_, replies)
            # The growth applies only when it came before the cut (same epoch); the cut halves at most.
            assert floor <= final_level <= min(ceiling, level + 3), (round_, level, replies)
            assert final_level <= max(floor, (level + 3) * 0.5 + 1e-9), (round_, level, replies)
            level, epoch = final_level, final_epoch
        assert level == floor  # forty halvings end at the floor, never below it
    finally:
        for client in clients:
            client.close()


TTL = 1.5  # renewed every ttl/3: a loaded machine stalls a loop for most of a second
WRITES = {"ws": FleetServer(shared_state=True, max_write_time=0)}


class Holder:
    """Takes one write's hold and keeps it until told, noting when it was granted and when it was lost."""

    def __init__(self, coordinator: RedisCoordinator) -> None:
        self.coordinator = coordinator
        self.granted = math.inf
        self.lost = math.inf
        self.why = ""
        self.token = 0
        self.done = anyio.Event()
        self.holding = anyio.Event()
        self.told = anyio.Event()

    def on_lost(self, why: str) -> None:
        self.lost = min(self.lost, anyio.current_time())
        self.why = why
        self.told.set()

    async def run(self) -> None:
        async with self.coordinator.hold(server="ws", exclusive=True, on_lost=self.on_lost) as lease:
            assert lease is not None and lease.token is not None
            self.token = lease.token
            self.granted = anyio.current_time()
            self.holding.set()
            await self.done.wait()


async def hold_once(coordinator: RedisCoordinator) -> tuple[str, float, float]:
    """One write's hold: ("granted", asked, granted) or ("failed: ...", asked, failed)."""
    asked = anyio.current_time()
    try:
        async with coordinator.hold(server="ws", exclusive=True, on_lost=lambda why: None):
            return "granted", asked, anyio.current_time()
    except CoordinationError as exc:
        return f"failed: {exc}", asked, anyio.current_time()


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["restart", "freeze"])
async def test_redis_killed_and_restarted_or_frozen_past_the_lease_hands_no_write_on_while_its_holder_holds(
    redis_server: RedisServer, namespace: str, fault: str
) -> None:
    """A holds a write; Redis is SIGKILLed and started again on its port, or SIGSTOPped for 4 ttls.

    A loses its hold (it is told, with why) before B, asking meanwhile and after, is granted; every request
    during the fault ends within its `timeout` as a clear CoordinationError (no hang on a stale pooled
    connection), and once Redis is back the fleet grants again within the quiet period.
    """
    timeout = 0.3

    def fleet() -> RedisCoordinator:
        return RedisCoordinator(
            redis_server.url, namespace=namespace, servers=WRITES, lease_ttl=TTL, recheck=0.1, timeout=timeout,
            wait_timeout=8.0,
        )  # fmt: skip

    first, second = fleet(), fleet()
    holder = Holder(first)
    tries: list[tuple[str, float, float]] = []
    async with first, second:
        with anyio.fail_after(40):
            async with anyio.create_task_group() as tg:
                tg.start_soon(holder.run)
                await holder.holding.wait()
                assert redis_server.process is not None
                if fault == "restart":
                    redis_server.stop()  # SIGKILL
                    tries.append(await hold_once(second))  # nothing listens on the port
                    redis_server.start()
                else:
                    pid = redis_server.process.pid
                    os.kill(pid, signal.SIGSTOP)
                    try:
                        stopped = anyio.current_time()
                        while anyio.current_time() < stopped + 4 * TTL:
                            tries.append(await hold_once(second))
                    finally:
                        os.kill(pid, signal.SIGCONT)
                after = await hold_once(second)
                holder.done.set()
    during = [outcome for outcome, _, _ in tries]
    assert during and all(outcome.startswith("failed: cannot reach Redis") for outcome in during), during
    # Each failed within its request's timeout (a connect, or one script), with room for a loaded machine.
    assert all(ended - asked < timeout * 2 + 1.0 for _, asked, ended in tries), tries
    assert after[0] == "granted", after
    assert holder.lost < after[2], (holder.lost, after, holder.why)
    assert holder.why, "the holder was not told it lost its hold"


@pytest.mark.anyio
async def test_redis_clock_stepped_forward_past_a_lease_overlaps_for_one_renewal_and_the_fence_refuses_the_stale_write(
    redis_server: RedisServer, namespace: str
) -> None:
    """Redis' clock stepping forward by 10 ttls, simulated: every stored expiry moved back by that much.

    The scripts read time only from Redis (TIME) and store absolute ends, so a step forward and ends moved
    back are the same to them. The holder's own count (its monotonic clock) cannot see the step: the next
    write is granted while it still believes it holds. That is the assumption docs/fleet.md states; what
    bounds it: the holder is told at its next renewal (a third of a ttl), and the newer holder's token is
    larger, so a fencing resource that has seen it refuses the stale one's write.
    """

    def fleet() -> RedisCoordinator:
        return RedisCoordinator(
            redis_server.url, namespace=namespace, servers=WRITES, lease_ttl=TTL, recheck=0.1, wait_timeout=8.0
        )

    first, second = fleet(), fleet()
    holder = Holder(first)
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    fence = FencedResource()
    try:
        async with first, second:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(holder.run)
                    await holder.holding.wait()
                    expiries = f"{namespace}:server:ws:holders_exp"
                    ends = cast(
                        "list[tuple[str, float]]",
                        await anyio.to_thread.run_sync(lambda: client.zrange(expiries, 0, -1, withscores=True)),
                    )
                    moved: dict[Any, float] = {lease_id: score - 10 * TTL * 1000 for lease_id, score in ends}
                    await anyio.to_thread.run_sync(lambda: client.zadd(expiries, moved))
                    async with second.hold(server="ws", exclusive=True, on_lost=lambda why: None) as newer:
                        granted = anyio.current_time()
                        assert newer is not None and newer.token is not None
                        overlapped = holder.lost > granted  # the documented window
                        fence.admit(newer.token)
                        with anyio.fail_after(TTL / 3 + 2.0):
                            await holder.told.wait()
                    holder.done.set()
    finally:
        client.close()
    assert overlapped, "the holder saw the step: the simulation did not move the expiries"
    assert "expired in Redis" in holder.why, holder.why
    assert holder.token is not None and newer is not None and newer.token is not None
    assert holder.token < newer.token
    with pytest.raises(MCPError):
        fence.admit(holder.token)
