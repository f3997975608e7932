"""The call lifecycle (`dispatcher._core._lifecycle`) against a brute-force model of its rule, with no event loop.

The model below is written from the rule in the module's docstring, not from its code: which operation
is allowed in which phase, where it leads, and which status each ending gives in each phase. Random
sequences of operations (every transition, every ending, at any time, many times over) are applied to a
real `CallRecord` and to the model; after each step they must agree, and whatever happens the owner hears
of the call exactly once, with the result it keeps.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from dispatcher import CallStatus, Effect, ToolCall, ToolResult
from dispatcher._core._annotations import effective_annotations
from dispatcher._core._catalog import ToolEntry
from dispatcher._core._errors import LifecycleError
from dispatcher._core._lifecycle import MAX_ERROR, OUTCOMES, CallRecord, Ending, Phase
from tests.chaos.harness import scale

Q, A, D, R, S = Phase.QUEUED, Phase.AWAITING_APPROVAL, Phase.ADMITTED, Phase.RUNNING, Phase.SETTLED

# The rule, spelled out: where each transition may happen and where it leads (None: it stays).
MOVES: dict[str, dict[Phase, Phase]] = {
    "enter": {Q: Q},
    "enter_held": {Q: A},
    "hold": {Q: A, A: A},
    "release": {A: Q},
    "admit": {Q: D},
    "start": {D: R},
    "attempted": {R: R},
    "failed_attempt": {R: R},  # and a no-op once SETTLED (a late failure, as a late answer)
    "answered": {R: S},
    "tool_error": {R: S},
    "ended": {R: S},
    # `waiting(None)` and `ended` in one step: it waits for nothing any more, and nothing is interrupted.
    "finished": {R: S},
}

# Which status an ending gives in each phase it may happen in; anything else is a bug of the driver.
CANCELLED = CallStatus.CANCELLED
SPEC: dict[Ending, dict[Phase, CallStatus]] = {
    Ending.REJECTED: {Q: CallStatus.FAILED, A: CallStatus.FAILED, D: CallStatus.FAILED},
    Ending.DENIED: {A: CallStatus.DENIED, D: CallStatus.DENIED},
    Ending.CANCELLED: {Q: CANCELLED, A: CANCELLED, D: CANCELLED, R: CANCELLED},
    Ending.CLOSED: {Q: CANCELLED, A: CANCELLED, D: CANCELLED, R: CANCELLED},
    Ending.TIMED_OUT: {R: CallStatus.TIMEOUT},
    Ending.SELF_CANCELLED: {D: CANCELLED, R: CANCELLED},
    Ending.NO_HOLD: {D: CallStatus.FAILED},
    Ending.HOLD_LOST: {D: CallStatus.FAILED, R: CallStatus.FAILED},
    Ending.HOLD_LOST_IN_FLIGHT: {R: CallStatus.TIMEOUT},
    Ending.SKIPPED: {Q: CallStatus.FAILED, A: CallStatus.FAILED},
}


class Ledger:
    """The owner: records every result it is told of."""

    def __init__(self) -> None:
        self.told: list[tuple[CallRecord, ToolResult]] = []

    def settled(self, record: CallRecord, result: ToolResult) -> None:
        self.told.append((record, result))


class Interrupted:
    """What a call waits on: counts how often it was interrupted."""

    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


def _entry(open_world: bool) -> ToolEntry:
    annotations = ToolAnnotations(read_only_hint=True, open_world_hint=open_world)
    effective = effective_annotations(annotations, trusted=True)
    return ToolEntry("lookup", "s", "lookup", effective, declared_annotations=annotations, trusted=True)


ANSWER = CallToolResult(content=[TextContent(type="text", text="fine")])
FAILURE = CallToolResult(content=[TextContent(type="text", text="no")], is_error=True)

operation = st.one_of(
    st.tuples(st.sampled_from(sorted(MOVES)), st.just(None)),
    st.tuples(st.just("settle"), st.sampled_from(list(Ending))),
    st.tuples(st.just("interruptible"), st.none()),
    st.tuples(st.just("cancel_requested"), st.none()),
    st.tuples(st.just("sent"), st.none()),
    # `waiting(interrupt)`, `start` and `attempted` in one step.
    st.tuples(st.just("begin"), st.none()),
)


def _act(record: CallRecord, op: str, now: float, error: str) -> Any:
    ticket: Any = types.SimpleNamespace(keys=("",))
    if op == "enter":
        return record.enter(ticket, held=False)
    if op == "enter_held":
        return record.enter(ticket, held=True)
    if op == "start":
        return record.start(now)
    if op == "failed_attempt":
        return record.failed_attempt(error)
    if op == "answered":
        return record.answered(ANSWER, None, now)
    if op == "tool_error":
        return record.answered(FAILURE, "no", now)
    if op == "ended":
        return record.ended(CallStatus.FAILED, "down", now)
    if op == "finished":
        return record.finished(CallStatus.FAILED, "down", now, None, False)
    return getattr(record, op)()


def run_against_model(ops: list[tuple[str, Any]], record_type: type[CallRecord] = CallRecord) -> None:
    """Apply `ops` to a record and to the model; fail on the first disagreement."""
    ledger = Ledger()
    record = record_type(ToolCall("c", "lookup"), ledger, None, queued_at=1.0)
    record.resolve(_entry(open_world=True))
    phase = Q
    attempts = 0
    errors: list[str] = []
    started = False
    interrupt: Interrupted | None = None
    # The effect model: nothing sent, sent (and no answer since), answered.
    moment = Effect.NEVER_RAN
    now = 2.0
    for op, arg in ops:
        now += 1.0
        if op == "sent":
            record.sent()
            if phase is R:
                moment = Effect.UNKNOWN  # a later attempt sent again: unknown until it answers
            continue
        if op == "interruptible":
            interrupt = Interrupted()
            record.waiting(interrupt)
            if phase is S:
                assert interrupt.cancelled == 1, "a settled call was left waiting"
            continue
        if op == "cancel_requested":
            record.request_cancel()
            if phase is not S and interrupt is not None:
                assert interrupt.cancelled >= 1
            continue
        if op == "begin":
            given = Interrupted()
            if phase is S:
                assert record.begin(given, now) is False, "a settled call began"
                assert given.cancelled == 1, "a settled call was left waiting"
                continue
            if phase is not D:
                with pytest.raises(LifecycleError):
                    record.begin(given, now)
                assert record.phase is phase and given.cancelled == 0, "a refused begin changed the call"
                continue
            assert record.begin(given, now) is True
            phase, started, interrupt = R, True, given
            attempts += 1
            assert record.phase is R and record.interrupt is given and given.cancelled == 0
            continue
        if op == "settle":
            ending: Ending = arg
            if phase is S:
                assert record.settle(ending, now, "late") is False, "a settled call settled again"
                continue
            status = SPEC.get(ending, {}).get(phase)
            if status is None:
                with pytest.raises(LifecycleError):
                    record.settle(ending, now, "x")
                assert record.phase is phase, "a refused ending changed the phase"
                continue
            assert record.settle(ending, now, "detail") is True
            assert record.outcome is not None and record.outcome.status is status
            assert record.outcome.attempt_errors == tuple(errors), "earlier attempts' errors are kept"
            phase = S
        else:
            target = MOVES[op].get(phase)

            def act(op: str = op, now: float = now) -> Any:
                return _act(record, op, now, f"e{len(errors)}")

            if phase is S and op in ("answered", "tool_error", "ended", "finished", "start", "failed_attempt"):
                before = record.outcome
                assert act() is False, "a settled call was answered, started or failed again"
                assert record.outcome is before, "a late answer or failure changed a settled call"
                continue
            if target is None:
                with pytest.raises(LifecycleError):
                    act()
                assert record.phase is phase, "a refused transition changed the phase"
                continue
            cancels = interrupt.cancelled if interrupt is not None else 0
            result = act()
            if op in ("answered", "tool_error"):
                moment = Effect.RAN
            if op == "finished":
                assert interrupt is None or interrupt.cancelled == cancels, "a call that finished was interrupted"
                interrupt = None  # it waits for nothing any more
            if op in ("answered", "tool_error", "ended", "finished"):
                assert result is True
                expected = {
                    "answered": CallStatus.OK,
                    "tool_error": CallStatus.TOOL_ERROR,
                    "ended": CallStatus.FAILED,
                    "finished": CallStatus.FAILED,
                }
                assert record.outcome is not None and record.outcome.status is expected[op]
                # The last attempt's error is the call's; only the earlier ones are attempt errors.
                earlier = errors[:-1] if op != "answered" and errors else errors
                assert record.outcome.attempt_errors == tuple(earlier)
            if op == "start":
                started = True
            elif op == "attempted":
                attempts += 1
            elif op == "failed_attempt":
                errors.append(f"e{len(errors)}")
            phase = target
        assert record.phase is phase
        if phase is S:
            outcome = record.outcome
            assert outcome is not None
            assert outcome.attempts == attempts
            assert (outcome.started_at is not None) == started
            assert outcome.finished_at == now and outcome.queued_at == 1.0
            # The effect is read from the last moment reached, never from how the call ended.
            assert outcome.effect is moment, (outcome.effect, moment)
            # An open-world tool that ran sends back untrusted content; one that never ran, nothing.
            assert outcome.untrusted_content == (attempts > 0)
            assert record.ticket is None and record.owner is None and record.prepared is None
            assert record.interrupt is None
            if interrupt is not None:
                assert interrupt.cancelled >= 1, "a settled call still waits on something"
    assert len(ledger.told) == (1 if phase is S else 0), "the owner heard of the call a number of times"
    if ledger.told:
        told_record, told_result = ledger.told[0]
        assert told_record is record and told_result is record.outcome


# 300 sequences in make test (about 1.7 s of CPU), 1,500 in make stress.
@settings(max_examples=scale(300, 1500), deadline=None)
@given(ops=st.lists(operation, max_size=30))
def test_the_lifecycle_matches_the_model(ops: list[tuple[str, Any]]) -> None:
    """Random transitions and endings in any phase: the record follows the model, and settles once."""
    run_against_model(ops)


def test_every_ending_of_the_table_is_the_models() -> None:
    """The table holds exactly the (ending, phase) pairs of the rule, with the model's statuses."""
    assert {key: status for key, (status, _) in OUTCOMES.items()} == {
        (ending, phase): status for ending, phases in SPEC.items() for phase, status in phases.items()
    }


def test_the_error_of_each_ending_says_what_happened_and_when() -> None:
    """The same ending reads differently before the tool was sent anything and while it ran."""
    texts = {(ending, phase): text.format("X") for (ending, phase), (_, text) in OUTCOMES.items()}
    assert texts[Ending.CANCELLED, Q] == "cancelled before it started"
    assert texts[Ending.CANCELLED, A] == "cancelled while waiting for approval"
    assert texts[Ending.CANCELLED, R] == "cancelled while running"
    assert texts[Ending.CLOSED, R] == "the dispatcher closed"
    assert texts[Ending.TIMED_OUT, R] == "no result within call_timeout=Xs"


def test_a_long_error_is_cut_once_saying_how_long_it_was() -> None:
    """A tool can write any amount of error text; the result keeps the first MAX_ERROR characters."""
    ledger = Ledger()
    record = CallRecord(ToolCall("c", "lookup"), ledger, None, queued_at=0.0)
    record.resolve(_entry(open_world=False))
    record.enter(types.SimpleNamespace(keys=("",)), held=False)  # type: ignore[arg-type]
    record.admit()
    record.start(1.0)
    record.attempted()
    record.ended(CallStatus.FAILED, "x" * 5000, 2.0)
    assert record.outcome is not None and record.outcome.error is not None
    assert record.outcome.error.startswith("x" * MAX_ERROR)
    assert record.outcome.error.endswith("... (5,000 characters in all)")


class SettlesTwice(CallRecord):
    """A broken lifecycle: settling does not look at whether the call has settled already."""

    __slots__ = ()

    def settle(self, ending: Ending, now: float, detail: object = "", *, untrusted: bool = False) -> bool:
        if self.phase is Phase.SETTLED:
            self.phase = Phase.RUNNING  # forgets it ended: the guard a call site would otherwise need
        return super().settle(ending, now, detail, untrusted=untrusted)


class StartsUnadmitted(CallRecord):
    """A broken lifecycle: a call may start without the gate having admitted it."""

    __slots__ = ()

    def start(self, now: float) -> bool:
        if self.phase is not Phase.SETTLED:
            self.phase = Phase.ADMITTED
        return super().start(now)


@pytest.mark.parametrize(
    ("broken", "ops"),
    [
        (
            SettlesTwice,
            [("enter", None), ("admit", None), ("start", None), ("answered", None), ("settle", Ending.CANCELLED)],
        ),
        (StartsUnadmitted, [("enter", None), ("start", None)]),
    ],
)
def test_the_model_catches_a_broken_lifecycle(broken: type[CallRecord], ops: list[tuple[str, Any]]) -> None:
    """The model-based check fails on a record that settles twice, and on one that runs a call never admitted."""
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        run_against_model(ops, broken)
