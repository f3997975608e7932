"""How far the online limit may grow, and how many calls really shared the server with each one.

Two pieces of the adaptive controller (`_adaptive.Controller`), without I/O and without a clock:

- `Proof`: the highest concurrency at which answers came back near the unloaded baseline ("proven"),
  and the slow start it allows while no knee is known: at most ``max(proven + 1, 1.25 x proven)`` per
  round (twice proven on a server whose latency is noisy, where one round proves less). A slowdown at a
  level above proven is explained by the calls past it: the limit goes back to proven, not below.
  An answer proves only as many calls as were in flight with it *and are in*: those sent no later than
  it and still out (`Outstanding`) are not proven yet. A round of 20 on a server that serves 16 at full
  speed answers its first 16 at the unloaded speed and its last 4 slower: counted whole at each of the
  first answers, 20 was proven before the slower 4 came back, and the slow start sent 25.
- `Overlap`: the calls in flight that each call shared the server with, counted from the starts and
  finishes the controller was told about. A call that ended at the very instant another was sent did
  not share the server with it, whatever order the event loop told the two in: the count of the later
  one is corrected when the earlier one's end is reported. Calls sent at one instant all share the
  server with each other: each counts the ones sent after it at that instant too (a closed loop whose
  answers all come back at once re-sends them all, and the first re-sent is not alone). So each call
  sent at an instant counts the calls in flight at the end of it, and the controller's figures do not
  depend on how a loop orders what happens at one instant (a virtual clock's runs are the same at every
  run). So does the limit each was sent under: an answer of that instant that grew the limit counts for
  the calls sent at it before it was told.

Cost: O(calls sent at the current instant) per start and per finish at that instant; `Outstanding` is
O(log n) to find a send time among the n calls in flight and O(n) (a list's move) to insert or drop it.
"""

from __future__ import annotations

import bisect
import math
from typing import Protocol

__all__ = ["Outstanding", "Overlap", "Proof", "grow_to"]

# Slow start while no knee is known: per round, the limit grows to at most this multiple of proven ...
_STEP = 1.25
# ... or this one on a noisy server.
_NOISY_STEP = 2.0
# A probe that comes back clean with calls waiting lets the level go to this many times its calls in flight.
_CLEAN_STEP = 4


def grow_to(in_flight: int) -> int:
    """Where a clean probe sent with `in_flight` calls, calls waiting, lets the level go (the ceiling caps it)."""
    return _CLEAN_STEP * in_flight


class _Counted(Protocol):
    in_flight: int
    limit: int
    epoch: int


class Proof:
    """The highest concurrency proven to run at the server's unloaded speed."""

    __slots__ = ("level",)

    def __init__(self) -> None:
        self.level = 0
        """The most calls in flight an answer near the baseline was sent with (0: none yet)."""

    def clean(self, in_flight: int) -> None:
        """An answer sent with `in_flight` calls in flight came back near the unloaded baseline."""
        self.level = max(self.level, in_flight)

    def top(self, *, noisy: bool) -> float:
        """The most the slow start may grow to from what is proven."""
        proven = self.level
        return max(proven + 1.0, (_NOISY_STEP if noisy else _STEP) * proven)

    def explains(self, in_flight: int, served: float) -> bool:
        """Whether a slowdown of an answer sent with `in_flight` calls is the calls past proven's doing.

        It is when the call was sent above proven and the server still serves about proven at full speed
        (`served`, Little's law): the server did not get slower, the limit went too far.
        """
        proven = self.level
        return 0 < proven < in_flight and math.floor(served + 0.5) >= proven

    def cut(self, level: float) -> None:
        """The limit was cut to `level` for a reason other than going past proven: proven is no more."""
        self.level = min(self.level, math.floor(level + 1e-9))


class Overlap:
    """The calls sent at the current instant, to correct their count when a call ends at that instant."""

    __slots__ = ("at", "sent")

    def __init__(self) -> None:
        self.at = -math.inf
        self.sent: list[_Counted] = []

    def start(self, flight: _Counted, now: float) -> None:
        """`flight` was sent at `now` (its `in_flight` counts every call not yet reported ended)."""
        if now != self.at:
            self.at = now
            self.sent = []
        for other in self.sent:
            other.in_flight += 1  # sent at the same instant, it shares the server with this one as well
        self.sent.append(flight)

    def finish(self, flight: _Counted, now: float) -> None:
        """`flight` ended at `now`: the calls sent at that instant after it did not share the server with it."""
        if now != self.at:
            return
        sent = self.sent
        index = next((i for i, other in enumerate(sent) if other is flight), -1)
        if index >= 0:
            sent.pop(index)
            # It ended at the instant it was sent: the calls sent after it then did not share the server with it.
            flight.in_flight = max(1, flight.in_flight - (len(sent) - index))
        for other in sent[max(0, index) :]:
            if other.in_flight > 1:
                other.in_flight -= 1

    def grown(self, now: float, limit: int, epoch: int) -> None:
        """An answer at `now` left the limit at `limit`: the calls sent at that instant count as sent under it
        too (as they would had the loop told the answer first), unless it came with a cut (a new `epoch`)."""
        if now != self.at:
            return
        for other in self.sent:
            if other.epoch == epoch and other.limit < limit:
                other.limit = limit


class Outstanding:
    """The send times of the calls not yet answered, sorted: which of them went out no later than one that ends.

    An answer sent with k calls in flight proves k only once the others are in: the ones sent no later than
    it that are still out may yet come back slower (the last of a round to reach a server at its capacity).
    """

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent: list[float] = []

    def start(self, at: float) -> None:
        """A call was sent at `at`."""
        bisect.insort(self.sent, at)

    def finish(self, at: float) -> int:
        """The call sent at `at` ended: returns how many others sent no later than it are still out."""
        sent = self.sent
        index = bisect.bisect_left(sent, at)
        if index < len(sent) and sent[index] == at:
            ahead = bisect.bisect_right(sent, at) - 1
            sent.pop(index)
            return ahead
        return bisect.bisect_right(sent, at)
