"""Fleet holds against a real Redis, several coordinators in one process standing for several processes.

Every coordinator has its own connections and identity, so Redis sees them as it would see processes.
Each test runs on asyncio (redis.asyncio) and trio (redis-py's blocking client in worker threads).
"""

from __future__ import annotations

import signal
import subprocess
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis
from mcp.types import ToolAnnotations

from benchmarks._redis import _free_port
from dispatcher import CallStatus, ConfigurationError, Dispatcher, Effect, RetryPolicy, ToolCall
from dispatcher.examples import FaultConfig, Workspace
from dispatcher.fleet import CoordinationError, FleetServer, LocalCoordinator, RedisCoordinator
from dispatcher.fleet import _lua as _fleet_lua

if TYPE_CHECKING:
    import pathlib
    from collections.abc import AsyncIterator, Callable, Collection, Hashable, Iterator

    from benchmarks._redis import RedisServer

pytestmark = pytest.mark.anyio

TTL = 0.5
SERVERS = {"ws": FleetServer(limit=2, shared_state=True, max_write_time=0)}


def fleet(server: RedisServer | str, namespace: str, **options: Any) -> RedisCoordinator:
    url = server if isinstance(server, str) else server.url
    options.setdefault("servers", SERVERS)
    options.setdefault("lease_ttl", TTL)
    return RedisCoordinator(url, namespace=namespace, recheck=0.1, **options)


async def queued(server: RedisServer, namespace: str) -> int:
    """How many holds wait in Redis for server ws."""
    client = redis.Redis.from_url(server.url)
    try:
        return int(await anyio.to_thread.run_sync(client.zcard, f"{namespace}:server:ws:queue"))
    finally:
        client.close()


async def until_queued(server: RedisServer, namespace: str, count: int) -> None:
    with anyio.fail_after(10):
        while await queued(server, namespace) < count:  # noqa: ASYNC110  # the state is in another process
            await anyio.sleep(0.01)


def never_lost(reason: str) -> None:
    raise AssertionError(f"a hold was lost: {reason}")


async def test_holds_of_several_coordinators_never_exceed_the_limit(redis_server: RedisServer, namespace: str) -> None:
    """Three coordinators, fifteen concurrent reads, limit 2: never more than two holds at once, all granted."""
    coordinators = [fleet(redis_server, namespace) for _ in range(3)]
    running = peak = done = 0

    async def read(coordinator: RedisCoordinator) -> None:
        nonlocal running, peak, done
        async with coordinator.hold(server="ws", exclusive=False, on_lost=never_lost):
            running += 1
            peak = max(peak, running)
            await anyio.sleep(0.02)
            running -= 1
        done += 1

    async with coordinators[0], coordinators[1], coordinators[2], anyio.create_task_group() as tg:
        for index in range(15):
            tg.start_soon(read, coordinators[index % 3])
    assert done == 15
    assert peak <= 2


async def test_shared_state_holds_are_granted_in_arrival_order(redis_server: RedisServer, namespace: str) -> None:
    """Queued behind a write: write, read+read together, write, read, in the order they arrived."""
    a, b, c = (fleet(redis_server, namespace) for _ in range(3))
    events: list[tuple[str, int]] = []
    running: dict[int, bool] = {}
    overlaps: list[int] = []

    async def take(coordinator: RedisCoordinator, index: int, exclusive: bool) -> None:
        async with coordinator.hold(server="ws", exclusive=exclusive, on_lost=never_lost):
            if running and (exclusive or any(running.values())):
                overlaps.append(index)
            running[index] = exclusive
            events.append(("start", index))
            await anyio.sleep(0.05)
            del running[index]
            events.append(("end", index))

    plan = [(b, True), (c, False), (b, False), (c, True), (b, False)]
    async with a, b, c:
        async with anyio.create_task_group() as tg:
            async with a.hold(server="ws", exclusive=True, on_lost=never_lost):
                for index, (coordinator, exclusive) in enumerate(plan):
                    tg.start_soon(take, coordinator, index, exclusive)
                    await until_queued(redis_server, namespace, index + 1)
            # `a` gives its hold back; the five are granted in their order.
    starts = [index for kind, index in events if kind == "start"]
    assert starts[0] == 0 and sorted(starts[1:3]) == [1, 2] and starts[3:] == [3, 4], events
    assert events.index(("end", 0)) < events.index(("start", 1))
    assert max(events.index(("end", 1)), events.index(("end", 2))) < events.index(("start", 3))
    assert overlaps == []


async def test_calls_fail_clearly_when_redis_cannot_be_reached(namespace: str) -> None:
    """No Redis: the coordinated call is FAILED with the reason and never reaches the server; others run."""
    workspace = Workspace()
    coordinator = fleet("redis://127.0.0.1:1/0", namespace, timeout=0.5)

    def local() -> str:
        return "ran"

    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        dispatcher.add_function(local, annotations=ToolAnnotations(read_only_hint=True))
        with anyio.fail_after(20):
            searched, ran = await dispatcher.dispatch(
                [ToolCall("1", "search_notes", {"query": "x"}), ToolCall("2", "local")]
            )
    assert searched.status is CallStatus.FAILED
    assert searched.error is not None and "cannot reach Redis at redis://127.0.0.1:1/0" in searched.error
    assert ran.status is CallStatus.OK
    assert workspace.ledger == (), "a call ran without its fleet hold"


async def test_a_coordinator_that_was_not_entered_fails_its_calls(redis_server: RedisServer, namespace: str) -> None:
    """A RedisCoordinator used outside its async with: FAILED, saying so."""
    workspace = Workspace()
    async with Dispatcher(coordinator=fleet(redis_server, namespace)) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", "search_notes", {"query": "x"})])
    assert result.status is CallStatus.FAILED
    assert result.error is not None and "not open" in result.error
    assert workspace.ledger == ()


async def test_dispatchers_of_a_fleet_run_calls_under_their_holds(redis_server: RedisServer, namespace: str) -> None:
    """Two dispatchers, one shared-state server: every call OK, writes alone, at most two at once on the server."""
    workspace = Workspace(latency=0.01)
    # Leases of 3 s, renewed every third: at 0.5 s a loaded machine's stalled loop lost a hold (the call FAILED),
    # which this test is not about; at load average 24 a grant's reply took 1.5 s to be read.
    first, second = fleet(redis_server, namespace, lease_ttl=3.0), fleet(redis_server, namespace, lease_ttl=3.0)

    async def agent(coordinator: RedisCoordinator, name: str, out: list[CallStatus]) -> None:
        async with Dispatcher(coordinator=coordinator) as dispatcher:
            await dispatcher.connect("ws", workspace.server, trusted=True)
            for round_ in range(3):
                calls = [
                    ToolCall("r1", "search_notes", {"query": name}),
                    ToolCall("w", "set_note", {"name": f"{name}{round_}", "text": name}),
                    ToolCall("r2", "search_notes", {"query": name}),
                    ToolCall("r3", "read_note", {"name": f"{name}{round_}"}),
                ]
                out.extend(result.status for result in await dispatcher.dispatch(calls))

    statuses: list[CallStatus] = []
    async with first, second, anyio.create_task_group() as tg:
        tg.start_soon(agent, first, "a", statuses)
        tg.start_soon(agent, second, "b", statuses)
    assert statuses == [CallStatus.OK] * 24
    assert workspace.max_in_flight <= 2
    executions = workspace.ledger
    for write in (execution for execution in executions if execution.tool == "set_note"):
        assert not any(write.overlaps(other) for other in executions if other is not write), write


async def test_a_running_call_that_loses_its_lease_is_abandoned_with_an_unknown_outcome(
    redis_server: RedisServer, namespace: str
) -> None:
    """Redis gone while a call runs: once its lease could have expired the call ends TIMEOUT (unknown), cut off."""
    workspace = Workspace(latency=60.0)
    coordinator = fleet(redis_server, namespace, timeout=0.3)
    async with coordinator, Dispatcher(coordinator=coordinator, call_timeout=None) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        batch = dispatcher.batch()
        pending = batch.submit(ToolCall("1", "search_notes", {"query": "x"}))
        with anyio.fail_after(20):
            while workspace.in_flight == 0:  # noqa: ASYNC110  # the workspace offers no event to wait on
                await anyio.sleep(0.01)
            redis_server.stop()
            result = await pending.wait()
    assert (result.status, result.effect) == (CallStatus.TIMEOUT, Effect.UNKNOWN)
    assert result.error is not None and "lost its fleet hold on server 'ws'" in result.error
    assert "after its request was sent: it may have run, or still be running on the server" in result.error
    assert workspace.in_flight == 0, "the abandoned call was not cancelled on the server"


async def test_cancelling_a_call_that_waits_for_its_hold(redis_server: RedisServer, namespace: str) -> None:
    """A call queued in Redis behind another process's write is cancelled: CANCELLED, and it leaves the queue."""
    workspace = Workspace()
    other, coordinator = fleet(redis_server, namespace), fleet(redis_server, namespace)
    async with other, coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        async with other.hold(server="ws", exclusive=True, on_lost=never_lost):
            batch = dispatcher.batch()
            pending = batch.submit(ToolCall("1", "set_note", {"name": "n", "text": "t"}))
            await until_queued(redis_server, namespace, 1)
            pending.cancel()
            result = await pending.wait()
            assert await queued(redis_server, namespace) == 0
    assert result.status is CallStatus.CANCELLED
    assert result.error == "cancelled while waiting for its fleet hold"
    assert workspace.ledger == ()


async def test_a_call_that_waits_past_wait_timeout_fails(redis_server: RedisServer, namespace: str) -> None:
    """wait_timeout bounds the wait for a hold: the call is FAILED, saying so, and never ran."""
    workspace = Workspace()
    other, coordinator = fleet(redis_server, namespace), fleet(redis_server, namespace, wait_timeout=0.3)
    async with other, coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        async with other.hold(server="ws", exclusive=True, on_lost=never_lost):
            [result] = await dispatcher.dispatch([ToolCall("1", "search_notes", {"query": "x"})])
    assert result.status is CallStatus.FAILED
    assert result.error == "no fleet hold on server 'ws' within wait_timeout=0.3s"
    assert workspace.ledger == ()


async def test_the_retry_budget_is_one_bucket_for_the_fleet(redis_server: RedisServer, namespace: str) -> None:
    """Two dispatchers retrying an always-failing idempotent tool spend one shared budget of 3 retries."""
    workspace = Workspace(faults=FaultConfig(rate=1.0, tools=frozenset({"set_note"}), kinds=("error",)))
    policy = RetryPolicy(attempts=5, wait_initial=0.0, wait_max=0.0, budget=3, budget_refill=0.0)
    first, second = fleet(redis_server, namespace), fleet(redis_server, namespace)
    attempts: list[int] = []

    async def agent(coordinator: RedisCoordinator, name: str) -> None:
        async with Dispatcher(coordinator=coordinator, retry=policy) as dispatcher:
            await dispatcher.connect("ws", workspace.server, trusted=True)
            for index in range(3):
                [result] = await dispatcher.dispatch(
                    [ToolCall("1", "set_note", {"name": f"{name}{index}", "text": ""})]
                )
                assert result.status is CallStatus.FAILED
                attempts.append(result.attempts)

    async with first, second, anyio.create_task_group() as tg:
        tg.start_soon(agent, first, "a")
        tg.start_soon(agent, second, "b")
    assert len(attempts) == 6
    assert sum(attempts) - len(attempts) == 3, f"retries made: {attempts}; the fleet's budget was 3"


async def test_shared_budget_earnings_reach_the_other_processes(redis_server: RedisServer, namespace: str) -> None:
    """Tokens earned in one process can be spent in another; a server that does not share has no fleet budget."""
    servers = {"ws": FleetServer(limit=2), "own": FleetServer(limit=2, share_retry_budget=False)}
    first, second = fleet(redis_server, namespace, servers=servers), fleet(redis_server, namespace, servers=servers)
    async with first, second:
        assert first.retry_budget("own", 2, 0.5) is None
        assert first.retry_budget("elsewhere", 2, 0.5) is None
        mine, theirs = first.retry_budget("ws", 2, 0.5), second.retry_budget("ws", 2, 0.5)
        assert mine is not None and theirs is not None
        assert [await mine.spend(), await theirs.spend(), await mine.spend()] == [True, True, False]
        mine.succeeded(retried=True)
        await mine.flush(mine._coordinator._link)  # type: ignore[arg-type]  # what a renewal round does
        assert await theirs.spend() is True
        assert await theirs.spend() is False


def test_without_a_coordinator_the_run_path_is_unchanged() -> None:
    """No coordinator, or LocalCoordinator: a runner calls the execution path itself (nothing added per call)."""
    for coordinator in (None, LocalCoordinator()):
        dispatcher = Dispatcher(coordinator=coordinator)
        assert dispatcher._executor._run_admitted == dispatcher._executor._execute


def test_bad_fleet_configuration_is_refused() -> None:
    """Settings out of range are ConfigurationErrors that say what to use."""
    with pytest.raises(ConfigurationError, match="coordinator must provide hold"):
        Dispatcher(coordinator=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="limit must be an int >= 1"):
        FleetServer(limit=0)
    with pytest.raises(ConfigurationError, match="recheck must be"):
        RedisCoordinator(servers=SERVERS, lease_ttl=1.0, recheck=0.9)
    with pytest.raises(ConfigurationError, match="url must be"):
        RedisCoordinator("localhost:6379", servers=SERVERS)
    with pytest.raises(ConfigurationError, match="namespace"):
        RedisCoordinator(namespace="two words", servers=SERVERS)
    with pytest.raises(ConfigurationError, match="must be a FleetServer"):
        RedisCoordinator(servers={"ws": 3})  # type: ignore[dict-item]
    assert "secret" not in repr(RedisCoordinator("redis://:secret@host:6379/0", servers=SERVERS))


async def test_coordination_errors_are_raised_by_hold_itself(namespace: str) -> None:
    """hold() on an unreachable Redis raises CoordinationError, the block does not run."""
    coordinator = fleet("redis://127.0.0.1:1/0", namespace, timeout=0.5)
    async with coordinator:
        with pytest.raises(CoordinationError, match="cannot reach Redis"):
            async with coordinator.hold(server="ws", exclusive=False, on_lost=never_lost):
                raise AssertionError("ran without a hold")


async def test_closing_the_coordinator_gives_up_the_calls_it_holds_for(
    redis_server: RedisServer, namespace: str
) -> None:
    """A coordinator closed under a running call: it ends at once (TIMEOUT, unknown) instead of running unrenewed."""
    workspace = Workspace(latency=60.0)
    coordinator = fleet(redis_server, namespace)
    async with Dispatcher(coordinator=coordinator, call_timeout=None) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        async with coordinator:
            pending = dispatcher.batch().submit(ToolCall("1", "search_notes", {"query": "x"}))
            with anyio.fail_after(20):
                while workspace.in_flight == 0:  # noqa: ASYNC110  # the workspace offers no event to wait on
                    await anyio.sleep(0.01)
        with anyio.fail_after(20):
            result = await pending.wait()
    assert (result.status, result.effect) == (CallStatus.TIMEOUT, Effect.UNKNOWN)
    assert result.error is not None and "the RedisCoordinator closed" in result.error
    assert workspace.in_flight == 0


def test_fleet_module_exports_its_names() -> None:
    """`dispatcher.fleet.__all__` is sorted and every name in it is defined in the package."""
    import dispatcher.fleet

    assert dispatcher.fleet.__all__ == sorted(dispatcher.fleet.__all__)
    for name in dispatcher.fleet.__all__:
        assert getattr(dispatcher.fleet, name).__module__.startswith("dispatcher.")


async def test_a_hold_that_cannot_be_renewed_is_given_up_before_its_lease_ends(
    redis_server: RedisServer, namespace: str
) -> None:
    """Redis frozen under a hold: the hold is given up before the end of its lease, late renewals or not."""
    # With these values the renewal loop alone notices the second failed renewal after the lease ended.
    # The watch gives the hold up 1 to 2 s before the lease ends: room for a loaded machine to stall it.
    coordinator = RedisCoordinator(
        redis_server.url, namespace=namespace, servers=SERVERS, lease_ttl=4.0, recheck=2.0, timeout=1.2
    )
    lost_at: list[float] = []
    process = redis_server.process
    assert process is not None
    async with coordinator:
        async with coordinator.hold(
            server="ws", exclusive=True, on_lost=lambda reason: lost_at.append(anyio.current_time())
        ):
            [lease] = coordinator._active["ws"].values()
            process.send_signal(signal.SIGSTOP)
            try:
                with anyio.fail_after(20):
                    while not lost_at:  # noqa: ASYNC110  # on_lost is a plain callback
                        await anyio.sleep(0.01)
            finally:
                process.send_signal(signal.SIGCONT)
    assert lease.lost
    assert lost_at[0] < lease.valid_until, "the hold was kept after Redis could have given it to another"


class _LosesFirstHold:
    """Fault injection: grants every hold at once, and reports the first one lost while its call runs."""

    def __init__(self) -> None:
        self.holds = 0
        self.released = 0

    @asynccontextmanager
    async def hold(
        self, *, server: str, exclusive: bool, keys: Collection[Hashable] = (), on_lost: Callable[[str], None]
    ) -> AsyncIterator[None]:
        self.holds += 1
        first = self.holds == 1
        try:
            async with anyio.create_task_group() as tg:
                if first:

                    async def lose() -> None:
                        await anyio.sleep(0.2)
                        on_lost("lost its fleet hold on server 'ws': injected")
                        on_lost("lost its fleet hold on server 'ws': reported twice")

                    tg.start_soon(lose)
                yield
                tg.cancel_scope.cancel()
        finally:
            self.released += 1

    def retry_budget(self, server: str, capacity: float, refill: float) -> None:
        return None


async def test_a_lost_hold_settles_its_call_once_and_frees_its_turn() -> None:
    """A hold lost under a running write: that call is TIMEOUT (unknown) once, the writes after it run, close ends."""
    workspace = Workspace(latency=0.5)
    coordinator = _LosesFirstHold()
    with anyio.fail_after(30):
        async with Dispatcher(coordinator=coordinator, call_timeout=None) as dispatcher:
            await dispatcher.connect("ws", workspace.server, trusted=True)
            first, second, read = await dispatcher.dispatch(
                [
                    ToolCall("1", "set_note", {"name": "a", "text": "t"}),
                    ToolCall("2", "set_note", {"name": "b", "text": "t"}),
                    ToolCall("3", "search_notes", {"query": "x"}),
                ]
            )
            [later] = await dispatcher.dispatch([ToolCall("4", "set_note", {"name": "c", "text": "t"})])
    assert (first.status, first.effect) == (CallStatus.TIMEOUT, Effect.UNKNOWN)
    assert first.error is not None and "injected" in first.error and "twice" not in first.error
    assert [second.status, read.status, later.status] == [CallStatus.OK] * 3
    assert coordinator.holds == coordinator.released == 4
    assert workspace.in_flight == 0, "the abandoned call was not cancelled"


async def test_a_fresh_namespace_waits_one_lease_ttl_before_its_first_grant(
    redis_server: RedisServer, namespace: str
) -> None:
    """A namespace Redis has no state for (new, or lost): nothing is granted for one ttl, then it is."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        with anyio.fail_after(10):
            # Older than the ttl: the quiet period is not a Redis that just started.
            while (await anyio.to_thread.run_sync(client.info, "server"))["uptime_in_seconds"] < 1:  # noqa: ASYNC110  # Redis' own uptime
                await anyio.sleep(0.1)
        coordinator = fleet(redis_server, namespace, servers={"ws": FleetServer(shared_state=True, max_write_time=0)})
        keys = coordinator._keys("ws")
        args: list[str | int] = [1000, 0, f"{namespace}:wake:", 0, 0, "t:1", '["",3]']
        script = client.register_script(_fleet_lua.ACQUIRE)
        started = time.monotonic()
        first = await anyio.to_thread.run_sync(lambda: script(keys=keys, args=args))
        assert first == [0], "the first request on a namespace without state was granted at once"
        with anyio.fail_after(10):
            while (reply := await anyio.to_thread.run_sync(lambda: script(keys=keys, args=args)))[0] != 1:  # noqa: ASYNC110  # the state is in Redis
                await anyio.sleep(0.05)
        assert time.monotonic() - started >= 0.9, "granted before the quiet period of one ttl (1 s) ended"
        assert int(reply[1]) > 0 and reply[2] != "0", reply
    finally:
        client.close()


async def test_a_redis_younger_than_lease_ttl_grants_nothing_until_it_is_that_old(
    redis_server: RedisServer, namespace: str
) -> None:
    """Redis started (or restarted empty) less than a ttl ago: no grant before its uptime reaches the ttl."""
    redis_server.restart()
    coordinator = RedisCoordinator(
        redis_server.url, namespace=namespace, servers=SERVERS, lease_ttl=60.0, wait_timeout=1.5
    )
    async with coordinator:
        with pytest.raises(CoordinationError, match="within wait_timeout"):
            async with coordinator.hold(server="ws", exclusive=False, on_lost=never_lost):
                raise AssertionError("granted while holds from before the restart could still be running")


async def test_call_timeout_bounds_the_wait_for_a_fleet_hold(redis_server: RedisServer, namespace: str) -> None:
    """No wait_timeout: a call held off the server by another process fails at call_timeout, never run, queue left."""
    workspace = Workspace()
    other, coordinator = fleet(redis_server, namespace), fleet(redis_server, namespace)
    async with other, coordinator, Dispatcher(coordinator=coordinator, call_timeout=0.5) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        async with other.hold(server="ws", exclusive=True, on_lost=never_lost):
            with anyio.fail_after(20):
                [result] = await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "n", "text": "t"})])
            assert await queued(redis_server, namespace) == 0
    assert result.status is CallStatus.FAILED
    assert result.error == "no fleet hold on server 'ws' within call_timeout=0.5s; the call did not run"
    assert result.attempts == 0
    assert workspace.ledger == ()


async def test_a_call_that_waited_for_its_hold_still_gets_its_whole_call_timeout_to_run(
    redis_server: RedisServer, namespace: str
) -> None:
    """Wait 3 s for the hold, run 3 s, call_timeout 5 s: OK (each is bounded alone, not their sum)."""
    # Each part leaves 2 s of its timeout to spare, room for a loaded machine; their sum is 1 s over it.
    workspace = Workspace(latency=3.0)
    other, coordinator = fleet(redis_server, namespace), fleet(redis_server, namespace)
    async with other, coordinator, Dispatcher(coordinator=coordinator, call_timeout=5.0) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        async with anyio.create_task_group() as tg:
            held = anyio.Event()

            async def hold_for_a_while() -> None:
                async with other.hold(server="ws", exclusive=True, on_lost=never_lost):
                    held.set()
                    await anyio.sleep(3.0)

            tg.start_soon(hold_for_a_while)
            await held.wait()
            with anyio.fail_after(30):
                [result] = await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "n", "text": "t"})])
    assert result.status is CallStatus.OK, result.error
    assert len(workspace.ledger) == 1


def _start_cluster_node(binary: str, directory: pathlib.Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """A one-node Redis Cluster serving every slot, or None if it did not come up (a port was taken).

    The cluster bus port is chosen too: by default it is the client port + 10000, and a free port above
    55535 (a third of Linux's ephemeral range) makes redis-server exit at once.
    """
    port, bus = _free_port(), _free_port()
    node = subprocess.Popen(
        [binary, "--port", str(port), "--cluster-port", str(bus), "--bind", "127.0.0.1", "--dir", str(directory),
         "--save", "", "--appendonly", "no", "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 30
        while node.poll() is None and time.monotonic() < deadline:
            try:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                return node, port
            except redis.ConnectionError:
                time.sleep(0.05)
    finally:
        client.close()
    node.kill()
    node.wait()
    return None


@pytest.fixture
def cluster_node(redis_server: RedisServer, tmp_path: pathlib.Path) -> Iterator[str]:
    """A one-node Redis Cluster serving every slot; yields its URL."""
    for _ in range(5):
        started = _start_cluster_node(redis_server.binary, tmp_path)
        if started is not None:
            break
    else:
        raise AssertionError("no Redis Cluster node could be started")
    node, port = started
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        node.kill()
        node.wait()


async def test_a_redis_cluster_node_fails_calls_saying_cluster_is_not_supported(
    cluster_node: str, namespace: str
) -> None:
    """Pointed at a Redis Cluster node: the call is FAILED, saying Redis Cluster is not supported, and never runs."""
    workspace = Workspace()
    coordinator = fleet(cluster_node, namespace)
    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        with anyio.fail_after(20):
            [result] = await dispatcher.dispatch([ToolCall("1", "search_notes", {"query": "x"})])
    assert result.status is CallStatus.FAILED
    assert result.error is not None
    assert "is a Redis Cluster node, which RedisCoordinator does not support" in result.error
    assert workspace.ledger == ()
