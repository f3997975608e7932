"""What ran when, and what each call waited for: a timeline of one batch or of a whole session.

Build a `Timeline` from the results of one or more batches (`Timeline.from_results(turn_1, turn_2)`) or
from the `CallEvent`s an ``on_event`` hook collected (`Timeline.from_events(events)`), then:

- `Timeline.text()`: one row per call on a shared time axis for the terminal, a letter (and, on a
  terminal, a colour) per status, and what each call waited for;
- `Timeline.plot()`: the same as a picture (a matplotlib ``Figure``, saved as PNG with ``path=``), through
  the ``plot`` extra (``pip install "mcp-dispatcher[plot]"``);
- `Timeline.chrome_trace()`: the Chrome trace-event JSON object (``json.dump`` it to a file), which
  Perfetto (ui.perfetto.dev) and chrome://tracing open: one process per batch, one track per call.

What a call waited for is read from the record, never guessed. A call that started later than it was
queued is matched with the call whose end came last before its start (within a small tolerance): with
events, which say whether each call ran alone (`ToolEntry.exclusive`) and which conflict keys it held,
that end is named for what it was: the write before the call, the calls a write had to wait for, or a
call that did not conflict and so freed a place under a concurrency limit. Results alone carry neither
the class nor the keys, so the timeline says only which call's end the start followed. Events record when
an approval was asked and answered: a call that started as its approval came waited for the approval, and
any other wait says how much of it the person took. From results, a call refused approval is marked so
(its status says it); an approved one is not told apart. Neither record says which limit (the
dispatcher's or its server's) held a call back: a wait with no recorded end before it is shown as a wait
the record does not explain.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._core._calls import CallStatus, Effect, ToolCall, ToolResult
from ._core._gate import conflicts
from ._driver._observe import CallEvent

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from matplotlib.figure import Figure

__all__ = ["Timeline", "TimelineRow", "Wait"]

WaitKind = Literal["write", "writes_alone", "limit", "after", "approved", "approval", "unrecorded"]

# A start this soon after submission, with nothing before it that it had to wait for, is the event loop's
# ordinary delay in starting a task (milliseconds on a busy machine), not a wait.
_WAITED_SECONDS = 0.02
# A start within this long of an end (or this share of its wait) follows it; more is shown as unexplained.
_FOLLOW_SECONDS = 0.01
_FOLLOW_SHARE = 0.25
# How many of the ends before a call's start are searched for the one it waited for by the rule.
_SEARCH = 256

_LETTERS = {
    CallStatus.OK: "o",
    CallStatus.TOOL_ERROR: "e",
    CallStatus.FAILED: "F",
    CallStatus.TIMEOUT: "T",
    CallStatus.CANCELLED: "c",
    CallStatus.DENIED: "D",
}
_UNFINISHED = "?"
_ANSI = {
    CallStatus.OK: "32",
    CallStatus.TOOL_ERROR: "33",
    CallStatus.FAILED: "31",
    CallStatus.TIMEOUT: "31;1",
    CallStatus.CANCELLED: "90",
    CallStatus.DENIED: "35",
}
# Colours of the picture, chosen to stay distinct for the common forms of colour blindness (Okabe-Ito).
_COLOURS = {
    CallStatus.OK: "#009E73",
    CallStatus.TOOL_ERROR: "#E69F00",
    CallStatus.FAILED: "#D55E00",
    CallStatus.TIMEOUT: "#CC79A7",
    CallStatus.CANCELLED: "#999999",
    CallStatus.DENIED: "#0072B2",
}
_WAITING_COLOUR = "#DDDDDD"
_UNFINISHED_COLOUR = "#56B4E9"


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
        return _printable(f"{self.call.id} {self.tool or self.call.name}")


@dataclass(frozen=True, slots=True)
class _Record:
    """One call as the record holds it, before its wait is worked out."""

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
    effect: Effect | None = None
    depends_on: str | None = None
    # When its approval was first asked and last answered (None: not answered), from events.
    approval: tuple[float, float | None] | None = None


class Timeline:
    """The calls of one or more batches on one time axis, with what each waited for.

    Build it with `from_results` or `from_events`; rows are in submission order. Times are readings of
    the event loop's clock; `origin` is the earliest submission, and every drawing counts from it.
    """

    __slots__ = ("rows",)

    rows: tuple[TimelineRow, ...]

    def __init__(self, rows: Iterable[TimelineRow]) -> None:
        """A timeline of the given rows (usually built by `from_results` or `from_events`)."""
        self.rows = tuple(rows)

    @classmethod
    def from_results(cls, *batches: Iterable[ToolResult]) -> Timeline:
        """A timeline of the results of one or more batches, each batch one argument, in any order.

        Results record when each call was submitted, started and ended, but not whether it ran alone or
        which keys it held: a wait is then named by the call whose end the start followed (``"after"``).
        Build the timeline from events for the reasons.
        """
        records = []
        for index, batch in enumerate(batches):
            for result in batch:
                if not isinstance(result, ToolResult):
                    raise TypeError(f"from_results takes ToolResult items, got {type(result).__name__}")
                records.append(_from_result(result, index))
        return cls(_rows(records))

    @classmethod
    def from_events(cls, *batches: Iterable[CallEvent]) -> Timeline:
        """A timeline of the `CallEvent`s of one or more batches (each an argument), as `on_event` got them.

        One argument may also hold a whole session's events: its calls then share batch 0. A call whose
        ``finished`` event is missing (the record was taken while it ran) is drawn up to the end of the
        record, with no status. The same `ToolCall` object dispatched again starts a new row.
        """
        records = []
        for index, batch in enumerate(batches):
            records.extend(_from_events(batch, index))
        return cls(_rows(records))

    @property
    def origin(self) -> float:
        """The earliest submission time (0.0 for an empty timeline)."""
        return min((row.queued_at for row in self.rows), default=0.0)

    @property
    def end(self) -> float:
        """The latest time the record holds: the last result, or the last start of an unfinished call."""
        times = [t for row in self.rows for t in (row.queued_at, row.started_at, row.finished_at) if t is not None]
        times += [t for row in self.rows for t in row.attempt_starts]
        return max(times, default=0.0)

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        batches = len({row.batch for row in self.rows})
        return f"<Timeline {len(self.rows)} calls in {batches} batches over {(self.end - self.origin) * 1000:.1f} ms>"

    def text(self, *, width: int = 40, color: bool | None = None) -> str:
        """The timeline for a terminal: an axis in ms, one row per call, a legend.

        Each row shows ``-`` while the call waited, its status letter while it ran (``o`` OK, ``e`` tool
        error, ``F`` failed, ``T`` timeout, ``c`` cancelled, ``D`` denied, ``?`` unfinished), ``:`` where a
        retry began, then its times and what it waited for.

        Args:
            width: Characters of the time axis (at least 10).
            color: Colour the bars with ANSI escapes; None colours them when standard output is a
                terminal and ``NO_COLOR`` is not set.
        """
        if width < 10:
            raise ValueError(f"width must be >= 10, got {width}")
        if color is None:
            color = _stdout_is_terminal() and not os.environ.get("NO_COLOR")
        if not self.rows:
            return "(no calls)"
        # A batch that took no time at all is drawn on an axis of 1 ms.
        origin, span = self.origin, (self.end - self.origin) or 0.001
        label_width = max(len(row.label) for row in self.rows)
        batched = len({row.batch for row in self.rows}) > 1

        def column(time: float) -> int:
            """The boundary before which a time falls: cell i covers [i, i + 1) of the axis."""
            return min(width, max(0, round((time - origin) / span * width)))

        lines = [" " * (label_width + 1) + line for line in _axis(span, width)]
        batch = None
        for row in self.rows:
            if batched and row.batch != batch:
                batch = row.batch
                lines.append(f"batch {batch + 1}")
            cells = [" "] * width
            letter = _LETTERS.get(row.status, _UNFINISHED) if row.status is not None else _UNFINISHED
            end = row.finished_at if row.finished_at is not None else self.end
            began = row.started_at if row.started_at is not None else end
            # Every call gets at least one cell: its run, or the mark where it ended without running.
            first = min(column(began), width - 1)
            for i in range(min(column(row.queued_at), first), first):
                cells[i] = "-"
            stop = max(first + 1, column(end)) if row.started_at is not None else first + 1
            for i in range(first, stop):
                cells[i] = letter
            for retry in row.attempt_starts[1:]:
                cells[min(column(retry), width - 1)] = ":"
            bar = "".join(cells)
            if color and row.status is not None:
                bar = "".join(f"\x1b[{_ANSI[row.status]}m{cell}\x1b[0m" if cell == letter else cell for cell in cells)
            status = row.status.value if row.status is not None else "unfinished"
            times = (
                f"{(row.started_at - origin) * 1000:6.0f} -> {(end - origin) * 1000:6.0f} ms"
                if row.started_at is not None
                else f"{'never ran':>16}"
            )
            notes = [status]
            if row.attempts > 1:
                notes.append(f"{row.attempts} attempts")
            if row.untrusted_content:
                notes.append("untrusted content")
            if row.effect is Effect.UNKNOWN:
                notes.append("effect unknown")
            if row.depends_on is not None:
                notes.append(f"not run: it depended on {_printable(row.depends_on)}, which did not succeed")
            if row.wait is not None:
                # It names other calls by their ids, which the model chose.
                notes.append(_printable(row.wait.describe(), limit=400))
            lines.append(f"{row.label.ljust(label_width)} |{bar}| {times}  {'; '.join(notes)}")
        legend = ", ".join(f"{letter} {status.value}" for status, letter in _LETTERS.items())
        lines.append(f"{' ' * (label_width + 2)}- waiting, {legend}, : retry")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text(color=False)

    def plot(self, path: str | os.PathLike[str] | None = None, *, title: str | None = None) -> Figure:
        """The timeline as a picture: one row per call, a bar per status colour, waits and retries shown.

        A light bar is the time a call waited, with an arrow from the end of the call it waited for; the
        coloured bar is its run, in its status's colour; white ticks mark retries; a cross marks a call
        that never ran. Needs the ``plot`` extra (matplotlib).

        Args:
            path: Where to save it (PNG, or any format matplotlib infers from the suffix), or None.
            title: A title above it.

        Returns:
            The matplotlib ``Figure`` (not attached to pyplot, so nothing opens a window).

        Raises:
            ImportError: matplotlib is not installed.
        """
        try:
            from matplotlib.figure import Figure
            from matplotlib.patches import Patch
        except ImportError as exc:
            raise ImportError(
                'Timeline.plot needs matplotlib: pip install "mcp-dispatcher[plot]" (or pip install matplotlib)'
            ) from exc
        rows = self.rows
        origin = self.origin
        figure = Figure(figsize=(9, 1.2 + 0.32 * max(len(rows), 1)), dpi=100, layout="constrained")
        axes = figure.add_subplot()
        ends = {id(row): row.finished_at if row.finished_at is not None else self.end for row in rows}
        by_id: dict[str, list[tuple[int, TimelineRow]]] = {}
        for y, row in enumerate(rows):
            by_id.setdefault(row.call.id, []).append((y, row))
            queued = (row.queued_at - origin) * 1000
            began = ((row.started_at if row.started_at is not None else ends[id(row)]) - origin) * 1000
            if began > queued:
                axes.broken_barh([(queued, began - queued)], (y - 0.3, 0.6), facecolors=_WAITING_COLOUR)
            colour = _COLOURS[row.status] if row.status is not None else _UNFINISHED_COLOUR
            if row.started_at is not None:
                run = (ends[id(row)] - row.started_at) * 1000
                axes.broken_barh([(began, max(run, 0.0))], (y - 0.4, 0.8), facecolors=colour)
                for retry in row.attempt_starts[1:]:
                    at = (retry - origin) * 1000
                    axes.plot([at, at], [y - 0.4, y + 0.4], color="white", linewidth=2)
            else:
                axes.plot([began], [y], marker="X", markersize=9, color=colour, linestyle="none")
        for y, row in enumerate(rows):
            # An arrow from the end of the call it waited for, or (dashed) of the one it depended on.
            after = row.depends_on
            if after is None and row.wait is not None and row.wait.after:
                after = row.wait.after[-1]
            if after is None:
                continue
            candidates = [(by, other) for by, other in by_id.get(after, []) if other.batch == row.batch]
            if not candidates:
                continue
            by, other = candidates[0]
            start = ((ends[id(other)]) - origin) * 1000
            began = ((row.started_at if row.started_at is not None else ends[id(row)]) - origin) * 1000
            style = "--" if row.depends_on is not None else "-"
            axes.annotate(
                "",
                xy=(began, y),
                xytext=(start, by),
                arrowprops={"arrowstyle": "->", "color": "#444444", "linewidth": 0.8, "linestyle": style},
            )
        # A "$" would start matplotlib's mathtext, which an odd call id could make fail to parse.
        axes.set_yticks(range(len(rows)), [row.label.replace("$", r"\$") for row in rows])
        axes.set_ylim(len(rows) - 0.5, -0.5)
        axes.set_xlim(0, max((self.end - origin) * 1000, 1e-3) * 1.02)
        axes.set_xlabel("ms since the first call was submitted")
        axes.grid(axis="x", color="#EEEEEE")
        axes.set_axisbelow(True)
        seen = [status for status in CallStatus if any(row.status is status for row in rows)]
        handles = [Patch(facecolor=_WAITING_COLOUR, label="waiting")]
        handles += [Patch(facecolor=_COLOURS[status], label=status.value) for status in seen]
        if any(row.status is None for row in rows):
            handles.append(Patch(facecolor=_UNFINISHED_COLOUR, label="unfinished"))
        figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
        if title:
            axes.set_title(title)
        if path is not None:
            figure.savefig(path)
        return figure

    def chrome_trace(self) -> dict[str, Any]:
        """The Chrome trace-event JSON object (``json.dump`` it): Perfetto and chrome://tracing open it.

        One process per batch (``batch 1``, ...), one thread per call in submission order, named by its
        id and tool. Each call has a complete event (``"ph": "X"``) for its run, named by its tool, its
        category the status, its arguments the call id, server, status, attempts, error, wait and
        the call it depended on (`depends_on`, for a call fail-fast did not run), and
        one for the time it waited (category ``wait``); each retry is an instant event. Times are
        microseconds since the first submission.
        """
        origin = self.origin
        events: list[dict[str, Any]] = []

        def micros(time: float) -> float:
            return round((time - origin) * 1e6, 3)

        batches = sorted({row.batch for row in self.rows})
        for batch in batches:
            pid = batch + 1
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"batch {pid}"}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        positions: dict[int, int] = {}
        for row in self.rows:
            pid = row.batch + 1
            tid = positions[pid] = positions.get(pid, 0) + 1
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": row.label}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
            end = row.finished_at if row.finished_at is not None else self.end
            began = row.started_at if row.started_at is not None else end
            args: dict[str, Any] = {
                "call_id": row.call.id,
                "tool": row.tool or row.call.name,
                "server": row.server,
                "status": row.status.value if row.status is not None else "unfinished",
                "attempts": row.attempts,
            }
            if row.error is not None:
                args["error"] = row.error
            if row.wait is not None:
                args["waited_for"] = row.wait.describe()
            if row.depends_on is not None:
                args["depends_on"] = row.depends_on
            if row.keys and row.keys != ("",):
                args["keys"] = list(row.keys)
            if began > row.queued_at:
                events.append(
                    {
                        "name": f"waiting: {row.wait.kind}" if row.wait is not None else "waiting",
                        "cat": "wait",
                        "ph": "X",
                        "ts": micros(row.queued_at),
                        "dur": round(max(began - row.queued_at, 0.0) * 1e6, 3),
                        "pid": pid,
                        "tid": tid,
                        "args": args,
                    }
                )
            events.append(
                {
                    "name": row.tool or row.call.name,
                    "cat": args["status"],
                    "ph": "X" if row.started_at is not None else "i",
                    "ts": micros(began),
                    **({"dur": round(max(end - began, 0.0) * 1e6, 3)} if row.started_at is not None else {"s": "t"}),
                    "pid": pid,
                    "tid": tid,
                    "args": args,
                }
            )
            for attempt, retry in enumerate(row.attempt_starts[1:], start=2):
                events.append(
                    {
                        "name": f"attempt {attempt}",
                        "cat": "retry",
                        "ph": "i",
                        "s": "t",
                        "ts": micros(retry),
                        "pid": pid,
                        "tid": tid,
                        "args": {"call_id": row.call.id},
                    }
                )
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"producer": "dispatcher.timeline"}}


def _printable(text: str, limit: int = 60) -> str:
    if not text.isprintable():
        text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stdout_is_terminal() -> bool:
    import sys

    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


def _axis(span: float, width: int) -> list[str]:
    """Two lines: tick labels in ms at round values, over a ruler of `width` cells between bars."""
    span_ms = span * 1000
    # The round step (1, 2 or 5 times a power of ten) that gives about four ticks.
    raw = span_ms / 4
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    labels = list(" " * (width + 2))
    ruler = ["-"] * width
    tick = 0.0
    while tick <= span_ms * (1 + 1e-9):
        position = min(width - 1, round(tick / span_ms * width)) if span_ms > 0 else 0
        ruler[position] = "+"
        label = f"{tick:g}"
        at = position + 1
        if all(cell == " " for cell in labels[max(at - 1, 0) : at + len(label) + 1]) and at + len(label) <= width + 1:
            labels[at : at + len(label)] = label
        tick += step
    head = "".join(labels).rstrip()
    return [f"{head}{' ' * max(1, width + 3 - len(head))}ms", "|" + "".join(ruler) + "|"]


def _from_result(result: ToolResult, batch: int) -> _Record:
    return _Record(
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
        effect=result.effect,
        depends_on=result.depends_on,
    )


def _from_events(events: Iterable[CallEvent], batch: int) -> list[_Record]:
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
    return _Record(
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
        effect=result.effect if result is not None else None,
        depends_on=result.depends_on if result is not None else None,
        approval=(asked, answered) if asked is not None else None,
    )


def _rows(records: Sequence[_Record]) -> list[TimelineRow]:
    # Submission order: the time each call was queued; ties keep the order the record holds them in.
    ordered = sorted(records, key=lambda record: record.queued_at)
    ends = sorted(
        (record.finished_at, position) for position, record in enumerate(ordered) if record.finished_at is not None
    )
    return [_row(record, position, ordered, ends) for position, record in enumerate(ordered)]


def _row(record: _Record, position: int, ordered: Sequence[_Record], ends: Sequence[tuple[float, int]]) -> TimelineRow:
    return TimelineRow(
        call=record.call,
        batch=record.batch,
        status=record.status,
        tool=record.tool,
        server=record.server,
        queued_at=record.queued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        attempt_starts=record.attempt_starts,
        attempts=record.attempts,
        exclusive=record.exclusive,
        keys=record.keys,
        error=record.error,
        untrusted_content=record.untrusted_content,
        wait=_wait(record, position, ordered, ends),
        effect=record.effect,
        depends_on=record.depends_on,
    )


def _conflict(first: _Record, second: _Record) -> bool | None:
    """Whether the gate orders the two calls, or None when the record does not say."""
    if first.exclusive is None or second.exclusive is None:
        return None
    if not (first.exclusive or second.exclusive) or not first.keys or not second.keys:
        return False
    return conflicts(first.keys, second.keys)


def _wait(record: _Record, position: int, ordered: Sequence[_Record], ends: Sequence[tuple[float, int]]) -> Wait | None:
    """What the record says the call waited for; None if it did not wait.

    `ordered` is every call in submission order, `ends` their (end, position) pairs sorted by end.
    """
    started, approval = record.started_at, record.approval
    if started is None:
        if record.status is CallStatus.DENIED and record.finished_at is not None:
            took = 0.0
            if approval is not None:
                took = (approval[1] if approval[1] is not None else record.finished_at) - approval[0]
            return Wait(kind="approval", seconds=record.finished_at - record.queued_at, approval=took)
        return None
    wait = _rule_wait(record, position, ordered, ends)
    if approval is None or approval[1] is None or approval[1] > started:
        return wait
    asked, answered = approval[0], approval[1]
    if wait is None and started - record.queued_at <= _WAITED_SECONDS:
        return None  # approved at once (an approver that needs no person): the event loop's ordinary delay
    # The approval came before the start: if nothing that ended as it came or after explains the start,
    # the call started because it was approved; else the rule's wait stands (an end at the very time of
    # the answer held it as much), and part of it was the approval's.
    ended_since = range(bisect.bisect_left(ends, (answered, -1)), bisect.bisect_right(ends, (started, math.inf)))
    if wait is None or wait.kind == "unrecorded" or not any(ends[i][1] != position for i in ended_since):
        return Wait(
            kind="approved",
            seconds=started - record.queued_at,
            unexplained=started - answered,
            approval=answered - asked,
        )
    return dataclasses.replace(wait, approval=answered - asked)


def _rule_wait(
    record: _Record, position: int, ordered: Sequence[_Record], ends: Sequence[tuple[float, int]]
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
