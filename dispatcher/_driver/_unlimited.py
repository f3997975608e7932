"""With no concurrency limit: how many tasks the executor starts in a loop turn, and the feeder that starts the rest.

The gate admits every call at once when there is no limit, and a task per call costs more than a call that
does not wait (`_execution.Executor._run`). So `UnlimitedStarts.pump` starts at most `SPAWN` tasks while no
call is known to wait; the calls beyond a turn's allowance stay queued in the gate, where a call's task
takes them as its own call ends (`Executor._next`, which tells `carried_on`), and the feeder (`_feed`) lets
more tasks start at the next turn: as many as the tasks none of whose calls ended meanwhile (they wait), and
enough to keep `SPAWN` tasks going. A waiting call is thus held back by no call that waits (each turn starts
a task for every task still in its wait, doubling the tasks of a batch whose calls all wait), only by what
the calls ahead of it cost to run.

Only a call a task took as its own ended counts as one that did not wait: a caller submitting calls runs
`pump` as often as it likes, while every task may be waiting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._core._gate import Gate, Ticket
    from ._batch import PendingCall

__all__ = ["SPAWN", "UnlimitedStarts"]

SPAWN = 16
"""The tasks `UnlimitedStarts.pump` may start in one loop turn while no call is known to wait."""


def _not_started(*args: object) -> None:
    raise RuntimeError("the executor has not started")  # pragma: no cover


class UnlimitedStarts:
    """The task starts of an executor with no concurrency limit (see the module's description).

    Args:
        gate: The executor's gate, whose `limit` is None while this starts its tasks.
        is_open: Whether the executor still takes calls.
    """

    __slots__ = ("_checkpoint", "_feeding", "_gate", "_is_open", "_progress", "_run", "_spawn", "_start_soon")

    def __init__(self, gate: Gate[PendingCall], is_open: Callable[[], bool]) -> None:
        self._gate = gate
        self._is_open = is_open
        self._start_soon: Callable[..., object] = _not_started
        self._run: Callable[[PendingCall, Ticket[PendingCall]], Awaitable[None]] = _not_started  # type: ignore[assignment]  # replaced by `start`
        self._checkpoint: Callable[[], Awaitable[None]] = _not_started  # type: ignore[assignment]  # replaced by `start`
        # The task starts this loop turn still allows, whether `_feed` runs, and how many calls tasks took
        # as their own call ended (`carried_on`) since its last turn.
        self._spawn = SPAWN
        self._feeding = False
        self._progress = 0

    def start(
        self,
        start_soon: Callable[..., object],
        run: Callable[[PendingCall, Ticket[PendingCall]], Awaitable[None]],
        checkpoint: Callable[[], Awaitable[None]],
    ) -> None:
        """Start tasks with `start_soon` from now on, each running `run(call, ticket)`; let the loop run with
        `checkpoint`."""
        self._start_soon = start_soon
        self._run = run
        self._checkpoint = checkpoint

    def carried_on(self) -> None:
        """A call's task, its call ended, took another call as its own."""
        self._progress += 1

    def pump(self) -> None:
        """Start tasks for the calls the gate admits, at most as many as this loop turn still allows."""
        gate = self._gate
        allowance = self._spawn
        if allowance <= 0:
            if not self._feeding and gate.may_take:
                self._start_feeder()
            return
        ticket = gate.take()
        if ticket is None:
            return
        start = self._start_soon
        run = self._run
        while ticket is not None:
            work = ticket.item
            work.admit()
            start(run, work, ticket)
            allowance -= 1
            if not allowance:
                break
            ticket = gate.take()
        if allowance or self._feeding:
            self._spawn = allowance
        elif gate.may_take:
            self._spawn = 0
            self._start_feeder()

    def _start_feeder(self) -> None:
        self._feeding = True
        self._start_soon(self._feed)

    async def _feed(self) -> None:
        """Once per loop turn while the gate holds calls it admits and no limit applies: give the turn its
        allowance of task starts and start them (`pump`)."""
        gate = self._gate
        try:
            while True:
                self._progress = 0
                await self._checkpoint()
                if not self._is_open() or not gate.may_take or gate.limit is not None:
                    return
                running = gate.running  # with no limit, each taken call is one task's
                waiting = max(running - self._progress, 0)  # tasks none of whose calls ended since the last turn
                self._spawn = waiting + max(SPAWN - running, 0)
                self.pump()
                if not gate.may_take:
                    return
        finally:
            self._feeding = False
            self._spawn = SPAWN
