"""The timeline drawn as text for a terminal: a time axis in ms, one bar per call, a letter per status."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from .._core._calls import CallStatus, Effect
from ._rows import printable

if TYPE_CHECKING:
    from ..timeline import Timeline

__all__ = ["LETTERS", "draw_text"]

LETTERS = {
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


def draw_text(timeline: Timeline, *, width: int, color: bool | None) -> str:
    """`Timeline.text`: the timeline for a terminal, an axis in ms, one row per call, a legend."""
    if width < 10:
        raise ValueError(f"width must be >= 10, got {width}")
    if color is None:
        color = _stdout_is_terminal() and not os.environ.get("NO_COLOR")
    if not timeline.rows:
        return "(no calls)"
    # A batch that took no time at all is drawn on an axis of 1 ms.
    origin, span = timeline.origin, (timeline.end - timeline.origin) or 0.001
    label_width = max(len(row.label) for row in timeline.rows)
    batched = len({row.batch for row in timeline.rows}) > 1

    def column(time: float) -> int:
        """The boundary before which a time falls: cell i covers [i, i + 1) of the axis."""
        return min(width, max(0, round((time - origin) / span * width)))

    lines = [" " * (label_width + 1) + line for line in _axis(span, width)]
    batch = None
    for row in timeline.rows:
        if batched and row.batch != batch:
            batch = row.batch
            lines.append(f"batch {batch + 1}")
        cells = [" "] * width
        letter = LETTERS.get(row.status, _UNFINISHED) if row.status is not None else _UNFINISHED
        end = row.finished_at if row.finished_at is not None else timeline.end
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
            notes.append(f"not run: it depended on {printable(row.depends_on)}, which did not succeed")
        if row.wait is not None:
            # It names other calls by their ids, which the model chose.
            notes.append(printable(row.wait.describe(), limit=400))
        lines.append(f"{row.label.ljust(label_width)} |{bar}| {times}  {'; '.join(notes)}")
    legend = ", ".join(f"{letter} {status.value}" for status, letter in LETTERS.items())
    lines.append(f"{' ' * (label_width + 2)}- waiting, {legend}, : retry")
    return "\n".join(lines)


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
