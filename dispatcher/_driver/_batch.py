"""The handles a caller holds: `PendingCall` for one submitted call, `Batch` for calls submitted together.

A handle only waits, reads and cancels; the executor (`_execution.Executor`) drives its lifecycle
(`_lifecycle.CallRecord`, which `PendingCall` extends). Every call settles exactly once; a batch is done
when all of its calls have (`Batch.settled`, which the lifecycle calls once per call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Self

import anyio

from .._core._calls import ToolCall
from .._core._errors import BatchError, NotFinishedError
from .._core._lifecycle import CallRecord, FailFast
from ._turns import InOrder

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType

    from .._core._calls import ToolResult
    from ._coordination import Lease
    from ._execution import Executor
    from ._hooks import CallHooks

_BUILD_HINT = (
    ": build ToolCall(id, name, arguments), or convert a model's tool calls with dispatcher.formats"
    " (anthropic_calls, openai_chat_calls, openai_responses_calls)"
)

__all__ = ["Batch", "PendingCall"]


class PendingCall(CallRecord):
    """A submitted call. `await pending.wait()` gives its result once it has ended.

    Its lifecycle (`_lifecycle.CallRecord`) is the executor's business: read `done`, `result()`, or wait.
    """

    __slots__ = ("_waiters", "lease")

    def __init__(self, call: ToolCall, batch: Batch, queued_at: float) -> None:
        CallRecord.__init__(self, call, batch, batch._hooks, queued_at)  # (no `super()` object per call)
        # One event per task waiting for this call alone (`wait`), set when it settles.
        self._waiters: list[anyio.Event] | None = None
        # The fleet hold the call runs in (set by `_coordination.admitted_runner` for the hold's length):
        # the invocation confirms it and sends its fencing token.
        self.lease: Lease | None = None

    @property
    def done(self) -> bool:
        """Whether the call has a result."""
        return self.outcome is not None

    def result(self) -> ToolResult:
        """The call's result.

        Raises:
            NotFinishedError: The call has not ended yet (await `wait()` first).
        """
        if self.outcome is None:
            raise NotFinishedError(f"call {self.call.id!r} has not finished; await wait() first")
        return self.outcome

    def cancel(self) -> None:
        """Cancel this call if it has not ended: a queued call never starts, a running one is interrupted.

        It then settles as CANCELLED (unless it ended first); its batch goes on with its other calls.
        """
        batch = self.owner
        if batch is not None:
            assert isinstance(batch, Batch)
            batch._executor.cancel([self])

    async def wait(self) -> ToolResult:
        """Wait for the call to end and return its result."""
        if self.outcome is None:
            event = anyio.Event()
            if self._waiters is None:
                self._waiters = [event]
            else:
                self._waiters.append(event)
            try:
                await event.wait()
            except BaseException:
                # A waiter that gives up (a timeout around it) leaves nothing behind on the call.
                if self._waiters is not None and event in self._waiters:
                    self._waiters.remove(event)
                raise
        assert self.outcome is not None
        return self.outcome

    def _wake(self) -> None:
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for event in waiters:
                event.set()

    def __repr__(self) -> str:
        state = self.outcome.status.value if self.outcome is not None else "pending"
        return f"<PendingCall {self.call.id!r} {self.call.name!r} {state}>"


class Batch:
    """Calls submitted one by one, for example as a model streams them.

    Each call is queued as soon as it is submitted and starts as soon as the scheduling rules allow.
    Use it as an async context manager: leaving the block normally waits for every call; leaving it with
    an exception (or a cancellation) cancels the calls that have not ended, waits for them, and lets the
    exception propagate.

    Example:
        async with dispatcher.batch() as batch:
            async for call in model_stream():
                batch.submit(call)
        results = batch.results()
    """

    __slots__ = ("_executor", "_hooks", "_ids", "_in_order", "_remaining", "_waiters", "_works", "fail_fast", "number")

    def __init__(self, executor: Executor, hooks: CallHooks | None = None, *, fail_fast: bool = False) -> None:
        self._executor = executor
        # The failed writes later calls depend on, when the batch fails fast (see `FailFast`).
        self.fail_fast = FailFast() if fail_fast else None
        # Unique in its dispatcher: part of each call's identity, from which its idempotency key derives.
        self.number = executor.number_batch()
        self._in_order: InOrder | None = None
        self._hooks = hooks
        self._works: list[PendingCall] = []
        self._ids: set[str] = set()
        self._remaining = 0
        # One event per waiting task, set when the last call settles.
        self._waiters: list[anyio.Event] = []

    def __len__(self) -> int:
        return len(self._works)

    @property
    def done(self) -> bool:
        """Whether every submitted call has a result."""
        return self._remaining == 0

    def submit(self, call: ToolCall) -> PendingCall:
        """Queue one call behind everything submitted before it.

        Raises:
            BatchError: The item is not a `ToolCall`, or its id is empty or already used in this batch.
            DispatcherClosedError: The dispatcher is not open.
        """
        self._check(call, len(self._works))
        self._ids.add(call.id)
        return self._executor.submit(self, call)

    def submit_all(self, calls: Iterable[ToolCall]) -> list[PendingCall]:
        """Check every call first, then queue them all in order; nothing is queued if one is bad.

        Raises:
            BatchError: One of the items is not a `ToolCall` or has an empty or duplicate id.
        """
        return self._executor.submit_all(self, self._accept(calls))

    def _accept(self, calls: Iterable[ToolCall]) -> list[ToolCall]:
        """Check every call and reserve their ids; raises before anything is reserved if one is bad."""
        if isinstance(calls, ToolCall):
            raise BatchError("expected a sequence of ToolCall, got a single ToolCall: wrap it in a list")
        if isinstance(calls, Mapping | str | bytes):
            raise BatchError(f"expected a sequence of ToolCall, got a {type(calls).__name__}{_BUILD_HINT}")
        calls = list(calls)
        seen = set(self._ids)
        for position, call in enumerate(calls, start=len(self._works)):
            self._check(call, position, seen)
            seen.add(call.id)
        self._executor.check_open()
        self._ids = seen
        return calls

    async def submit_at(self, position: int, call: ToolCall) -> PendingCall:
        """Queue the call at `position` of a turn whose calls arrive in any order (one task per call).

        Positions count the calls handed over with `submit_at` or `skip`, from 0. The call is queued
        once every earlier position has been handed over, so the calls of a turn keep the model's order
        whatever order their tasks run in; this waits until then. A caller cancelled while waiting
        leaves its call unqueued (later positions go on). Call `skip` for a position that will never
        come, or the calls after it wait forever.

        Raises:
            BatchError: The position is not an int >= 0 or was already handed over, or the call is not a
                `ToolCall` or reuses an id.
            DispatcherClosedError: The dispatcher closed before the call could be queued.
        """
        self._check(call, position)
        if self._in_order is None:
            self._in_order = InOrder(self.submit)
        return await self._in_order.submit_at(position, call)

    def skip(self, position: int) -> None:
        """Say that no call will come at `position` (see `submit_at`): the calls after it may be queued.

        Raises:
            BatchError: The position is not an int >= 0 or was already handed over.
        """
        if self._in_order is None:
            self._in_order = InOrder(self.submit)
        self._in_order.skip(position)

    def _check(self, call: object, position: int, seen: set[str] | None = None) -> None:
        if not isinstance(call, ToolCall):
            hint = _BUILD_HINT if isinstance(call, Mapping) else ""
            raise BatchError(f"item {position} is a {type(call).__name__}, not a ToolCall{hint}")
        if not isinstance(call.id, str) or not call.id:
            raise BatchError(f"item {position} has an empty or non-string id: {call.id!r}")
        if call.id in (self._ids if seen is None else seen):
            raise BatchError(
                f"duplicate call id {call.id!r} (item {position}, counting from 0); every call needs its own id"
            )

    def results(self) -> list[ToolResult]:
        """The results in submission order.

        Raises:
            NotFinishedError: Some call has not ended yet (await `wait()` first).
        """
        return [work.result() for work in self._works]

    def cancel(self) -> None:
        """Cancel every call of this batch that has not ended; each gets a CANCELLED result."""
        self._executor.cancel(self._works)

    async def wait(self) -> list[ToolResult]:
        """Wait for every call submitted so far; return all results in submission order.

        If the waiting task is cancelled, the batch's unfinished calls are cancelled and awaited before
        the cancellation propagates.
        """
        if self._remaining:
            event = anyio.Event()
            self._waiters.append(event)
            try:
                await event.wait()
            finally:
                if self._remaining:
                    with anyio.CancelScope(shield=True):
                        self.cancel()
                        # Queued calls settle within `cancel`: an event made after the last one would never be set.
                        if self._remaining:
                            event = anyio.Event()
                            self._waiters.append(event)
                            await event.wait()
        return [work.outcome for work in self._works]  # type: ignore[misc]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and self._remaining:
            self.cancel()
        await self.wait()

    def _add(self, work: PendingCall) -> None:
        """Count a call the executor queues for this batch."""
        work.position = len(self._works)
        self._works.append(work)
        self._remaining += 1
        if self._remaining == 1:
            self._executor.live.add(self)

    def settled(self, record: CallRecord, result: ToolResult) -> None:
        """One of this batch's calls has its result (called once per call, by its lifecycle)."""
        state = record.state
        if state is not None:
            hooks = self._hooks
            assert hooks is not None
            hooks.settled(state, result)
        assert isinstance(record, PendingCall)
        if record._waiters is not None:
            record._wake()
        self._remaining -= 1
        if self._remaining == 0:
            self._executor.live.discard(self)
            waiters = self._waiters
            if waiters:
                self._waiters = []
                for event in waiters:
                    event.set()
        fail_fast = self.fail_fast
        # Noted even when nothing is left: calls submitted later depend on it too (see `Executor._queue`).
        if fail_fast is not None and fail_fast.failed(record, result) and self._remaining:
            self._executor.skip_dependents(self, record)
