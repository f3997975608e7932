"""Admission control: which submitted call may start now.

`Gate` is a synchronous state machine with no I/O, so every interleaving can be tested without an event
loop. It implements a fair readers-writer discipline in submission order, the incremental form of the
ordered barriers in `_plan`:

- submitted calls form segments: a run of consecutive concurrent ("read") calls shares a segment, each
  exclusive ("write") call has its own;
- only the oldest unfinished segment may run. A read segment's calls start in submission order while
  the limits allow; an exclusive call starts once nothing else runs, and nothing starts while it runs;
- a read submitted while the newest segment is a read segment joins it, so readers keep flowing until
  a writer queues, and a writer waits only for what was submitted before it (no starvation).

Limits are a global cap on running calls and optional per-server caps. A read whose server is at its
cap is parked, letting later reads for other servers go first; it goes back to the front of the queue
as soon as its server has room.

A call can be submitted *held* (waiting for something else, such as a person's approval): it keeps its
place in the order, an exclusive held call blocks everything behind it, and a held read is skipped by
its segment until `release` makes it admissible.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Hashable

__all__ = ["Gate", "Ticket", "TicketState"]

T = TypeVar("T")


class TicketState(enum.Enum):
    HELD = "held"
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    WITHDRAWN = "withdrawn"


class _Segment:
    __slots__ = ("exclusive", "open", "parked", "pending")

    def __init__(self, exclusive: bool) -> None:
        self.exclusive = exclusive
        self.pending: deque[Ticket[object]] = deque()
        self.parked: dict[Hashable, deque[Ticket[object]]] = {}
        # Tickets of this segment not yet done or withdrawn; the segment retires at zero.
        self.open = 0


class Ticket(Generic[T]):
    """A call's place in the gate."""

    __slots__ = ("_queued", "_segment", "exclusive", "item", "server", "state")

    def __init__(
        self, item: T, exclusive: bool, server: Hashable | None, segment: _Segment, state: TicketState
    ) -> None:
        self.item = item
        self.exclusive = exclusive
        self.server = server
        self.state = state
        self._segment = segment
        # Whether the ticket sits in its segment's pending deque (held reads leave it until released).
        self._queued = True


class Gate(Generic[T]):
    """Decides the order in which calls start.

    Args:
        limit: The most calls running at once, or None for no limit.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.running = 0
        self._segments: deque[_Segment] = deque()
        self._server_limits: dict[Hashable, int] = {}
        self._server_running: dict[Hashable, int] = {}

    def set_server_limit(self, server: Hashable, limit: int | None) -> None:
        """Cap the calls running at once on one server (None removes the cap)."""
        if limit is None:
            self._server_limits.pop(server, None)
        else:
            self._server_limits[server] = limit

    def server_running(self, server: Hashable) -> int:
        """How many calls of a server are running."""
        return self._server_running.get(server, 0)

    @property
    def idle(self) -> bool:
        """Whether no call is pending or running."""
        return not self._segments

    def submit(self, item: T, *, exclusive: bool, server: Hashable | None = None, held: bool = False) -> Ticket[T]:
        """Queue a call behind everything submitted before it; a held call waits for `release`."""
        segments = self._segments
        if exclusive or not segments or segments[-1].exclusive:
            segment = _Segment(exclusive)
            segments.append(segment)
        else:
            segment = segments[-1]
        ticket = Ticket(item, exclusive, server, segment, TicketState.HELD if held else TicketState.PENDING)
        segment.pending.append(ticket)  # type: ignore[arg-type]
        segment.open += 1
        return ticket

    def take(self) -> Ticket[T] | None:
        """Start the next call the rules allow, or return None if none may start now."""
        if self.limit is not None and self.running >= self.limit:
            return None
        if not self._segments:
            return None
        segment = self._segments[0]
        pending = segment.pending
        if segment.exclusive:
            if self.running or not pending or pending[0].state is not TicketState.PENDING:
                return None
            ticket = pending.popleft()
            return self._start(ticket)  # type: ignore[arg-type]
        limits = self._server_limits
        while pending:
            ticket = pending.popleft()
            if ticket.state is not TicketState.PENDING:
                ticket._queued = False
                continue
            server = ticket.server
            if server is not None and server in limits and self._server_running.get(server, 0) >= limits[server]:
                ticket._queued = False
                segment.parked.setdefault(server, deque()).append(ticket)
                continue
            return self._start(ticket)  # type: ignore[arg-type]
        return None

    def _start(self, ticket: Ticket[T]) -> Ticket[T]:
        ticket.state = TicketState.RUNNING
        self.running += 1
        if ticket.server is not None:
            self._server_running[ticket.server] = self._server_running.get(ticket.server, 0) + 1
        return ticket

    def finish(self, ticket: Ticket[T]) -> None:
        """Mark a running call as ended, freeing its place."""
        if ticket.state is not TicketState.RUNNING:
            raise RuntimeError(f"finish() on a ticket that is {ticket.state.value}, not running")
        ticket.state = TicketState.DONE
        self.running -= 1
        segment = ticket._segment
        server = ticket.server
        if server is not None:
            self._server_running[server] -= 1
            parked = segment.parked.get(server)
            if parked is not None:
                # The server has room again: its oldest parked call still waiting goes first.
                while parked:
                    waiting = parked.popleft()
                    if waiting.state is TicketState.PENDING:
                        waiting._queued = True
                        segment.pending.appendleft(waiting)
                        break
                if not parked:
                    del segment.parked[server]
        self._close(segment)

    def release(self, ticket: Ticket[T]) -> None:
        """Make a held call admissible; it keeps its original place in the order."""
        if ticket.state is not TicketState.HELD:
            raise RuntimeError(f"release() on a ticket that is {ticket.state.value}, not held")
        ticket.state = TicketState.PENDING
        if not ticket._queued:
            ticket._queued = True
            ticket._segment.pending.appendleft(ticket)  # type: ignore[arg-type]

    def withdraw(self, ticket: Ticket[T]) -> bool:
        """Remove a call that has not started; returns False if it already started or ended."""
        if ticket.state is not TicketState.PENDING and ticket.state is not TicketState.HELD:
            return False
        ticket.state = TicketState.WITHDRAWN
        segment = ticket._segment
        if segment.exclusive:
            segment.pending.clear()
        # Read tickets stay in their deque and are skipped when reached: removal there would cost O(n).
        self._close(segment)
        return True

    def _close(self, segment: _Segment) -> None:
        segment.open -= 1
        if segment.open == 0:
            segments = self._segments
            if segments and segments[0] is segment:
                segments.popleft()
                while segments and segments[0].open == 0:
                    segments.popleft()
            # A segment emptied behind the head (all its calls withdrawn) is removed when it is reached.
