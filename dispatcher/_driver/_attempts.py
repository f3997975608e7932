"""One attempt of a call: invoking its tool, and reading how that ended as an `Attempt`.

The executor (`_execution`) runs a call's attempts, one or the retrier's, under the call's cancel scope;
each attempt comes here. A tool's failure is a result, never an exception that could cancel siblings:
`invoke` turns whatever the tool raised into an `Attempt` (through `_mcp._failures`), except a request to
stop (KeyboardInterrupt, SystemExit, a cancellation of a scope around the call), which propagates.
`attempt_scoped` bounds an attempt that another may follow by a deadline of its own, and `absorb_stray`
is the one place a cancellation a tool left on its own task (asyncio's `Task.cancel`) is absorbed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .._core._calls import CallStatus
from .._core._errors import ToolUnavailableError
from .._core._outcomes import SELF_CANCEL
from .._mcp._failures import describe as describe_failure
from ._clock import current_clock
from ._retry import Attempt, is_transient

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from mcp.types import CallToolResult

    from ._batch import PendingCall

__all__ = [
    "absorb_stray",
    "attempt_scoped",
    "caught",
    "error_text",
    "failed",
    "failed_base",
    "invoke",
    "stray",
    "tool_failure",
]


async def invoke(work: PendingCall) -> Attempt:
    """Invoke the tool once and describe how that ended."""
    impl = work.impl
    assert impl is not None
    try:
        result = await impl.invoke(work.prepared, work.lease)
    except BaseException as exc:
        return caught(exc)
    if result.is_error:
        return Attempt(CallStatus.TOOL_ERROR, result, error_text(result))
    return Attempt(CallStatus.OK, result)


def caught(exc: BaseException) -> Attempt:
    """How an attempt whose tool raised `exc` ended; a request to stop is raised instead (see `invoke`).

    Called in the block that caught `exc`, by `invoke` and by the executor's one-attempt path, which awaits the
    tool itself (a coroutine and an `Attempt` fewer per call).
    """
    if isinstance(exc, Exception):
        return failed(exc)
    if tool_failure(exc):
        return failed_base(exc)
    stop = _cancellation(exc)
    try:
        raise stop  # `exc` itself, or the cancellation in its group (the group is its context)
    finally:
        # A local holding the exception would tie it to this frame: a cycle only the collector frees.
        del stop, exc


async def attempt_scoped(
    work: PendingCall,
    start: float,
    limit: float,
    call_timeout: float | None,
    retry_timeout: float | None,
    cancel_scope: Callable[..., anyio.CancelScope],
) -> Attempt:
    """Invoke the tool once, cut off at the call timeout or at `limit` (the retry deadline)."""
    deadline = limit if call_timeout is None else min(limit, start + call_timeout)
    with cancel_scope(deadline=deadline) as scope:
        clock = current_clock()
        if clock is not None:
            clock.bound(scope)
        return await invoke(work)
    # Only the attempt's own deadline is absorbed by its scope; a cancellation of the call
    # (or of the dispatcher) is still pending and is raised here.
    await anyio.lowlevel.checkpoint_if_cancelled()
    if call_timeout is None or deadline == limit:
        # A finite limit comes from the retry policy's deadline.
        return Attempt(
            CallStatus.TIMEOUT,
            error=f"no result before the retry deadline (RetryPolicy.timeout={retry_timeout}s)",
            transient=True,
        )
    return Attempt(CallStatus.TIMEOUT, error=f"no result within call_timeout={call_timeout}s", transient=True)


async def absorb_stray(checkpoint: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint) -> None:
    """Let a cancellation the tool left on its own task land here, and absorb it (asyncio only).

    A tool may cancel the task it runs in (`asyncio.current_task().cancel()`, now or scheduled with
    `call_soon`) and return: no cancel scope asked for that cancellation, so none would catch it, and
    it would land on whatever the task waits for next (the next attempt's backoff) or, as the task
    ends, cancel the dispatcher's task group. One checkpoint between attempts, and one as the call's
    task ends (after the call settled and the gate was told), let it land here. A
    cancellation that comes from a cancelled scope around the call (the call's, the dispatcher's) is
    not the tool's and propagates.
    """
    try:
        await checkpoint()
    except BaseException as exc:
        if not stray(exc):
            raise


def stray(exc: BaseException) -> bool:
    """Whether `exc`, raised at a checkpoint after a call or an attempt, is a cancellation a tool left on its own
    task, to absorb there (see `absorb_stray`): a cancellation no cancelled scope around the task asked for."""
    # -inf once a scope around this task is cancelled: that cancellation is not the tool's, and goes on.
    return isinstance(exc, anyio.get_cancelled_exc_class()) and anyio.current_effective_deadline() != -math.inf


def tool_failure(exc: BaseException) -> bool:
    """Whether `exc`, which is no `Exception`, is the tool's failure rather than a request to stop.

    KeyboardInterrupt and SystemExit stop the program, and a cancellation raised because a scope
    (the call's, the dispatcher's) was cancelled ends the call as cancelled: those propagate. Any
    other (GeneratorExit, a BaseException subclass of the tool's own, the cancellation exception
    raised while nothing was cancelled) ends that call alone, so a hostile tool cannot end the batch.
    """
    cancelled = anyio.get_cancelled_exc_class()
    if isinstance(exc, BaseExceptionGroup):
        if exc.split((KeyboardInterrupt, SystemExit))[0] is not None:
            return False
        if exc.split(cancelled)[0] is None:
            return True
    elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return False
    elif not isinstance(exc, cancelled):
        return True
    # No enclosing scope was cancelled (-inf once one is): the tool raised the exception itself, or
    # cancelled its own task.
    return anyio.current_effective_deadline() != -math.inf


def _cancellation(exc: BaseException) -> BaseException:
    """What a request to stop that ended an attempt propagates as: `exc` itself, or the first cancellation in a
    group that holds nothing else that stops the program.

    A tool's task group cancelled with its call (trio's nursery) may raise the cancellation together with what
    its tasks raised as they were cancelled; propagated whole, the scope that was cancelled would catch the
    cancellation and let the rest through, ending the dispatcher. The cancellation goes on alone (the group
    is its context), and the call ends as that cancellation says: cancelled, timed out, closed.
    """
    if not isinstance(exc, BaseExceptionGroup) or exc.split((KeyboardInterrupt, SystemExit))[0] is not None:
        return exc
    cancelled = anyio.get_cancelled_exc_class()
    found: BaseException = exc
    while isinstance(found, BaseExceptionGroup):
        group = found.split(cancelled)[0]
        assert group is not None  # `tool_failure`: a group with no cancellation is the tool's failure
        found = group.exceptions[0]
    return found


def failed_base(exc: BaseException) -> Attempt:
    """How an attempt whose tool raised `exc`, which is no `Exception`, ended."""
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        name = type(exc).__name__
        return Attempt(CallStatus.CANCELLED, error=f"{name} without a cancellation of the dispatcher's: {SELF_CANCEL}")
    return Attempt(CallStatus.FAILED, error=f"the tool raised {type(exc).__name__}")


def failed(exc: Exception) -> Attempt:
    """How an attempt that raised `exc` ended."""
    status, error = describe_failure(exc)
    # Why a tool is unavailable can quote its server (a blocked tool's changed definition).
    unavailable = isinstance(exc, ToolUnavailableError)
    return Attempt(status, error=error, transient=is_transient(exc), untrusted=unavailable)


def error_text(result: CallToolResult) -> str:
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]  # type: ignore[union-attr]
    return " ".join(texts).strip() or "the tool reported an error"
