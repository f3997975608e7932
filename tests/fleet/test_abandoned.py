"""Abandoned writes and lost state, against a real Redis: what a call is told, and how long its turn is kept.

Issue 24, point 4: a call whose fleet hold is lost before its request left failed and never ran; one whose
hold is lost after its request left may have run (TIMEOUT, effect unknown). A write whose holder gives it up
after sending, or stops renewing, keeps its turn for the server's `max_write_time`. Point 3: a namespace
that lost any one of its keys (a DEL, an eviction) is noticed like one that lost them all.

Several coordinators in one process stand for several processes (each has its own connections and
identity). Each test runs on asyncio and trio.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis
from mcp import Client

from dispatcher import CallStatus, ConfigurationError, Dispatcher, Effect, ToolCall
from dispatcher.examples import Workspace
from dispatcher.fleet import CoordinationError, FleetServer, RedisCoordinator
from tests.fleet.test_fencing import FENCED, TTL, Frozen, flushall, never_lost

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer

pytestmark = pytest.mark.anyio


def fleet(server: RedisServer, namespace: str, **config: Any) -> RedisCoordinator:
    """A coordinator of one shared-state server without fencing, `config` its FleetServer settings."""
    config.setdefault("max_write_time", 0)
    servers = {"ws": FleetServer(shared_state=True, **config)}
    return RedisCoordinator(server.url, namespace=namespace, servers=servers, lease_ttl=TTL, recheck=0.1)


@pytest.mark.parametrize("connection", ["owned", "users"])
async def test_a_hold_lost_before_the_send_says_the_call_was_not_sent(
    redis_server: RedisServer, namespace: str, connection: str
) -> None:
    """Frozen past its lease before the send: FAILED, never ran, and the error says it was not sent."""
    workspace = Workspace()
    coordinator = Frozen(
        redis_server.url, namespace=namespace, servers=FENCED, lease_ttl=TTL, recheck=0.1, freeze=2 * TTL
    )
    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        if connection == "owned":
            await dispatcher.connect("ws", workspace.server, trusted=True)
            [result] = await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "a", "text": "late"})])
        else:
            async with Client(workspace.server) as client:
                await dispatcher.add_mcp_server("ws", client, trusted=True)
                [result] = await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "a", "text": "late"})])
    assert (result.status, result.effect) == (CallStatus.FAILED, Effect.NEVER_RAN), result
    assert result.error is not None and result.error.endswith("; the call was not sent"), result.error
    assert "running on the server" not in result.error, result.error
    assert workspace.ledger == ()


async def test_a_write_whose_hold_is_lost_on_the_wire_ends_timeout_with_an_unknown_outcome(
    redis_server: RedisServer, namespace: str
) -> None:
    """FLUSHALL under a write on the server: TIMEOUT of unknown effect, saying it may have run."""
    workspace = Workspace(latency=30.0)
    coordinator = fleet(redis_server, namespace)
    async with coordinator, Dispatcher(coordinator=coordinator, call_timeout=None) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        pending = dispatcher.batch().submit(ToolCall("1", "set_note", {"name": "a", "text": "t"}))
        with anyio.fail_after(20):
            while workspace.in_flight == 0:  # noqa: ASYNC110  # the workspace offers no event to wait on
                await anyio.sleep(0.01)
            await flushall(redis_server)
            result = await pending.wait()
    assert (result.status, result.effect, result.mutating) == (CallStatus.TIMEOUT, Effect.UNKNOWN, True), result
    assert result.error is not None and "lost its fleet hold on server 'ws'" in result.error
    assert "after its request was sent: it may have run, or still be running on the server" in result.error


@pytest.mark.parametrize("bound", [3.0, 0.0])
@pytest.mark.parametrize("how", ["closed", "timed out"])
async def test_a_write_given_up_on_the_wire_keeps_its_turn_for_max_write_time(
    redis_server: RedisServer, namespace: str, how: str, bound: float
) -> None:
    """A write given up mid-run on a server that finishes it: the next write waits max_write_time.

    The write's coordinator closes under it (its hold given up after the send), or the write reaches its
    call_timeout (there the in-process server stops it, and only the handover is checked). With
    max_write_time=0 (the oracle) the next write starts beside the abandoned one, which the ledger shows,
    and the turn is handed on sooner than the check of max_write_time allows.
    """
    # The oracle's write runs long enough to be overlapped however late a busy machine grants the next.
    workspace = Workspace(latency=1.0 if bound else 3.0, uncancellable=how == "closed")
    first, second = (fleet(redis_server, namespace, max_write_time=bound) for _ in range(2))
    call_timeout = 0.3 if how == "timed out" else None
    async with Dispatcher(coordinator=first, call_timeout=call_timeout) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        async with first:
            with anyio.fail_after(20):
                async with first.hold(server="ws", exclusive=False, on_lost=never_lost):
                    pass  # past the new namespace's quiet period, which call_timeout would not wait out
            pending = dispatcher.batch().submit(ToolCall("1", "append_note", {"name": "a", "text": "first"}))
            with anyio.fail_after(20):
                while workspace.in_flight == 0:  # noqa: ASYNC110  # the workspace offers no event to wait on
                    await anyio.sleep(0.01)
                if how == "timed out":
                    await pending.wait()
        # The write is given up (its coordinator closed, or its time ran out), while the server goes on.
        abandoned = await pending.wait()
        given_up = time.monotonic()
        async with second:
            with anyio.fail_after(20):
                async with second.hold(server="ws", exclusive=True, on_lost=never_lost):
                    granted = time.monotonic()
                    async with Client(workspace.server) as client:
                        await client.call_tool("set_note", {"name": "a", "text": "second"})
    assert (abandoned.status, abandoned.effect) == (CallStatus.TIMEOUT, Effect.UNKNOWN), abandoned
    first_run, second_run = workspace.ledger
    if bound:
        assert granted - given_up >= bound * 0.8, f"the turn was handed on {granted - given_up:.2f}s after"
        assert not first_run.overlaps(second_run), "the next write ran beside the abandoned one"
    elif how == "closed":
        assert first_run.overlaps(second_run), "the oracle: without max_write_time the writes overlap"
    else:
        # A band a loaded machine stays in (it stalled a grant past 1 s): below what the check above allows.
        waited = granted - given_up
        assert waited < 3.0 * 0.8, (
            f"the oracle: without max_write_time the turn is handed on at once, not {waited:.2f}s"
        )


class _Timed(RedisCoordinator):
    """A coordinator that notes when it starts giving back a hold whose request was sent."""

    given_up = math.nan
    released = False  # that hold's release has reached Redis

    async def _release(self, lease: Any) -> None:
        if lease.sent and math.isnan(self.given_up):
            self.given_up = time.monotonic()
        await super()._release(lease)
        self.released = not math.isnan(self.given_up)


class _FreesAtOnce(_Timed):
    """The oracle's coordinator: gives every hold back as if its call had ended, sent or not."""

    async def _release(self, lease: Any) -> None:
        sent = lease.sent
        lease.abandoned = lease.sent = False
        if sent and math.isnan(self.given_up):
            self.given_up = time.monotonic()
        await super()._release(lease)


@pytest.mark.parametrize("bound", [None, 2.0, "oracle"])
@pytest.mark.parametrize("how", ["closed", "timed out"])
async def test_a_call_given_up_on_the_wire_keeps_its_place_under_the_limit(
    redis_server: RedisServer, namespace: str, how: str, bound: float | str | None
) -> None:
    """limit=1, no shared state: a call given up in flight keeps its place lease_ttl + max_call_time.

    Its coordinator closes under it, or it reaches its call_timeout; the server goes on with it (the
    workspace ignores the cancellation when `closed`). With max_call_time covering the call, the next
    call starts after it ended; the oracle, which gives the place back at once, starts it beside it:
    the server above its limit.
    """
    oracle = bound == "oracle"
    # The oracle's call runs long enough to be overlapped however late a busy machine grants the next.
    workspace = Workspace(latency=3.0 if oracle else 1.0, uncancellable=how == "closed")
    cls = _FreesAtOnce if oracle else _Timed
    config = FleetServer(limit=1, max_call_time=2.0 if oracle else bound if isinstance(bound, float) else None)
    first, second = (
        cls(redis_server.url, namespace=namespace, servers={"ws": config}, lease_ttl=TTL, recheck=0.1) for _ in range(2)
    )
    call_timeout = 0.3 if how == "timed out" else None
    async with Dispatcher(coordinator=first, call_timeout=call_timeout) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        async with first:
            with anyio.fail_after(20):
                async with first.hold(server="ws", exclusive=False, on_lost=never_lost):
                    pass  # past the new namespace's quiet period, which call_timeout would not wait out
            pending = dispatcher.batch().submit(ToolCall("1", "append_note", {"name": "a", "text": "first"}))
            with anyio.fail_after(20):
                while workspace.in_flight == 0:  # noqa: ASYNC110  # the workspace offers no event to wait on
                    await anyio.sleep(0.01)
                if how == "timed out":
                    await pending.wait()
                    # A release still on its way when its coordinator closes may be dropped (the place is then
                    # kept lease_ttl + max_call_time, the safe side): on a loaded machine it was, and the oracle
                    # waited 2.6 s. Closing is not what this case is about.
                    while not first.released:  # noqa: ASYNC110  # set by the coordinator's own task
                        await anyio.sleep(0.01)
        abandoned = await pending.wait()
        async with second:
            with anyio.fail_after(20):
                async with second.hold(server="ws", exclusive=False, on_lost=never_lost):
                    granted = time.monotonic()
                    async with Client(workspace.server) as client:
                        await client.call_tool("append_note", {"name": "b", "text": "second"})
    assert (abandoned.status, abandoned.effect) == (CallStatus.TIMEOUT, Effect.UNKNOWN), abandoned
    waited = granted - first.given_up
    if oracle:
        # A band a loaded machine stays in (it stalled a grant past 1 s): below what the check below allows.
        kept = TTL + 2.0
        assert waited < kept * 0.8, (
            f"the oracle: the place is handed on at once, not after {waited:.2f}s ({kept} s kept)"
        )
        if how == "closed":
            first_run, second_run = workspace.ledger
            assert first_run.overlaps(second_run), "the oracle: the next call runs beside the given-up one"
    else:
        kept = TTL + (bound if isinstance(bound, float) else 0.0)
        assert waited >= kept * 0.8, f"the place was handed on {waited:.2f}s after, not {kept}s"
        if bound is not None:
            first_run, second_run = workspace.ledger
            assert not first_run.overlaps(second_run), "the next call ran beside the given-up one"


@pytest.mark.parametrize(("fault", "bound"), [("flushall", 1.5), ("restart", 1.5), ("flushall", 0.0), ("restart", 0.0)])
async def test_a_write_on_the_server_when_redis_loses_its_state_never_runs_beside_the_next_one(
    redis_server: RedisServer, namespace: str, fault: str, bound: float
) -> None:
    """FLUSHALL, or Redis restarted empty, under a write the server finishes anyway: no write starts beside it.

    The quiet period is lease_ttl + max_write_time. With max_write_time=0 (the oracle) the next write starts
    beside the one still running, which the ledger shows.
    """
    # The oracle's write runs long enough to be overlapped however late a busy machine restarts Redis and
    # grants the next (at 1.2 s a loaded one did neither in time); the others' within the quiet period.
    workspace = Workspace(latency=1.2 if bound else 4.0, uncancellable=True)
    holder, other = (fleet(redis_server, namespace, max_write_time=bound) for _ in range(2))
    async with holder, other, Dispatcher(coordinator=holder, call_timeout=None) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        pending = dispatcher.batch().submit(ToolCall("1", "set_note", {"name": "a", "text": "first"}))
        with anyio.fail_after(30):
            while workspace.in_flight == 0:  # noqa: ASYNC110  # the workspace offers no event to wait on
                await anyio.sleep(0.01)
            if fault == "flushall":
                await flushall(redis_server)
            else:
                await anyio.to_thread.run_sync(redis_server.restart)
            async with other.hold(server="ws", exclusive=True, on_lost=never_lost):
                async with Client(workspace.server) as client:
                    await client.call_tool("set_note", {"name": "a", "text": "second"})
            abandoned = await pending.wait()
    assert (abandoned.status, abandoned.effect) == (CallStatus.TIMEOUT, Effect.UNKNOWN), abandoned
    first_run, second_run = workspace.ledger
    if bound:
        assert not first_run.overlaps(second_run), f"after {fault}, the next write ran beside the one on the server"
    else:
        assert first_run.overlaps(second_run), "the oracle: without max_write_time the writes overlap"


def test_a_shared_state_server_declares_max_write_time_or_a_fence() -> None:
    """A shared-state server keeps a write's turn max_write_time, or is fenced (0 s); a limit-only one keeps none."""
    with pytest.raises(ConfigurationError, match="needs max_write_time=seconds"):
        FleetServer(shared_state=True)
    assert FleetServer(shared_state=True, fence_meta="f").write_bound == 0.0
    assert FleetServer(shared_state=True, fence_argument="f", max_write_time=5).write_bound == 5.0
    assert FleetServer(shared_state=True, max_write_time=0).write_bound == 0.0
    assert FleetServer(limit=3).write_bound == 0.0
    for bad in (-1, float("inf"), "5", True):
        with pytest.raises(ConfigurationError, match="max_write_time must be a number of seconds >= 0"):
            FleetServer(shared_state=True, max_write_time=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="shared_state=True"):
        FleetServer(limit=3, max_write_time=5)
    assert FleetServer(limit=3).call_bound == 0.0 and FleetServer(limit=3, max_call_time=2).call_bound == 2.0
    with pytest.raises(ConfigurationError, match="set it with limit= or share_limit=True"):
        FleetServer(shared_state=True, max_write_time=0, share_limit=False, max_call_time=5)
    # Under share_limit (the default) the fleet's adaptive level is the limit.
    assert FleetServer(shared_state=True, max_write_time=0, max_call_time=5).call_bound == 5.0
    with pytest.raises(ConfigurationError, match="max_call_time must be a number of seconds >= 0"):
        FleetServer(limit=3, max_call_time=-1)


# The namespace's keys (see `_lua`); deleting any one of them alone must be noticed as lost state.
SAFETY_KEYS = ("holders", "holders_exp", "tokens", "meta")


async def test_a_del_of_any_one_key_under_a_hold_is_noticed_as_lost_state(
    redis_server: RedisServer, namespace: str
) -> None:
    """DEL of one of the namespace's keys under a write: the holder loses its hold before anyone else gets one."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        for key in SAFETY_KEYS:
            holder, other = fleet(redis_server, namespace), fleet(redis_server, namespace)
            lost_at: list[float] = []

            def lost(reason: str, lost_at: list[float] = lost_at) -> None:
                lost_at.append(time.monotonic())

            async with holder, other:
                with anyio.fail_after(20):
                    async with holder.hold(server="ws", exclusive=True, on_lost=lost):
                        await anyio.to_thread.run_sync(client.delete, f"{namespace}:server:ws:{key}")
                        deleted = time.monotonic()
                        async with other.hold(server="ws", exclusive=True, on_lost=never_lost):
                            granted = time.monotonic()
            assert lost_at and lost_at[0] < granted, f"DEL {key}: granted to another while the first still held"
            assert granted - deleted >= TTL * 0.9, f"DEL {key}: granted {granted - deleted:.2f}s after, before one ttl"
    finally:
        client.close()


async def test_a_waiter_whose_queue_entry_vanished_is_still_granted(redis_server: RedisServer, namespace: str) -> None:
    """DEL of the queue while a write waits behind another: the waiter is granted once the holder gives back."""
    client = redis.Redis.from_url(redis_server.url)
    holder, waiter = fleet(redis_server, namespace), fleet(redis_server, namespace)
    granted = anyio.Event()

    async def wait_for_it() -> None:
        async with waiter.hold(server="ws", exclusive=True, on_lost=never_lost):
            granted.set()

    try:
        async with holder, waiter, anyio.create_task_group() as tg:
            with anyio.fail_after(20):
                async with holder.hold(server="ws", exclusive=True, on_lost=print):
                    tg.start_soon(wait_for_it)
                    while not await anyio.to_thread.run_sync(client.zcard, f"{namespace}:server:ws:queue"):  # noqa: ASYNC110  # the state is in Redis
                        await anyio.sleep(0.01)
                    await anyio.to_thread.run_sync(client.delete, f"{namespace}:server:ws:queue")
                await granted.wait()
    finally:
        client.close()


async def test_a_script_call_broken_off_by_a_closed_socket_fails_that_request_only(
    redis_server: RedisServer, namespace: str
) -> None:
    """redis-py's ValueError for a socket closed under a read (a close racing a release) is a CoordinationError."""
    coordinator = fleet(redis_server, namespace)
    async with coordinator:
        link = coordinator._link
        assert link is not None
        scripts = link._scripts  # type: ignore[attr-defined]  # each link keeps its registered scripts

        def closed(**_: Any) -> Any:
            raise ValueError("I/O operation on closed file.")

        with anyio.fail_after(20):
            async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
                scripts["release"] = closed  # the release below meets the closed socket
        with pytest.raises(CoordinationError, match="ValueError: I/O operation on closed file"):
            await link.run("release", coordinator._keys("ws"), [*coordinator._args("ws"), "x:0", "0"])


async def test_a_request_broken_by_the_closing_fails_as_a_coordination_error() -> None:
    """redis-py's parser failing on a socket closed under it fails that request, never the caller's task.

    A call's release can be on its way while its coordinator closes; redis-py then raises ValueError or
    AttributeError ('NoneType' object has no attribute 'readline') from the socket it lost. Outside a
    closing such an exception is a defect and comes out as it is.
    """
    from dispatcher.fleet._links import ThreadLink

    link = ThreadLink(RedisCoordinator("redis://127.0.0.1:1", servers=FENCED, lease_ttl=TTL, recheck=0.1))

    def broken(**_: Any) -> None:
        raise AttributeError("'NoneType' object has no attribute 'readline'")

    link._scripts["release"] = broken  # type: ignore[assignment]
    with pytest.raises(AttributeError):
        await link.run("release", [], [])
    link.closing = True
    with pytest.raises(CoordinationError, match="AttributeError"):
        await link.run("release", [], [])
