"""The server-overlap check (`harness.check_server_overlaps`) on hand-written ledgers: what it allows, what it reports.

An exclusive call that started on the server while a call the client had abandoned still ran there is the
documented exception (RELIABILITY.md, "What it cannot prove"): counted, not reported, within its bound (the
dispatcher gave the other call up before it started this one). Everything else is a violation.
"""

from __future__ import annotations

from dispatcher import CallEvent, ToolCall
from tests.ledger import Entry

from . import harness
from .harness import FIGURES, call_key

WRITE_A = ToolCall("a", "append_note", {"name": "n", "text": "a"})
WRITE_B = ToolCall("b", "append_note", {"name": "n", "text": "b"})
KEYS = {call_key(call.name, call.arguments) for call in (WRITE_A, WRITE_B)}
A = call_key(WRITE_A.name, WRITE_A.arguments)


def entry(call: ToolCall, seq: int, start: int, end: int | None) -> Entry:
    """One execution of `call` in the ledger, from line `start` to line `end`."""
    return Entry(pid=1, seq=seq, tool=call.name, arguments=dict(call.arguments or {}), start=start, end=end)


def event(kind: str, call: ToolCall, attempt: int = 1) -> CallEvent:
    """A dispatcher event (only the order, kind and call matter to the check)."""
    return CallEvent(kind, call, 0.0, attempt=attempt)  # type: ignore[arg-type]


# b started on the server (line 2) while a ran on (lines 1-4).
OVERLAP = [entry(WRITE_A, 1, 1, 4), entry(WRITE_B, 2, 2, 3)]
IN_ORDER = [
    event("started", WRITE_A),
    event("finished", WRITE_A),
    event("started", WRITE_B),
    event("finished", WRITE_B),
]


def check(entries: list[Entry], **kwargs: object) -> tuple[list[str], int, int]:
    """The problems, and how many overlaps were counted as allowed and as violations (FIGURES left as it was)."""
    saved = FIGURES.snapshot()
    try:
        problems = harness.check_server_overlaps(entries, KEYS, **kwargs)  # type: ignore[arg-type]
        return problems, FIGURES.server_overlaps_after_abandoned_calls, FIGURES.exclusive_overlaps
    finally:
        FIGURES.restore(saved)


def test_writes_one_after_another_are_no_overlap() -> None:
    """Two writes, the second started after the first ended: nothing counted."""
    saved = FIGURES.snapshot()
    problems, allowed, violations = check([entry(WRITE_A, 1, 1, 2), entry(WRITE_B, 2, 3, 4)], abandoned=set())
    assert (problems, allowed - saved["server_overlaps_after_abandoned_calls"]) == ([], 0)
    assert violations == saved["exclusive_overlaps"]


def test_an_overlap_with_an_answered_call_is_reported() -> None:
    """A write that started on the server beside one the client was answered for is a violation."""
    problems, _, _ = check(OVERLAP, abandoned=set(), events=IN_ORDER)
    assert len(problems) == 1 and "answered" in problems[0], problems


def test_an_overlap_with_an_abandoned_call_is_counted_not_reported() -> None:
    """A write started after the dispatcher gave the one before it up: counted as the documented exception."""
    saved = FIGURES.snapshot()
    problems, allowed, violations = check(OVERLAP, abandoned={A}, events=IN_ORDER)
    assert problems == []
    assert allowed == saved["server_overlaps_after_abandoned_calls"] + 1
    assert violations == saved["exclusive_overlaps"]


def test_an_overlap_the_dispatcher_started_before_giving_the_other_up_is_reported() -> None:
    """Abandoned or not, a write the dispatcher started while it still waited for the other is a violation."""
    early = [
        event("started", WRITE_A),
        event("started", WRITE_B),
        event("finished", WRITE_A),
        event("finished", WRITE_B),
    ]
    problems, _, _ = check(OVERLAP, abandoned={A}, events=early)
    assert len(problems) == 1 and "before the dispatcher gave them up" in problems[0], problems


def test_a_retried_call_that_ran_once_on_the_server_was_answered_there() -> None:
    """A call retried and answered, run once by the server, is not abandoned: an overlap with it is reported.

    (The harness used to count every execution of a retried call as abandoned, hiding such overlaps.)
    """
    retried = {A}
    events = [event("started", WRITE_A), event("retried", WRITE_A, 2), *IN_ORDER[1:]]
    problems, _, _ = check(OVERLAP, abandoned=set(), retried=retried, events=events)
    assert len(problems) == 1, problems
    # Run twice on the server, the ledger cannot tell which execution was answered: allowed.
    twice = [entry(WRITE_A, 0, 0, 1), *OVERLAP]
    problems, _, _ = check(twice, abandoned=set(), retried=retried, events=events)
    assert problems == []


READ_1 = ToolCall("r1", "read_note", {"name": "r1"})
READ_2 = ToolCall("r2", "read_note", {"name": "r2"})
# A write the client gave up (its connection dropped) ran on (lines 1-5) while two reads started (lines 2 and 3),
# each beside the other: the chaos suite's http-drop round (seed 1643) on a loaded machine.
READS_BESIDE_A_WRITE = [entry(WRITE_A, 1, 1, 5), entry(READ_1, 2, 2, 6), entry(READ_2, 3, 3, 7)]
READS_AFTER_THE_WRITE = [
    event("started", WRITE_A),
    event("finished", WRITE_A),
    event("started", READ_1),
    event("started", READ_2),
    event("finished", READ_1),
    event("finished", READ_2),
]


def test_reads_overlapping_each_other_beside_an_abandoned_write_are_counted_not_reported() -> None:
    """Two reads may overlap each other: beside an abandoned write, each counts as the documented exception.

    (The check used to ask every call running beside the second read to be abandoned, the first read too,
    and reported the answered read as a violation.)
    """
    saved = FIGURES.snapshot()
    problems, allowed, violations = check(READS_BESIDE_A_WRITE, abandoned={A}, events=READS_AFTER_THE_WRITE)
    assert problems == []
    assert allowed == saved["server_overlaps_after_abandoned_calls"] + 2
    assert violations == saved["exclusive_overlaps"]


def test_a_read_beside_an_answered_write_is_reported_naming_the_write() -> None:
    """The same ledger with the write answered: both reads are violations, and each names the write alone."""
    problems, _, _ = check(READS_BESIDE_A_WRITE, abandoned=set(), events=READS_AFTER_THE_WRITE)
    assert problems == [
        f"{call_key(READ_1.name, READ_1.arguments)} started on the server while [{A!r}] ran (answered calls)",
        f"{call_key(READ_2.name, READ_2.arguments)} started on the server while [{A!r}] ran (answered calls)",
    ]
