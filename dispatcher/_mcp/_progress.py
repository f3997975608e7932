"""What a call makes of its server's progress reports: the idle wait they reset and the events they become.

MCP says a server's progress MUST increase with each notification, with a total or without one. A report
counts when its progress is a finite number greater than the last one that counted: only such a report
sets the call's idle wait (`idle_timeout`) again, so a server that repeats a number, or goes back, does
not keep a silent call alive (`call_timeout` stays the hard cap in any case). A report without a total
counts like any other.

A report that counts becomes a ``progress`` `CallEvent` and a span event while the attempt's budget
allows: a token bucket of `BURST` events, refilled at `RATE` a second. A flood of reports (a hostile
server sending thousands a second) then costs one comparison each beyond the SDK's own parsing, and at
most ``BURST + RATE * seconds`` events reach the hook and the tracer; the idle wait is still set again by
each report that counts, dropped from the events or not. A total that is not a finite number is dropped.

Everything here runs on the event loop's clock (`anyio.current_time`), so virtual clocks drive it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

    from mcp.shared.dispatcher import ProgressFnT

__all__ = ["BURST", "RATE", "ProgressMeter", "metered"]

# The events an attempt may emit at once, and how many a second after that.
BURST = 20
RATE = 10.0


class ProgressMeter:
    """One attempt's progress so far, and its budget of events."""

    __slots__ = ("_last", "_time", "_tokens")

    def __init__(self) -> None:
        self._last = -math.inf
        self._tokens = float(BURST)
        self._time = anyio.current_time()

    def advances(self, progress: object) -> bool:
        """Whether a report counts: a finite number above the last one that counted (which it becomes)."""
        if isinstance(progress, bool) or not isinstance(progress, int | float) or not math.isfinite(progress):
            return False
        if progress <= self._last:
            return False
        self._last = progress
        return True

    def may_report(self) -> bool:
        """Whether one more event fits the attempt's budget (and spend it)."""
        now = anyio.current_time()
        self._tokens = min(float(BURST), self._tokens + (now - self._time) * RATE)
        self._time = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def metered(report: ProgressFnT | None, touch: Callable[[], None] | None = None) -> ProgressFnT | None:
    """The SDK progress callback of one attempt: `touch` on each report that counts, `report` within budget.

    None when there is nothing to do with progress (no observer, no idle wait): the SDK then puts no
    progress token on the request.
    """
    if report is None and touch is None:
        return None
    meter = ProgressMeter()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if not meter.advances(progress):
            return
        if touch is not None:
            touch()
        if report is not None and meter.may_report():
            if total is not None and (isinstance(total, bool) or not math.isfinite(total)):
                total = None
            await report(progress, total, message)

    return on_progress
