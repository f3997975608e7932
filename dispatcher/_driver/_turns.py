"""Calls handed over by position, in any order, queued in position order.

Frameworks such as the OpenAI Agents SDK start one task per tool call of a model turn, and the order in
which those tasks start is arbitrary (trio randomises it on purpose). The scheduling rules need the
model's order, so each call is handed over with its position in the turn and queued only once every
earlier position has been handed over or skipped.

`Positions` is the bookkeeping alone, with no I/O: `put(position, item)` and `skip(position)` return the
items that may now be queued, in position order. Rules:

- a position is handed over (put or skipped) at most once; positions are integers >= 0;
- an item is released once every position before it has been handed over;
- every put item is released exactly once, in position order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import anyio

from .._core._errors import BatchError, DispatcherError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core._calls import ToolCall
    from ._batch import PendingCall

__all__ = ["InOrder", "Positions"]

T = TypeVar("T")

_SKIPPED = object()


class Positions(Generic[T]):
    """Items put at positions in any order, released in position order."""

    __slots__ = ("_held", "_next")

    def __init__(self) -> None:
        self._next = 0
        self._held: dict[int, object] = {}

    @property
    def next(self) -> int:
        """The first position not handed over yet: everything before it has been released or skipped."""
        return self._next

    def put(self, position: int, item: T) -> list[T]:
        """Hand over the item at `position`; return the items now released, in position order.

        Raises:
            ValueError: The position is negative, not an int, or was already handed over.
        """
        self._check(position)
        self._held[position] = item
        return self._release()

    def skip(self, position: int) -> list[T]:
        """Mark `position` as never coming; return the items now released, in position order.

        Raises:
            ValueError: The position is negative, not an int, or was already handed over.
        """
        self._check(position)
        self._held[position] = _SKIPPED
        return self._release()

    def _check(self, position: int) -> None:
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"a position is an int >= 0, got {position!r}")
        if position < self._next or position in self._held:
            raise ValueError(f"position {position} was already handed over")

    def _release(self) -> list[T]:
        released: list[T] = []
        held = self._held
        while self._next in held:
            item = held.pop(self._next)
            self._next += 1
            if item is not _SKIPPED:
                released.append(item)  # type: ignore[arg-type]  # only put() stores other objects
        return released


class _Waiter:
    __slots__ = ("abandoned", "call", "error", "event", "pending")

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.event = anyio.Event()
        self.pending: PendingCall | None = None
        self.error: DispatcherError | None = None
        self.abandoned = False


class InOrder:
    """Submit calls handed over by position to `submit`, in position order (see the module docstring).

    A caller waits in `submit_at` until every earlier position has been handed over; if it is cancelled
    while waiting, its call is never submitted (and later positions go on); if it is cancelled just as
    its call was submitted, that call is cancelled.
    """

    __slots__ = ("_positions", "_submit")

    def __init__(self, submit: Callable[[ToolCall], PendingCall]) -> None:
        self._submit = submit
        self._positions: Positions[_Waiter] = Positions()

    async def submit_at(self, position: int, call: ToolCall) -> PendingCall:
        """Hand over the call at `position`; return it once it is queued behind every earlier position.

        Raises:
            BatchError: The position is invalid or already handed over, or the call cannot be queued
                (not a `ToolCall`, a duplicate id).
            DispatcherClosedError: The dispatcher closed before the call could be queued.
        """
        waiter = _Waiter(call)
        try:
            released = self._positions.put(position, waiter)
        except ValueError as exc:
            raise BatchError(str(exc)) from None
        self._release(released)
        try:
            await waiter.event.wait()
        except BaseException:
            waiter.abandoned = True
            if waiter.pending is not None:
                waiter.pending.cancel()
            raise
        if waiter.error is not None:
            raise waiter.error
        assert waiter.pending is not None
        return waiter.pending

    def skip(self, position: int) -> None:
        """Say that no call will come at `position` (one the framework handled itself, say).

        Raises:
            BatchError: The position is invalid or already handed over.
        """
        try:
            released = self._positions.skip(position)
        except ValueError as exc:
            raise BatchError(str(exc)) from None
        self._release(released)

    def _release(self, waiters: list[_Waiter]) -> None:
        # Synchronous on purpose: the released calls are queued in position order before any task runs.
        for waiter in waiters:
            if not waiter.abandoned:
                try:
                    waiter.pending = self._submit(waiter.call)
                except DispatcherError as exc:
                    waiter.error = exc
            waiter.event.set()
