"""The running event loop's cheapest primitives: its clock, one-shot wake-ups for a parked task, and
withdrawing a task's own cancellation.

anyio looks the backend up on each `anyio.current_time()` and builds an `anyio.Event` out of the
backend's own event (a deque of waiters and a future per wait on asyncio, a parking lot on trio). The
executor reads the clock a few times per call and parks a runner between batches, so it reads the loop's
clock directly and parks on the backend's lowest-level wait: a future on asyncio, a rescheduled task on
trio. Each wake-up serves one waiting task, once.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 - only to reach a running asyncio loop and task; trio's are reached too
import math
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from collections.abc import Callable

# `trio.lowlevel`, once a wake-up has been made on trio (trio is imported only when it runs).
_trio: Any = None

__all__ = [
    "Wakeup",
    "absorb_own_cancellation",
    "loop_clock",
    "own_cancellation_pending",
    "own_cancellations",
    "wakeups",
    "withdraw_cancellation",
]


def loop_clock() -> Callable[[], float]:
    """The running event loop's clock, read directly: `anyio.current_time` looks up the backend each time."""
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:
        pass
    try:
        import trio
    except ImportError:  # pragma: no cover - anyio runs on asyncio or trio
        return anyio.current_time
    try:
        # The run's clock itself (a `trio.testing.MockClock` in tests): `trio.current_time` looks it up.
        return trio.lowlevel.current_clock().current_time
    except RuntimeError:  # pragma: no cover
        return anyio.current_time


def withdraw_cancellation() -> None:
    """Withdraw the current asyncio task's pending cancellation requests (trio has none to withdraw).

    For a task that cancelled itself while no scope around it was cancelled: it carries on.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not running on asyncio
        return
    if task is not None:
        while task.cancelling():
            task.uncancel()


def own_cancellations() -> Callable[[], bool] | None:
    """Whether the current asyncio task has a cancellation on its way (requests outstanding, or one still
    to be delivered after `Task.uncancel` took the count back to 0), as a callable to ask again cheaply;
    None on trio, where only a cancel scope cancels a task."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not running on asyncio
        return None
    if task is None:
        return None
    return lambda: _cancellation_on_its_way(task)


def own_cancellation_pending() -> bool:
    """Whether the current asyncio task has a cancellation on its way (see `own_cancellations`); False on trio."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not running on asyncio
        return False
    return task is not None and _cancellation_on_its_way(task)


def _cancellation_on_its_way(task: asyncio.Task[Any]) -> bool:
    # `_must_cancel`: the flag asyncio delivers a cancellation by at the task's next wait (anyio reads it too).
    return bool(task.cancelling() or task._must_cancel)  # type: ignore[attr-defined]


async def absorb_own_cancellation() -> bool:
    """Withdraw a cancellation the current asyncio task requested of itself, unless a cancel scope around it
    was cancelled; let it land first, so that it does not land on whatever the task waits for next.

    For a runner after a call whose tool cancelled its own task (`asyncio.current_task().cancel()`) and
    returned before the cancellation could reach it.

    Returns:
        Whether it was withdrawn (False: a cancel scope around the task was cancelled).
    """
    if anyio.current_effective_deadline() == -math.inf:
        return False
    try:
        await anyio.lowlevel.cancel_shielded_checkpoint()
    except anyio.get_cancelled_exc_class():
        pass  # no cancel scope reaches a shielded wait: this is the task's own cancellation
    withdraw_cancellation()
    return True


class Wakeup(Protocol):
    """A one-shot signal for one waiting task: `wait()` returns once `set()` has been called."""

    def set(self) -> None:
        """Wake the waiting task (or let its `wait()` return at once); later calls do nothing."""

    async def wait(self) -> None:
        """Wait until `set()` is called; cancellable like any wait of the backend."""


class _FutureWakeup:
    """asyncio: one future, awaited by one task (a cancelled wait cancels the future: a later `set` is a no-op)."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self._future = future

    def set(self) -> None:
        future = self._future
        if not future.done():
            future.set_result(None)

    async def wait(self) -> None:
        await self._future


class _TaskWakeup:
    """trio: the waiting task is rescheduled directly (`trio.lowlevel.wait_task_rescheduled`)."""

    __slots__ = ("_is_set", "_task")

    def __init__(self) -> None:
        self._task: object = None
        self._is_set = False

    def set(self) -> None:
        if self._is_set:
            return
        self._is_set = True
        task = self._task
        if task is not None:
            self._task = None
            _trio.reschedule(task)

    async def wait(self) -> None:
        if self._is_set:
            await _trio.checkpoint()
            return
        self._task = _trio.current_task()
        await _trio.wait_task_rescheduled(self._abort)

    def _abort(self, _: object) -> object:
        self._task = None  # cancelled while waiting: a later `set` wakes no one
        return _trio.Abort.SUCCEEDED


def wakeups() -> Callable[[], Wakeup]:
    """A factory of one-shot wake-ups for tasks of the running event loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        create = loop.create_future
        return lambda: _FutureWakeup(create())
    global _trio
    try:
        import trio.lowlevel

        trio.lowlevel.current_task()
    except (ImportError, RuntimeError):  # pragma: no cover - anyio runs on asyncio or trio
        return anyio.Event
    _trio = trio.lowlevel
    return _TaskWakeup
