"""The call timeout of every running call, kept by one watcher task instead of a timer per call.

Every call that gets one attempt runs under the dispatcher's `call_timeout`. Giving each call's cancel
scope that deadline costs a timer of the event loop per call, set as the scope is entered and cancelled
as it exits, which is a good part of what running a call that does not wait costs. Every such deadline
is its call's start plus the same timeout, read on the loop's monotonic clock: deadlines come in the
order calls start. So they are kept in one FIFO (`Deadlines.watch`) and one task (`Deadlines._run`)
sleeps until the oldest, and cancels the scope of each call still running when its deadline has passed;
a call that ends first forgets its entry (`Watch.forget`), which is then dropped as it reaches the head.

The rule: a watched scope is cancelled at the first loop turn at or after its deadline, as its own
deadline would have cancelled it, unless its call forgot it first. A person answering a question of the
call's server stops the call's deadlines (`_clock`): the call's clock hands the deadline back to the scope
itself then (`Watch.take`), and the watcher no longer cuts it.

Cost: O(1) per call (an append, and a pop at the head or at the back later); the watcher wakes at most once per
deadline it sleeps for. With no entry left it sleeps until the latest deadline ever watched (no later call's can
be earlier), and waits to be woken only once that has passed. An entry holds its scope only while its call runs,
and the watcher holds no entry while it sleeps, so a settled call is freed at once.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Protocol

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

    Spawn = Callable[..., object]

__all__ = ["Deadlines", "Scope", "Watch"]


class Scope(Protocol):
    """What a watch cancels at its deadline, or hands the deadline to (a cancel scope, or a view of one)."""

    deadline: float

    def cancel(self) -> None:
        """Cancel it."""


class Watch:
    """One watched deadline: the scope it cancels, until its call ends (`forget`) or takes it (`take`)."""

    __slots__ = ("deadline", "scope")

    def __init__(self, deadline: float, scope: Scope) -> None:
        self.deadline = deadline
        self.scope: Scope | None = scope

    def forget(self) -> None:
        """The call ended: its scope is not to be cancelled."""
        self.scope = None

    def take(self) -> None:
        """Give the deadline to the scope itself (its own timer) and stop watching it."""
        scope = self.scope
        if scope is not None:
            self.scope = None
            scope.deadline = self.deadline


class Deadlines:
    """The FIFO of watched deadlines and its watcher (see the module's description).

    Args:
        now: The loop's clock.
        start_soon: Starts the watcher task (a task group's `start_soon`) at the first deadline watched.
    """

    __slots__ = ("_last", "_now", "_start_soon", "_wake", "_watches")

    def __init__(self, now: Callable[[], float], start_soon: Spawn | None) -> None:
        self._now = now
        self._start_soon = start_soon
        self._watches: deque[Watch] = deque()
        self._wake: anyio.Event | None = None
        # The latest deadline ever watched: what the watcher may be sleeping for, even once its entry
        # was dropped (its call ended), so an earlier one must not join the FIFO behind it.
        self._last = -math.inf

    def watch(self, scope: Scope, deadline: float) -> Watch:
        """Cancel `scope` at `deadline` unless forgotten first.

        A deadline earlier than the latest one watched (which the executor's one call timeout never gives)
        is handed to the scope itself, keeping the FIFO in deadline order: compared with the latest ever
        watched, not the last entry left, since the watcher may sleep for an entry already dropped.
        """
        watches = self._watches
        while watches and watches[0].scope is None:
            watches.popleft()
        # And from the back: behind a long call at the head, the calls that started and ended during it
        # would otherwise leave their entries until it ends.
        while watches and watches[-1].scope is None:
            watches.pop()
        start_soon = self._start_soon
        if start_soon is not None:
            self._start_soon = None
            start_soon(self._run)
        entry = Watch(deadline, scope)
        if deadline < self._last:
            entry.take()  # out of order (a shorter timeout): the scope's own timer keeps it
            return entry
        self._last = deadline
        watches.append(entry)
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()
        return entry

    async def _run(self) -> None:
        """The watcher: sleep until the oldest deadline, cancel what is due, until cancelled."""
        watches = self._watches
        now = self._now
        while True:
            while watches and watches[0].scope is None:
                watches.popleft()
            if not watches:
                last = self._last
                if last > now():
                    # Every deadline watched from now on is at least the latest one watched: sleep until
                    # then rather than be woken by the next call (one wake per loop turn of calls that end at once).
                    await anyio.sleep_until(last)
                    continue
                wake = self._wake = anyio.Event()
                await wake.wait()
                del wake
                continue
            deadline = watches[0].deadline
            if deadline > now():
                await anyio.sleep_until(deadline)
            current = now()
            while watches and watches[0].deadline <= current:
                scope = watches.popleft().scope
                if scope is not None:
                    scope.cancel()
                del scope  # hold nothing of a call while sleeping
