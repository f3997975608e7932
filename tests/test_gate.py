"""Properties of the pure parts of scheduling: the plan and the admission gate."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.reference import KeyedCall, ideal_keyed_makespan, ideal_makespan, keyed_schedule, plan
from dispatcher._core._gate import Gate, Ticket, TicketState, conflicts, normalize_keys
from tests.chaos.harness import scale


@given(st.lists(st.booleans(), max_size=60))
def test_plan_covers_every_call_once_in_order(exclusive: list[bool]) -> None:
    """Every call is in exactly one step, steps keep request order, exclusive steps hold one call."""
    steps = plan(exclusive)
    flat = [index for step in steps for index in step.indices]
    assert flat == list(range(len(exclusive)))
    for step in steps:
        assert all(exclusive[i] == step.exclusive for i in step.indices)
        if step.exclusive:
            assert len(step.indices) == 1
    # Two concurrent steps are never adjacent: they would have been one step.
    for first, second in itertools.pairwise(steps):
        assert first.exclusive or second.exclusive


def test_ideal_makespan_counts_rounds() -> None:
    """Reads in one step take ceil(n / limit) rounds; each write takes one."""
    batch = [False] * 5 + [True] + [False] * 2
    assert ideal_makespan(batch, 1.0) == 3.0
    assert ideal_makespan(batch, 1.0, limit=2) == 3 + 1 + 1
    assert ideal_makespan([], 1.0) == 0.0


operations = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.booleans(), st.sampled_from([None, "a", "b"])),
        st.tuples(st.just("submit_held"), st.booleans(), st.sampled_from([None, "a", "b"])),
        st.tuples(st.just("release"), st.integers(0, 1000), st.none()),
        st.tuples(st.just("finish"), st.integers(0, 1000), st.none()),
        st.tuples(st.just("withdraw"), st.integers(0, 1000), st.none()),
    ),
    max_size=120,
)


@settings(max_examples=scale(100, 300))  # make stress runs the long form
@given(
    ops=operations,
    limit=st.one_of(st.none(), st.integers(1, 4)),
    limit_a=st.one_of(st.none(), st.integers(1, 3)),
)
def test_gate_invariants(ops: list[tuple[str, object, object]], limit: int | None, limit_a: int | None) -> None:
    """Under any interleaving: limits hold, exclusive calls run alone, and order matches the plan."""
    gate: Gate[int] = Gate(limit)
    gate.set_server_limit("a", limit_a)
    tickets: list[Ticket[int]] = []
    running: list[Ticket[int]] = []
    started: list[int] = []
    finished: set[int] = set()

    def admit() -> None:
        while (ticket := gate.take()) is not None:
            check_start(ticket)
            running.append(ticket)
            started.append(ticket.item)

    def check_start(ticket: Ticket[int]) -> None:
        index = ticket.item
        assert limit is None or gate.running <= limit
        assert limit_a is None or gate.server_running("a") <= limit_a
        others = [t for t in running if t is not ticket]
        if ticket.exclusive:
            assert not others, "an exclusive call started while others ran"
            # Everything submitted before it has ended or was withdrawn.
            for earlier in tickets[:index]:
                assert earlier.state in (TicketState.DONE, TicketState.WITHDRAWN)
        assert not any(t.exclusive for t in others), "a call started while an exclusive call ran"
        # No call starts before an earlier exclusive call that is still waiting.
        for earlier in tickets[:index]:
            assert not (earlier.exclusive and earlier.state in (TicketState.PENDING, TicketState.HELD))
        assert ticket.state is TicketState.RUNNING

    for op, arg, server in ops:
        if op in ("submit", "submit_held"):
            held = op == "submit_held"
            tickets.append(gate.submit(len(tickets), exclusive=bool(arg), server=server, held=held))
        elif op == "release":
            waiting = [t for t in tickets if t.state is TicketState.HELD]
            if waiting:
                gate.release(waiting[int(arg) % len(waiting)])  # type: ignore[call-overload]
        elif op == "finish" and running:
            ticket = running.pop(int(arg) % len(running))  # type: ignore[call-overload]
            gate.finish(ticket)
            finished.add(ticket.item)
        elif op == "withdraw" and tickets:
            ticket = tickets[int(arg) % len(tickets)]  # type: ignore[call-overload]
            was_waiting = ticket.state in (TicketState.PENDING, TicketState.HELD)
            assert gate.withdraw(ticket) == was_waiting
        admit()
    # Drain: once released, everything still waiting eventually runs; nothing is lost or run twice.
    for ticket in tickets:
        if ticket.state is TicketState.HELD:
            gate.release(ticket)
    admit()
    while running:
        gate.finish(running.pop(0))
        admit()
    assert gate.idle and gate.running == 0
    assert len(started) == len(set(started))
    for ticket in tickets:
        assert ticket.state in (TicketState.DONE, TicketState.WITHDRAWN)


def test_parked_reads_let_other_servers_go_first() -> None:
    """A read for a server at its cap does not hold up reads for other servers."""
    gate: Gate[str] = Gate(None)
    gate.set_server_limit("a", 1)
    a1 = gate.submit("a1", exclusive=False, server="a")
    a2 = gate.submit("a2", exclusive=False, server="a")
    b1 = gate.submit("b1", exclusive=False, server="b")
    assert gate.take() is a1
    assert gate.take() is b1
    assert gate.take() is None
    gate.finish(a1)
    assert gate.take() is a2


def test_reads_join_the_running_group_until_a_writer_queues() -> None:
    """New reads run alongside running reads, but not once a write is waiting (no writer starvation)."""
    gate: Gate[str] = Gate(None)
    r1 = gate.submit("r1", exclusive=False)
    assert gate.take() is r1
    r2 = gate.submit("r2", exclusive=False)
    assert gate.take() is r2
    w = gate.submit("w", exclusive=True)
    r3 = gate.submit("r3", exclusive=False)
    assert gate.take() is None
    gate.finish(r1)
    gate.finish(r2)
    assert gate.take() is w
    assert gate.take() is None
    gate.finish(w)
    assert gate.take() is r3


def test_withdrawing_a_queued_write_releases_later_calls() -> None:
    """A withdrawn write no longer blocks the calls behind it."""
    gate: Gate[str] = Gate(None)
    r1 = gate.submit("r1", exclusive=False)
    assert gate.take() is r1
    w = gate.submit("w", exclusive=True)
    r2 = gate.submit("r2", exclusive=False)
    assert gate.withdraw(w)
    gate.finish(r1)
    assert gate.take() is r2


def test_held_write_blocks_later_calls_until_released() -> None:
    """A held write keeps its place: later calls wait for it, earlier ones are unaffected."""
    gate: Gate[str] = Gate(None)
    r1 = gate.submit("r1", exclusive=False)
    w = gate.submit("w", exclusive=True, held=True)
    r2 = gate.submit("r2", exclusive=False)
    assert gate.take() is r1
    gate.finish(r1)
    assert gate.take() is None
    gate.release(w)
    assert gate.take() is w
    gate.finish(w)
    assert gate.take() is r2


def test_held_read_is_skipped_by_its_group() -> None:
    """A held read lets the other reads of its group run, and runs itself once released."""
    gate: Gate[str] = Gate(None)
    r1 = gate.submit("r1", exclusive=False, held=True)
    r2 = gate.submit("r2", exclusive=False)
    w = gate.submit("w", exclusive=True)
    assert gate.take() is r2
    assert gate.take() is None
    gate.release(r1)
    assert gate.take() is r1
    gate.finish(r2)
    gate.finish(r1)
    assert gate.take() is w


# Conflict keys ---------------------------------------------------------------------------------------

KEYS = ["", "a", "a/x", "a/y", "a/x/1", "b", "b/z", "c"]
key_sets = st.lists(st.sampled_from(KEYS), min_size=1, max_size=2).map(tuple)
servers = st.sampled_from([None, "s", "t"])


class Model:
    """The conflict rule by brute force: which call the gate must start next."""

    def __init__(self, limit: int | None, server_limits: dict[str, int]) -> None:
        self.limit = limit
        self.server_limits = server_limits
        self.keys: list[tuple[str, ...]] = []
        self.exclusive: list[bool] = []
        self.server: list[str | None] = []
        self.state: list[TicketState] = []

    def submit(self, keys: tuple[str, ...], exclusive: bool, server: str | None, held: bool) -> None:
        self.keys.append(keys)
        self.exclusive.append(exclusive)
        self.server.append(server)
        self.state.append(TicketState.HELD if held else TicketState.PENDING)

    def blocked(self, i: int) -> bool:
        live = (TicketState.PENDING, TicketState.HELD, TicketState.RUNNING)
        return any(
            self.state[j] in live
            and (j < i or self.state[j] is TicketState.RUNNING)
            and (self.exclusive[i] or self.exclusive[j])
            and conflicts(self.keys[i], self.keys[j])
            for j in range(len(self.keys))
            if j != i
        )

    def running(self, server: str | None = None) -> int:
        return sum(
            1
            for j, state in enumerate(self.state)
            if state is TicketState.RUNNING and (server is None or self.server[j] == server)
        )

    def next(self) -> int | None:
        if self.limit is not None and self.running() >= self.limit:
            return None
        for i, state in enumerate(self.state):
            if state is not TicketState.PENDING or self.blocked(i):
                continue
            server = self.server[i]
            if server in self.server_limits and self.running(server) >= self.server_limits[server]:
                continue
            return i
        return None


Op = tuple[str, int, bool, tuple[str, ...], str | None]
keyed_operations = st.lists(
    st.tuples(
        st.sampled_from(["submit", "submit", "submit_held", "release", "finish", "finish", "withdraw", "reclassify"]),
        st.integers(0, 1000),
        st.booleans(),
        key_sets,
        servers,
    ),
    max_size=80,
)


def run_against_model(
    ops: list[Op], limit: int | None, server_limits: dict[str, int], gate: Gate[int] | None = None
) -> None:
    """Apply the operations to a gate and to the model; after each, every start must be the model's."""
    gate = gate if gate is not None else Gate(limit)
    for name, cap in server_limits.items():
        gate.set_server_limit(name, cap)
    model = Model(limit, server_limits)
    tickets: list[Ticket[int]] = []

    def drain() -> None:
        while True:
            expected = model.next()
            ticket = gate.take()
            assert (ticket.item if ticket is not None else None) == expected, (expected, ticket)
            if ticket is None:
                return
            model.state[ticket.item] = TicketState.RUNNING

    def pick(states: tuple[TicketState, ...], index: int) -> int | None:
        choices = [i for i, state in enumerate(model.state) if state in states]
        return choices[index % len(choices)] if choices else None

    for op, index, flag, keys, server in ops:
        if op in ("submit", "submit_held"):
            held = op == "submit_held"
            tickets.append(gate.submit(len(tickets), exclusive=flag, server=server, held=held, keys=keys))
            model.submit(keys, flag, server, held)
        elif op == "release" and (i := pick((TicketState.HELD,), index)) is not None:
            gate.release(tickets[i])
            model.state[i] = TicketState.PENDING
        elif op == "finish" and (i := pick((TicketState.RUNNING,), index)) is not None:
            gate.finish(tickets[i])
            model.state[i] = TicketState.DONE
        elif op == "withdraw" and tickets:
            i = index % len(tickets)
            waiting = model.state[i] in (TicketState.PENDING, TicketState.HELD)
            assert gate.withdraw(tickets[i]) == waiting
            if waiting:
                model.state[i] = TicketState.WITHDRAWN
        elif op == "reclassify" and tickets:
            i = index % len(tickets)
            waiting = model.state[i] in (TicketState.PENDING, TicketState.HELD)
            held = server == "t"  # reuse the drawn server as a coin for the hold
            assert gate.reclassify(tickets[i], exclusive=flag, keys=keys, held=held) == waiting
            if waiting:
                model.exclusive[i], model.keys[i] = flag, keys
                model.state[i] = TicketState.HELD if held else TicketState.PENDING
        drain()
    # Drain: once released, everything still waiting runs; nothing is lost or run twice.
    for i, state in enumerate(model.state):
        if state is TicketState.HELD:
            gate.release(tickets[i])
            model.state[i] = TicketState.PENDING
    drain()
    while (i := pick((TicketState.RUNNING,), 0)) is not None:
        gate.finish(tickets[i])
        model.state[i] = TicketState.DONE
        drain()
    assert gate.idle and gate.running == 0
    assert all(state in (TicketState.DONE, TicketState.WITHDRAWN) for state in model.state)
    assert [t.state for t in tickets] == model.state


@settings(max_examples=scale(100, 400), deadline=None)  # make stress runs the long form
@given(
    ops=keyed_operations,
    limit=st.one_of(st.none(), st.integers(1, 4)),
    cap_s=st.one_of(st.none(), st.integers(1, 2)),
)
def test_gate_matches_the_brute_force_model(ops: list[Op], limit: int | None, cap_s: int | None) -> None:
    """Random keys, reads and writes, limits, holds, withdrawals, reclassifications: every start is the model's."""
    run_against_model(ops, limit, {"s": cap_s} if cap_s is not None else {})


class KeysIgnored(Gate[int]):
    """A broken gate that puts every call on its own key: nothing ever conflicts."""

    counter = 0

    def submit(self, item: int, **kwargs: object) -> Ticket[int]:
        KeysIgnored.counter += 1
        kwargs["keys"] = (f"own/{KeysIgnored.counter}",)
        return super().submit(item, **kwargs)  # type: ignore[arg-type]


def test_the_model_catches_a_gate_that_ignores_conflicts() -> None:
    """The model-based check fails on a gate that lets a write overlap a conflicting read."""
    ops: list[Op] = [("submit", 0, False, ("a",), None), ("submit", 0, True, ("a/x",), None)]
    with pytest.raises(AssertionError):
        run_against_model(ops, None, {}, KeysIgnored(None))


def test_root_keys_are_the_ordered_barriers() -> None:
    """With every call on the root key, calls start exactly in the steps of the ordered-barrier plan."""
    exclusive = [False, False, True, False, True, True, False, False]
    gate: Gate[int] = Gate(None)
    tickets = [gate.submit(i, exclusive=e) for i, e in enumerate(exclusive)]
    for step in plan(exclusive):
        started = []
        while (ticket := gate.take()) is not None:
            started.append(ticket.item)
        assert tuple(started) == step.indices
        for i in started:
            gate.finish(tickets[i])
    assert gate.idle


def test_disjoint_domains_do_not_wait_for_each_other() -> None:
    """A write in one domain runs beside a write in another; a write to the parent waits for both."""
    gate: Gate[str] = Gate(None)
    w1 = gate.submit("w1", exclusive=True, keys=("github/repo:a",))
    w2 = gate.submit("w2", exclusive=True, keys=("github/repo:b",))
    w3 = gate.submit("w3", exclusive=True, keys=("fs",))
    parent = gate.submit("parent", exclusive=True, keys=("github",))
    r = gate.submit("r", exclusive=False, keys=("github/repo:c",))
    assert [gate.take(), gate.take(), gate.take(), gate.take()] == [w1, w2, w3, None]
    gate.finish(w1)
    assert gate.take() is None
    gate.finish(w2)
    assert gate.take() is parent
    assert gate.take() is None  # the read under github waits for the write to all of github
    gate.finish(parent)
    assert gate.take() is r


def test_reads_under_a_writing_key_wait_but_siblings_do_not() -> None:
    """A write to a/x blocks reads of a and a/x/1 submitted after it, not reads of a/y."""
    gate: Gate[str] = Gate(None)
    w = gate.submit("w", exclusive=True, keys=("a/x",))
    r_parent = gate.submit("r_parent", exclusive=False, keys=("a",))
    r_child = gate.submit("r_child", exclusive=False, keys=("a/x/1",))
    r_sibling = gate.submit("r_sibling", exclusive=False, keys=("a/y",))
    assert [gate.take(), gate.take()] == [w, r_sibling]
    assert gate.take() is None
    gate.finish(w)
    assert [gate.take(), gate.take(), gate.take()] == [r_parent, r_child, None]


def test_a_write_is_not_starved_by_a_stream_of_reads() -> None:
    """Reads of a key submitted after a queued write of it wait for the write, whatever the limit."""
    gate: Gate[str] = Gate(1)
    r1 = gate.submit("r1", exclusive=False, keys=("a",))
    assert gate.take() is r1
    w = gate.submit("w", exclusive=True, keys=("a",))
    later = [gate.submit(f"r{i}", exclusive=False, keys=("a",)) for i in range(5)]
    other = gate.submit("other", exclusive=False, keys=("b",))
    assert gate.take() is None  # the limit is full
    gate.finish(r1)
    assert gate.take() is w  # the oldest ready call gets the free slot
    gate.finish(w)
    assert gate.take() is later[0]
    assert other.state is TicketState.PENDING


def test_reclassified_read_waits_for_an_exclusive_turn_at_its_place() -> None:
    """A queued read turned exclusive waits for earlier and running later reads; later calls wait for it."""
    gate: Gate[str] = Gate(None)
    w0 = gate.submit("w0", exclusive=True, keys=("a",))
    r = gate.submit("r", exclusive=False, keys=("a",))
    r_later = gate.submit("r_later", exclusive=False, keys=("a",))
    assert gate.take() is w0
    gate.finish(w0)
    assert gate.take() is r
    assert gate.take() is r_later
    gate.finish(r)
    # A queued read of a: held back behind a write so that it has not started.
    w1 = gate.submit("w1", exclusive=True, keys=("b",))
    queued = gate.submit("queued", exclusive=False, keys=("a",), held=True)
    after = gate.submit("after", exclusive=False, keys=("a",))
    assert gate.take() is w1
    assert gate.take() is after
    assert gate.reclassify(queued, exclusive=True, held=False)
    assert gate.take() is None  # r_later and after are running: they conflict with it now
    gate.finish(r_later)
    assert gate.take() is None
    gate.finish(after)
    assert gate.take() is queued
    late = gate.submit("late", exclusive=False, keys=("a/x",))
    assert gate.take() is None
    gate.finish(queued)
    assert gate.take() is late
    assert not gate.reclassify(late, exclusive=True)  # already running: nothing changes


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(key_sets, st.booleans(), st.integers(1, 5)), max_size=25),
    st.one_of(st.none(), st.integers(1, 3)),
)
def test_gate_follows_the_reference_schedule(calls: list[tuple[tuple[str, ...], bool, int]], limit: int | None) -> None:
    """Run on a virtual clock, the gate starts every call of a keyed batch when `keyed_schedule` says."""
    batch = [KeyedCall(keys, exclusive, latency) for keys, exclusive, latency in calls]
    expected = keyed_schedule(batch, limit)
    gate: Gate[int] = Gate(limit)
    tickets = [gate.submit(i, exclusive=c.exclusive, keys=c.keys) for i, c in enumerate(batch)]
    now = 0.0
    starts: dict[int, float] = {}
    running: list[tuple[float, int]] = []
    while True:
        while (ticket := gate.take()) is not None:
            starts[ticket.item] = now
            running.append((now + batch[ticket.item].latency, ticket.item))
        if not running:
            break
        now = min(end for end, _ in running)
        for end, i in sorted(running):
            if end == now:
                gate.finish(tickets[i])
        running = [(end, i) for end, i in running if end != now]
    assert [starts[i] for i in range(len(batch))] == [start for start, _ in expected]
    assert ideal_keyed_makespan(batch, limit) == max((end for _, end in expected), default=0.0)


def test_normalize_keys() -> None:
    """Keys are canonical: empty segments dropped, keys under another key of the set removed, root wins."""
    assert normalize_keys(["a/x", "a", "b//c/"]) == ("a", "b/c")
    assert normalize_keys(["a/x", "", "b"]) == ("",)
    assert normalize_keys([]) == ("",)
    assert conflicts(["a"], ["a/x"]) and conflicts([""], ["z"]) and not conflicts(["a/x"], ["a/xy"])
