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

from typing import TYPE_CHECKING, Any

from ._core._calls import ToolResult
from ._exports import rehome as _rehome
from ._timeline._picture import draw_picture
from ._timeline._rows import TimelineRow as TimelineRow
from ._timeline._rows import Wait as Wait
from ._timeline._rows import record_of_result, records_of_events, rows_of
from ._timeline._text import draw_text
from ._timeline._trace import chrome_trace

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable

    from matplotlib.figure import Figure

    from ._driver._observe import CallEvent

__all__ = ["Timeline", "TimelineRow", "Wait"]


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
                records.append(record_of_result(result, index))
        return cls(rows_of(records))

    @classmethod
    def from_events(cls, *batches: Iterable[CallEvent]) -> Timeline:
        """A timeline of the `CallEvent`s of one or more batches (each an argument), as `on_event` got them.

        One argument may also hold a whole session's events: its calls then share batch 0. A call whose
        ``finished`` event is missing (the record was taken while it ran) is drawn up to the end of the
        record, with no status. The same `ToolCall` object dispatched again starts a new row.
        """
        records = []
        for index, batch in enumerate(batches):
            records.extend(records_of_events(batch, index))
        return cls(rows_of(records))

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
        return draw_text(self, width=width, color=color)

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
        return draw_picture(self, path, title=title)

    def chrome_trace(self) -> dict[str, Any]:
        """The Chrome trace-event JSON object (``json.dump`` it): Perfetto and chrome://tracing open it.

        One process per batch (``batch 1``, ...), one thread per call in submission order, named by its
        id and tool. Each call has a complete event (``"ph": "X"``) for its run, named by its tool, its
        category the status, its arguments the call id, server, status, attempts, error, wait and
        the call it depended on (`depends_on`, for a call fail-fast did not run), and
        one for the time it waited (category ``wait``); each retry is an instant event. Times are
        microseconds since the first submission.
        """
        return chrome_trace(self)


# The classes exported here report this module as their home (`dispatcher.timeline.Wait`, not its private one).
_rehome(globals())
