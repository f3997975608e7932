"""A call's clock: the deadlines that bound one call, which stop while a person answers its server's question.

The executor starts a `CallClock` for each call of a server's tool it runs (`start_clock`, in the call's
task; a local function's call has none, `no_clock`) and hands it every cancel scope whose deadline bounds
the call (`bound`): the call timeout, an attempt's deadline. The MCP boundary adds its own (a task's
`task_timeout`, the idle timeout) and sets the idle wait again on each progress report through `reset`.
While a question from the call's server is with the person (`paused`),
every one of those deadlines is lifted; when the last open question is answered, each gets back the time
it had left. So a person who takes two minutes to answer is not a timeout, and the time a call may spend
working, not waiting for the person, is what the timeouts bound.

The rule: between `pause` and the matching `resume` (they nest: a call whose server asks two questions at
once is paused until both are answered) no bound scope's deadline passes; outside, each scope's deadline
is its own minus nothing, plus the time paused since it was bound. Each operation costs O(number of
scopes bound), which is at most a few per call (one per attempt, a task bound, an idle wait).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .._core._calls import ToolCall
    from ._deadlines import Watch

__all__ = ["CallClock", "current_clock", "no_clock", "start_clock"]


class CallClock:
    """The deadlines of one call (see the module docstring); `call` is the call they bound."""

    __slots__ = ("_interrupt", "_left", "_paused", "_scopes", "_watch", "call")

    def __init__(self, call: ToolCall | None, interrupt: anyio.CancelScope | None = None) -> None:
        self.call = call
        # The scope whose cancellation ends the call (its caller, its batch, the dispatcher's close).
        self._interrupt = interrupt
        self._scopes: list[anyio.CancelScope] = []
        self._paused = 0
        # While paused: the time each scope had left when the pause began (None: never paused).
        self._left: dict[int, float] | None = None
        # The call timeout, while the executor's watcher keeps it rather than the scope (`_deadlines`).
        self._watch: Watch | None = None

    @property
    def cancelled(self) -> bool:
        """Whether the call is being cancelled (or was cut at its deadline): nobody waits for it any more.

        True from the moment of the cancellation, before the call's task has unwound: a question of
        the call then asks nobody, even if the person became free in the same instant.
        """
        return self._interrupt is not None and self._interrupt.cancel_called

    @property
    def paused(self) -> bool:
        """Whether a question to the person is open for this call."""
        return self._paused > 0

    def bound(self, scope: anyio.CancelScope, watch: Watch | None = None) -> None:
        """Let `scope`'s deadline stop while the call is paused (a scope bound while paused stops at once).

        `watch`: the scope's deadline is kept by the executor's watcher (`_deadlines`); a pause hands it
        to the scope first, so that it stops with the others.
        """
        self._scopes.append(scope)
        if watch is not None:
            self._watch = watch
        if self._paused:
            self._take_watch()
            self._stop(scope, anyio.current_time())

    def reset(self, scope: anyio.CancelScope, seconds: float) -> None:
        """Give `scope` `seconds` from now (or from the end of the pause, while paused)."""
        left = self._left
        if self._paused and left is not None and id(scope) in left:
            left[id(scope)] = seconds
        else:
            scope.deadline = anyio.current_time() + seconds

    def pause(self) -> None:
        """A question is with the person: stop every bound deadline (nested pauses count)."""
        self._paused += 1
        if self._paused == 1:
            self._take_watch()
            self._left = {}
            now = anyio.current_time()
            for scope in self._scopes:
                self._stop(scope, now)

    def resume(self) -> None:
        """A question was answered: the last one gives each deadline back the time it had left."""
        if self._paused == 0:
            return
        self._paused -= 1
        if self._paused:
            return
        now = anyio.current_time()
        left, self._left = self._left or {}, None
        for scope in self._scopes:
            remaining = left.get(id(scope))
            if remaining is not None:
                scope.deadline = now + remaining

    @contextmanager
    def pausing(self) -> Iterator[None]:
        """`pause` for the duration of the block."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def _take_watch(self) -> None:
        watch = self._watch
        if watch is not None:
            self._watch = None
            watch.take()

    def _stop(self, scope: anyio.CancelScope, now: float) -> None:
        deadline = scope.deadline
        left = self._left
        assert left is not None  # set by `pause`
        if scope.cancel_called or math.isinf(deadline) or id(scope) in left:
            return  # already cut off (a pause cannot revive it), or not bounded
        left[id(scope)] = max(0.0, deadline - now)
        scope.deadline = math.inf


_clock: ContextVar[CallClock | None] = ContextVar("dispatcher_clock", default=None)


def start_clock(call: ToolCall | None, interrupt: anyio.CancelScope | None = None) -> CallClock:
    """A fresh clock for the call this task runs from now on (what `current_clock` returns here).

    `interrupt` is the scope that ends the call when cancelled (see `CallClock.cancelled`).
    """
    clock = CallClock(call, interrupt)
    _clock.set(clock)
    return clock


def no_clock() -> CallClock | None:
    """No clock for the call this task runs from now on: one whose server no person is asked about.

    A task inherits the clock of the call whose task started it, and carries on with further calls:
    none of those calls' clocks is left in place for this one.
    """
    if _clock.get() is not None:
        _clock.set(None)
    return None


def current_clock() -> CallClock | None:
    """The clock of the call this task runs, or None outside a call."""
    return _clock.get()
