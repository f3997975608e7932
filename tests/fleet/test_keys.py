"""Keyed fleet holds: the Lua admission in Redis grants exactly what the in-process gate would start.

The reference model is `_gate.Gate` itself: the same submissions, withdrawals and finishes are applied to
a gate and to the scripts in a real Redis, and after each step the holds Redis granted must be exactly
the tickets the gate runs. Then the same rules seen end to end: dispatchers sharing a keyed server.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher import CallStatus, Dispatcher, ToolCall
from dispatcher._core._gate import Gate, Ticket, TicketState
from dispatcher.examples import Workspace
from dispatcher.fleet import FleetServer, RedisCoordinator
from dispatcher.fleet._config import hold_locks
from dispatcher.fleet._lua import ACQUIRE, RELEASE

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer

KEYS = ("", "d", "d/a", "d/b", "d/a/x", "e")
SHARED = FleetServer(shared_state=True, max_write_time=0)

step = st.one_of(
    st.tuples(st.just("submit"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=2), st.booleans()),
    st.tuples(st.just("end"), st.integers(min_value=0, max_value=30)),
)


def redis_keys(namespace: str) -> list[str]:
    prefix = f"{namespace}:server:ws:"
    names = ("queue", "waiting", "waiting_exp", "holders", "holders_exp", "seq", "meta", "tokens", "fence")
    return [prefix + name for name in names]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, max_size=25), limit=st.sampled_from([0, 1, 2, 3]))
def test_redis_grants_exactly_what_the_gate_starts(
    redis_server: RedisServer, steps: list[tuple[Any, ...]], limit: int
) -> None:
    """Any sequence of keyed reads and writes, limit or not: after every step Redis holds what the gate runs."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        acquire, release = client.register_script(ACQUIRE), client.register_script(RELEASE)
        namespace = f"model-{uuid.uuid4().hex[:8]}"
        keys = redis_keys(namespace)
        # No quiet period: this Redis instance is the one that has always held this namespace's state.
        run_id = client.info("server")["run_id"]
        client.hset(keys[6], mapping={"run_id": run_id, "quiet_until": 0, "epoch": 1})
        args: list[str | int] = [60_000, limit, f"{namespace}:wake:", 0, 0]
        gate: Gate[str] = Gate(limit or None)
        tickets: list[Ticket[str]] = []
        for number, action in enumerate(steps):
            if action[0] == "submit":
                _, call_keys, exclusive = action
                lease = f"t:{number}"
                tickets.append(gate.submit(lease, exclusive=exclusive, keys=tuple(call_keys)))
                acquire(keys=keys, args=[*args, lease, hold_locks(SHARED, exclusive, call_keys)])
            else:
                open_tickets = [t for t in tickets if t.state in (TicketState.PENDING, TicketState.RUNNING)]
                if not open_tickets:
                    continue
                ticket = open_tickets[action[1] % len(open_tickets)]
                if ticket.state is TicketState.RUNNING:
                    gate.finish(ticket)
                else:
                    gate.withdraw(ticket)
                release(keys=keys, args=[*args, ticket.item, "0"])
            while gate.take() is not None:
                pass
            running = {t.item for t in tickets if t.state is TicketState.RUNNING}
            assert set(client.hkeys(keys[3])) == running, (steps[: number + 1], limit)
    finally:
        client.close()


def test_the_model_check_can_tell_a_whole_server_hold_from_a_keyed_one(redis_server: RedisServer) -> None:
    """The oracle: holds that ignore their keys (the old whole-server rule) grant less than the gate starts."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        acquire = client.register_script(ACQUIRE)
        keys = redis_keys("oracle")
        client.hset(keys[6], mapping={"run_id": client.info("server")["run_id"], "quiet_until": 0, "epoch": 1})
        args: list[str | int] = [60_000, 0, "oracle:wake:", 0, 0]
        for lease in ("t:0", "t:1"):
            acquire(keys=keys, args=[*args, lease, hold_locks(SHARED, True, ())])
        assert client.hkeys(keys[3]) == ["t:0"], "two whole-server writes must not both hold"
        gate: Gate[str] = Gate()
        gate.submit("a", exclusive=True, keys=("d/a",))
        gate.submit("b", exclusive=True, keys=("d/b",))
        assert gate.take() is not None and gate.take() is not None, "the gate starts writes on other keys together"
    finally:
        client.close()


@pytest.mark.anyio
async def test_dispatchers_overlap_writes_on_different_keys_only(redis_server: RedisServer) -> None:
    """Two coordinated dispatchers, a keyed shared-state server: writes on one note never overlap; on two, they do."""
    # Writes long beside the gaps between them (a release, Redis, the next grant): on a loaded machine those
    # took longer than 0.05 s writes, and one run's writes of the two notes happened never to overlap.
    workspace = Workspace(latency=0.25)
    namespace = f"keys-{uuid.uuid4().hex[:8]}"

    def fleet() -> RedisCoordinator:
        # Leases of 3 s, renewed every third: at 0.5 s a loaded machine's stalled loop lost a hold (the call
        # FAILED), which this test is not about; at load average 24 a grant's reply took 1.5 s to be read.
        return RedisCoordinator(
            redis_server.url, namespace=namespace, servers={"ws": SHARED}, lease_ttl=3.0, recheck=0.1
        )

    first, second = fleet(), fleet()
    statuses: list[CallStatus] = []

    async def agent(coordinator: RedisCoordinator, note: str) -> None:
        async with Dispatcher(coordinator=coordinator) as dispatcher:
            keys = {"set_note": lambda arguments: arguments["name"]}
            await dispatcher.connect("ws", workspace.server, trusted=True, domain="ws", keys=keys)
            for round_ in range(4):
                results = await dispatcher.dispatch([ToolCall(str(round_), "set_note", {"name": note, "text": "t"})])
                statuses.extend(result.status for result in results)

    with anyio.fail_after(60):
        async with first, second, anyio.create_task_group() as tg:
            for coordinator in (first, second):
                for note in ("a", "a", "b"):
                    tg.start_soon(agent, coordinator, note)
    assert statuses == [CallStatus.OK] * 24
    writes = [run for run in workspace.ledger if run.tool == "set_note"]
    same = [(x, y) for x in writes for y in writes if x is not y and x.arguments == y.arguments and x.overlaps(y)]
    assert same == [], "two writes of one note overlapped"
    assert any(x.overlaps(y) for x in writes for y in writes if x.arguments != y.arguments), (
        "writes of different notes never overlapped: the fleet held the whole server"
    )


# Incompatible modes on one path (IS 0, IX 1, S 2, X 3), as the scripts and the gate decide.
_INCOMPATIBLE = {0: {3}, 1: {2, 3}, 2: {1, 3}, 3: {0, 1, 2, 3}}


def lock_conflict(first: list[Any], second: list[Any]) -> bool:
    """Whether two holds' lock lists conflict."""
    modes = dict(zip(first[::2], first[1::2], strict=True))
    pairs = zip(second[::2], second[1::2], strict=True)
    return any(path in modes and modes[path] in _INCOMPATIBLE[mode] for path, mode in pairs)


def test_the_locks_a_hold_sends_are_bounded_and_only_ever_coarser() -> None:
    """Deep, many or long keys (a model chooses arguments) reach Redis coarsened, conflicting with at least as much."""
    deep = "d/" + "/".join(f"s{index}" for index in range(400))
    many = [f"d/file{index}" for index in range(100)]
    long = "d/" + "x" * 1000
    for keys in ([deep], many, [long], [deep, *many, long]):
        locks = json.loads(hold_locks(SHARED, True, keys))
        assert len(json.dumps(locks)) < 4000, keys
        # Coarser, never finer: the hold still conflicts with a read of each of its keys, as in the gate.
        for key in keys:
            assert lock_conflict(locks, json.loads(hold_locks(SHARED, False, [key]))), key
    assert json.loads(hold_locks(SHARED, True, [deep]))[0:2] == ["", 1]
    assert json.loads(hold_locks(SHARED, True, many)) == ["", 1, "d", 3], "100 keys under d: the whole domain"
    assert json.loads(hold_locks(SHARED, False, [long]))[2] == "d"
    assert json.loads(hold_locks(SHARED, False, [long]))[4].startswith("#"), "a long path is sent as its digest"
    assert hold_locks(SHARED, True, [f"k{index}" for index in range(40)]) == '["",3]', "40 domains: the whole server"
