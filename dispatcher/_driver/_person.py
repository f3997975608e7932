"""The one human channel: approvals and servers' questions reach the person one prompt at a time.

A dispatcher has one `Person`, whatever asks: the approver of a call that needs confirmation (the
dispatcher's or a batch's own, `_hooks`) and a server's question during a call (`ask_user`,
`_mcp._questions`). Each prompt takes a turn on it, so one person never sees two prompts at once: two
concurrent reads that each ask a question and a write waiting for approval are put to the person one
after another.

Order: a prompt's place is its ticket (`ticket`), taken when it is asked for: an approval when its
call is submitted (so a batch's approvals come in the batch's order), a question when it reaches the
dispatcher. Waiting prompts are shown lowest ticket first, and a prompt that finds the person free first
lets the other prompts asked at the same moment join the queue (one checkpoint), so the order does not
depend on how the event loop happens to run tasks started together (trio shuffles them). A flood of
questions from one server cannot push an approval far back: each server's waiting questions are bounded
(`QuestionPolicy.waiting`).

Time: a prompt's own patience (`ApprovalPolicy.timeout`, `QuestionPolicy.timeout`) counts from when it
is shown, not while it waits its turn; a question's call has its clock paused for both (`_clock`).
Withdrawing a prompt (its call was cancelled or ended) while it waits frees its place; while shown, it
ends the prompt and the next one is shown.

Re-entrancy: a prompt asked from inside the handling of the prompt on screen (an approver or an
`ask_user` that itself dispatches a call needing approval on the same dispatcher) is part of that prompt:
it is shown at once, inside it, instead of queueing behind the prompt that waits for it (which would
never end). The turn a task holds is a context variable, so it reaches the tasks the handler's dispatch
starts (task groups copy the starting task's context), and it counts only while that turn is on screen.

Cost: a heap push and pop and one checkpoint per prompt; nothing when no prompt is asked.
"""

from __future__ import annotations

import heapq
from contextlib import asynccontextmanager
from contextvars import ContextVar
from itertools import count
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["Person", "held_turn"]


class _Turn:
    """One prompt's turn on screen (what the tasks of its handler hold)."""

    __slots__ = ()


# The turn the prompt being handled in this task holds, if any (its handler's own prompts nest in it).
_holding: ContextVar[_Turn | None] = ContextVar("dispatcher_person_turn", default=None)


def held_turn() -> object:
    """The turn the prompt handled in this task holds (None: none), for a prompt that will come from elsewhere.

    A server's question arrives in its connection's task, not in the call's: the call takes this when it
    starts, and its question nests in that turn while it is on screen.
    """
    return _holding.get()


class Person:
    """The person behind a dispatcher's approver and question handler: one prompt shown at a time."""

    __slots__ = ("_busy", "_on_screen", "_queue", "_shown", "_tickets")

    def __init__(self) -> None:
        self._tickets = count()
        # The prompts waiting for their turn: (ticket, the event that lets it be shown), a heap.
        self._queue: list[tuple[int, anyio.Event]] = []
        self._busy = False
        self._shown = 0
        # The turns on screen: the queue's one, and any prompts nested in it.
        self._on_screen: set[_Turn] = set()

    def ticket(self) -> int:
        """A place in the queue, taken when a prompt is asked for (a lower ticket is shown first)."""
        return next(self._tickets)

    def holding(self) -> bool:
        """Whether this task runs inside the handling of a prompt on screen (a prompt it asks nests in it)."""
        return _holding.get() in self._on_screen

    @asynccontextmanager
    async def turn(self, ticket: int | None = None, *, within: object = None) -> AsyncIterator[None]:
        """Wait for the person to be free and the prompt's turn, then hold the person for the block.

        A prompt asked from inside the handling of the prompt on screen (`holding`, or `within` that
        turn: a `held_turn` the caller took where the prompt's cause began) is shown at once, inside it.
        """
        if (within is not None and within in self._on_screen) or self.holding():
            self._shown += 1
            await anyio.lowlevel.checkpoint()
            async with self._showing():
                yield
            return
        ready = anyio.Event()
        entry = (self.ticket() if ticket is None else ticket, ready)
        heapq.heappush(self._queue, entry)
        try:
            # The prompts asked at this same moment join the queue before one of them is shown.
            await anyio.lowlevel.checkpoint()
            self._admit()
            await ready.wait()
        except BaseException:
            if ready.is_set():  # its turn came as it was withdrawn: the next one's turn
                self._busy = False
                self._admit()
            else:
                self._queue.remove(entry)
                heapq.heapify(self._queue)
            raise
        self._shown += 1
        try:
            async with self._showing():
                yield
        finally:
            self._busy = False
            self._admit()

    @asynccontextmanager
    async def _showing(self) -> AsyncIterator[None]:
        turn = _Turn()
        self._on_screen.add(turn)
        token = _holding.set(turn)
        try:
            yield
        finally:
            _holding.reset(token)
            self._on_screen.discard(turn)

    def _admit(self) -> None:
        if not self._busy and self._queue:
            _, ready = heapq.heappop(self._queue)
            self._busy = True
            ready.set()

    @property
    def busy(self) -> bool:
        """Whether a prompt is being shown at this moment."""
        return self._busy

    @property
    def waiting(self) -> int:
        """How many prompts wait for their turn."""
        return len(self._queue)

    @property
    def shown(self) -> int:
        """How many prompts have been shown so far."""
        return self._shown
