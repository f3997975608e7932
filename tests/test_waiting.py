"""Waiting for batches and calls: a cancelled waiter, several waiters, waiters as the dispatcher closes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, ToolCall

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from dispatcher import Batch

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, idempotent_hint=False)


async def ends_without_help(batch: Batch, wait: Callable[[], Awaitable[object]]) -> bool:
    """Whether `wait()`, run in a task of its own, has ended once `batch` is done and every task is blocked.

    A wait that is shielded from cancellation cannot be cut off by `fail_after`: if it is still parked,
    its batch's wake-ups are set by hand so that the test fails instead of hanging.
    """
    ended = anyio.Event()

    async def run() -> None:
        await wait()
        ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        while not batch.done:
            await anyio.wait_all_tasks_blocked()
        await anyio.wait_all_tasks_blocked()
        on_its_own = ended.is_set()
        if not on_its_own:
            for wakeup in batch._waiters:
                wakeup.set()
    return on_its_own


async def test_a_cancelled_wait_for_a_batch_whose_calls_are_all_queued_returns(anyio_backend: Any) -> None:
    """Cancelling `Batch.wait` while none of its calls has started cancels them and ends the wait at once."""
    release = anyio.Event()

    async def block() -> str:
        await release.wait()
        return "done"

    async def read() -> str:
        return "read"

    async def cancelled_wait() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await second.wait()
        assert scope.cancelled_caught

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(block, annotations=WRITE)
            dispatcher.add_function(read, annotations=READ_ONLY)
            first = dispatcher.batch()
            first.submit(ToolCall("w", "block"))
            second = dispatcher.batch()
            second.submit_all([ToolCall("r1", "read"), ToolCall("r2", "read")])
            await anyio.wait_all_tasks_blocked()
            assert await ends_without_help(second, cancelled_wait), "the cancelled wait hung"
            assert [result.status for result in second.results()] == [CallStatus.CANCELLED] * 2
            release.set()
            (blocked,) = await first.wait()
    assert blocked.ok
