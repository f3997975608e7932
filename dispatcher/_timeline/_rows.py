"""The rows of a timeline: each call as its results or events recorded it, and what it waited for."""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .._core._calls import CallStatus, Effect, ToolCall, ToolResult
from .._core._gate import conflicts
from .._driver._observe import CallEvent

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["TimelineRow", "Wait", "WaitKind", "printable", "record_of_result", "records_of_events", "rows_of"]

WaitKind = Literal["write", "writes_alone", "limit", "after", "approved", "approval", "unrecorded"]

# A start this soon after submission, with nothing before it that it had to wait for, is the event loop's
# ordinary delay in starting a task (milliseconds on a busy machine), not a wait.
_WAITED_SECONDS = 0.02
# A start within this long of an end (or this share of its wait) follows it; more is shown as unexplained.
_FOLLOW_SECONDS = 0.01
_FOLLOW_SHARE = 0.25
# How many of the ends before a call's start are searched for the one it waited for by the rule.
_SEARCH = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """What a call waited for before it started (or, for a refused call, before it was refused).

    Attributes:
        kind: ``"write"`` (a write submitted before it, which it conflicts with, had to end first),
            ``"writes_alone"`` (the call is a write: calls submitted before it had to end first),
            ``"limit"`` (a call it does not conflict with ended and freed a place under a concurrency
            limit), ``"after"`` (it started as `after` ended; the record holds no classes or keys to say
            why: a timeline built from results), ``"approved"`` (it started as its approval came, after
            nothing else it waited for: from events), ``"approval"`` (it waited for a person, who
            refused or did not answer: its status is DENIED) or ``"unrecorded"`` (it waited, and
            nothing the record holds ended just before it started: an approval results cannot show, a
            coordinator, or a call outside this timeline).
        seconds: How long it waited, from submission to its start (or its result, if it never ran).
        unexplained: Of that, the seconds between the last end it waited for and its start, which the
            record does not account for (the event loop's delay in starting it, or an approval); the
            whole wait for ``"unrecorded"``.
        after: The call whose end it waited for; for ``"limit"``, when its turn had come first at the end
            of a call it conflicts with, that call, then the one whose end freed its place.
        approval: Of the wait, the seconds from the approval's request to its answer (from events; 0.0
            when none was asked or the record does not say).
    """

    kind: WaitKind
    seconds: float
    after: tuple[str, ...] = ()
    unexplained: float = 0.0
    approval: float = 0.0

    def describe(self) -> str:
        """The wait in words, for a row of the text timeline."""
        ms = f"{self.seconds * 1000:.0f} ms"
        named = " then ".join(self.after)
        if self.kind == "write":
            text = f"waited {ms} for the write before it ({named})"
        elif self.kind == "writes_alone":
            text = f"waited {ms}: runs alone, after the calls before it (the last: {named})"
        elif self.kind == "limit" and len(self.after) > 1:
            text = (
                f"waited {ms}: its turn came when {self.after[0]} ended, "
                f"a place under a concurrency limit when {self.after[-1]} ended"
            )
        elif self.kind == "limit":
            text = f"waited {ms} for a place under a concurrency limit (until {named} ended)"
        elif self.kind == "after":
            text = f"waited {ms}, until {named} ended"
        elif self.kind == "approval":
            return f"waited {ms} for an approval that was not given"
        elif self.kind == "approved":
            text = f"waited {ms} for its approval, which took {self.approval * 1000:.0f} ms to come"
        else:
            return f"waited {ms} for something this record does not show (an approval, a coordinator)"
        if self.approval and self.kind != "approved":
            text += f", {self.approval * 1000:.0f} ms of it for an approval"
        if self.unexplained > max(_FOLLOW_SECONDS, _FOLLOW_SHARE * self.seconds):
            text += f", then {self.unexplained * 1000:.0f} ms the record does not explain"
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineRow:
    """One call of a timeline.

    Attributes:
        call: The call.
        batch: The index of its batch among those the timeline was built from (0 for the first).
        status: How it ended, or None if the record ends before it did.
        tool: The catalogue name it resolved to, or None.
        server: The server of that tool (None for local functions and unresolved calls).
        queued_at: When it was submitted (the event loop's clock, like `ToolResult`'s times).
        started_at: When its first attempt started, or None if it never started.
        finished_at: When it got its result, or None if the record ends before that.
        attempt_starts: When each attempt started (only the first from results; each retry too from
            events).
        attempts: How many attempts reached the tool.
        exclusive: Whether it ran alone (from events: the tool's class), or None when unknown.
        keys: Its conflict keys (from events; empty when unknown).
        error: The result's error text, if any.
        untrusted_content: Whether its result came from an open world.
        wait: What it waited for, or None if it started without waiting.
        effect: Whether its effect happened (`ToolResult.effect`), or None if the record ends before
            it did; the text notes an unknown one.
        depends_on: For a call fail-fast did not run, the id of the earlier call it depended on
            (`ToolResult.depends_on`); the text names it, the picture draws an arrow from its end.
    """

    call: ToolCall
    batch: int
    status: CallStatus | None
    tool: str | None
    server: str | None
    queued_at: float
    started_at: float | None
    finished_at: float | None
    attempt_starts: tuple[float, ...]
    attempts: int
    exclusive: bool | None
    keys: tuple[str, ...]
    error: str | None
    untrusted_content: bool
    wait: Wait | None
    effect: Effect | None = None
    depends_on: str | None = None

    @property
    def label(self) -> str:
        """The call's id and tool, as the rows are labelled: printable, at most 60 characters.

        Call ids and unresolved tool names come from the model: control characters (a terminal escape
        sequence) are written out, and long ones cut.
        """
        return printable(f"{self.call.id} {self.tool or self.call.name}")


@dataclass(frozen=True, slots=True)
class _Record:
    """One call as the record holds it: its row before its wait is worked out (`wait` None), and its approval."""

    row: TimelineRow
    # When its approval was first asked and last answered (None: not answered), from events.
    approval: tuple[float, float | None] | None = None


def printable(text: str, limit: int = 60) -> str:
    if not text.isprintable():
        text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def record_of_result(result: ToolResult, batch: int) -> _Record:
    row = TimelineRow(
        call=result.call,
        batch=batch,
        status=result.status,
        tool=result.tool,
        server=result.server,
        queued_at=result.queued_at,
        started_at=result.started_at,
        finished_at=result.finished_at,
        attempt_starts=(result.started_at,) if result.started_at is not None else (),
        attempts=result.attempts,
        exclusive=None,
        keys=(),
        error=result.error,
        untrusted_content=result.untrusted_content,
        wait=None,
        effect=result.effect,
        depends_on=result.depends_on,
    )
    return _Record(row)


def records_of_events(events: Iterable[CallEvent], batch: int) -> list[_Record]:
    histories: list[list[CallEvent]] = []  # in the order the calls were queued
    open_calls: dict[int, list[CallEvent]] = {}
    for event in events:
        if not isinstance(event, CallEvent):
            raise TypeError(f"from_events takes CallEvent items, got {type(event).__name__}")
        key = id(event.call)
        if event.kind == "queued":
            history = open_calls[key] = [event]
            histories.append(history)
        elif key in open_calls:
            open_calls[key].append(event)
            if event.kind == "finished":
                del open_calls[key]
        # An event of a call whose "queued" event is not in the record has no row to join.
    return [_from_call_events(history, batch) for history in histories]


def _from_call_events(history: list[CallEvent], batch: int) -> _Record:
    queued = history[0]
    starts = tuple(event.time for event in history if event.kind in ("started", "retried"))
    finished = next((event for event in history if event.kind == "finished"), None)
    result = finished.result if finished is not None else None
    entry = next((event.tool for event in reversed(history) if event.tool is not None), None)
    keys = next((event.keys for event in reversed(history) if event.keys), ())
    asked = next((event.time for event in history if event.kind == "approval_asked"), None)
    answered = next((event.time for event in reversed(history) if event.kind == "approval_answered"), None)
    row = TimelineRow(
        call=queued.call,
        batch=batch,
        status=result.status if result is not None else None,
        tool=entry.name if entry is not None else (result.tool if result is not None else None),
        server=entry.server if entry is not None else (result.server if result is not None else None),
        queued_at=queued.time,
        started_at=starts[0] if starts else None,
        finished_at=finished.time if finished is not None else None,
        attempt_starts=starts,
        attempts=result.attempts if result is not None else len(starts),
        exclusive=entry.exclusive if entry is not None else None,
        keys=keys,
        error=result.error if result is not None else None,
        untrusted_content=result.untrusted_content if result is not None else False,
        wait=None,
        effect=result.effect if result is not None else None,
        depends_on=result.depends_on if result is not None else None,
    )
    return _Record(row, approval=(asked, answered) if asked is not None else None)


def rows_of(records: Sequence[_Record]) -> list[TimelineRow]:
    # Submission order: the time each call was queued; ties keep the order the record holds them in.
    ordered_records = sorted(records, key=lambda record: record.row.queued_at)
    ordered = [record.row for record in ordered_records]
    ends = sorted((row.finished_at, position) for position, row in enumerate(ordered) if row.finished_at is not None)
    return [
        dataclasses.replace(record.row, wait=_wait(record.row, record.approval, position, ordered, ends))
        for position, record in enumerate(ordered_records)
    ]


def _conflict(first: TimelineRow, second: TimelineRow) -> bool | None:
    """Whether the gate orders the two calls, or None when the record does not say."""
    if first.exclusive is None or second.exclusive is None:
        return None
    if not (first.exclusive or second.exclusive) or not first.keys or not second.keys:
        return False
    return conflicts(first.keys, second.keys)


def _wait(
    row: TimelineRow,
    approval: tuple[float, float | None] | None,
    position: int,
    ordered: Sequence[TimelineRow],
    ends: Sequence[tuple[float, int]],
) -> Wait | None:
    """What the record says the call waited for; None if it did not wait.

    `ordered` is every call's row in submission order, `ends` their (end, position) pairs sorted by end.
    """
    started = row.started_at
    if started is None:
        if row.status is CallStatus.DENIED and row.finished_at is not None:
            took = 0.0
            if approval is not None:
                took = (approval[1] if approval[1] is not None else row.finished_at) - approval[0]
            return Wait(kind="approval", seconds=row.finished_at - row.queued_at, approval=took)
        return None
    wait = _rule_wait(row, position, ordered, ends)
    if approval is None or approval[1] is None or approval[1] > started:
        return wait
    asked, answered = approval[0], approval[1]
    if wait is None and started - row.queued_at <= _WAITED_SECONDS:
        return None  # approved at once (an approver that needs no person): the event loop's ordinary delay
    # The approval came before the start: if nothing that ended as it came or after explains the start,
    # the call started because it was approved; else the rule's wait stands (an end at the very time of
    # the answer held it as much), and part of it was the approval's.
    ended_since = range(bisect.bisect_left(ends, (answered, -1)), bisect.bisect_right(ends, (started, math.inf)))
    if wait is None or wait.kind == "unrecorded" or not any(ends[i][1] != position for i in ended_since):
        return Wait(
            kind="approved",
            seconds=started - row.queued_at,
            unexplained=started - answered,
            approval=answered - asked,
        )
    return dataclasses.replace(wait, approval=answered - asked)


def _rule_wait(
    record: TimelineRow, position: int, ordered: Sequence[TimelineRow], ends: Sequence[tuple[float, int]]
) -> Wait | None:
    """What the conflict rule and the limits made the call wait for (a call that started)."""
    if record.started_at is None:
        return None
    waited = record.started_at - record.queued_at
    if waited <= 0:
        return None
    # The calls that ended while it waited are ends[low:high], oldest end first; read from the newest.
    low = bisect.bisect_right(ends, (record.queued_at, math.inf))
    high = bisect.bisect_right(ends, (record.started_at, math.inf))
    window = [i for i in range(high - 1, max(low, high - _SEARCH) - 1, -1) if ends[i][1] != position]
    if not window:
        return _unrecorded(waited)
    last_end, last_position = ends[window[0]]
    last = ordered[last_position]
    # The last call to end that the rule made it wait for: submitted before it, conflicting with it. A
    # conflicting end far back in the window did not decide when it started, so the search stops there.
    binding = next(
        (ordered[ends[i][1]] for i in window if ends[i][1] < position and _conflict(ordered[ends[i][1]], record)),
        None,
    )
    if binding is None and waited <= _WAITED_SECONDS:
        # Nothing held it by the rule, and it started within the event loop's ordinary delay.
        return None
    if binding is not last:
        # Only a call that ran held a place under a limit: a refused call's end freed none.
        ran = next((i for i in window if ordered[ends[i][1]].started_at is not None), None)
        if ran is None:
            return _unrecorded(waited)
        last_end, last_position = ends[ran]
        last = ordered[last_position]
    gap = record.started_at - last_end
    if binding is last:
        kind: WaitKind = "write" if last.exclusive else "writes_alone"
        return Wait(kind=kind, seconds=waited, after=(last.call.id,), unexplained=gap)
    if binding is not None:
        # Its turn came when `binding` ended; a concurrency limit kept it until `last` ended.
        return Wait(kind="limit", seconds=waited, after=(binding.call.id, last.call.id), unexplained=gap)
    if _conflict(last, record) is None:
        # Results alone: the end it followed is a fact, the reason is not in the record.
        return Wait(kind="after", seconds=waited, after=(last.call.id,), unexplained=gap)
    if gap <= max(_FOLLOW_SECONDS, _FOLLOW_SHARE * waited):
        # Nothing it conflicts with held it: the end of a call that did not conflict freed its place.
        return Wait(kind="limit", seconds=waited, after=(last.call.id,), unexplained=gap)
    return _unrecorded(waited)


def _unrecorded(waited: float) -> Wait | None:
    """A wait with no recorded cause, or None for a start within the event loop's ordinary delay."""
    return Wait(kind="unrecorded", seconds=waited, unexplained=waited) if waited > _WAITED_SECONDS else None
