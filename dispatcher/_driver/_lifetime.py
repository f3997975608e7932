"""A dispatcher's lifetime: the task group its calls run in, from `__aenter__` to `__aexit__`.

A dispatcher is entered once. Registering local functions and servers added with `add_mcp_server` is
allowed before it is entered and while it is open, never after it closed; submitting calls and
`connect` need it open. Whether it is open is the executor's to say (`Executor.check_open`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from .._core._errors import DispatcherClosedError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from anyio.abc import TaskGroup

    from ._execution import Executor

__all__ = ["Lifetime"]


class Lifetime:
    """Opens a dispatcher's task group for its executor, and closes both."""

    __slots__ = ("_executor", "_tg")

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._tg: TaskGroup | None = None

    @property
    def task_group(self) -> TaskGroup:
        """The open task group (the dispatcher must have been entered)."""
        assert self._tg is not None
        return self._tg

    async def enter(self) -> None:
        """Open the task group and start the executor in it."""
        if self._tg is not None:
            raise DispatcherClosedError("this Dispatcher is already open; create one per async with block")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._executor.start(tg)

    async def exit(
        self,
        close: Callable[[], Awaitable[object]],
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """End the outstanding calls, await `close` (the owned connections), then close the task group."""
        tg = self._tg
        assert tg is not None
        # Outstanding calls end as CANCELLED; waiters get their results instead of hanging.
        self._executor.close()
        # Owned clients close cleanly first; cancelling them mid-exit would leave transports half-closed.
        await close()
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The dispatcher's own tasks turn every failure into a result, so a group that holds only
            # the body's exception is the task group wrapping it: let it propagate as it was raised.
            if exc is not None and group.split(lambda error: error is exc)[1] is None:
                return False
            raise

    def check_open(self) -> None:
        """Raise `DispatcherClosedError` unless calls can be submitted."""
        self._executor.check_open()

    def check_not_closed(self) -> None:
        """Raise `DispatcherClosedError` if the dispatcher was entered and has closed."""
        if self._tg is not None:
            self._executor.check_open()  # entered once: registering is only for while it is open
