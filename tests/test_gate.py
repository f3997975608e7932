"""Properties of the pure parts of scheduling: the plan and the admission gate."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.reference import ideal_makespan, plan
from dispatcher._gate import Gate, Ticket, TicketState


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


@settings(max_examples=300)
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
