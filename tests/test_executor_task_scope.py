"""Calls of local functions run under their task's cancel scope (`Executor._run`): cancelling one, its call
timeout, a tool that cancels its own task and the dispatcher's close each end that call alone, and the calls
the same task runs next get a fresh scope.

Every test runs with ``max_concurrency=1``, so that one task carries every call of the batch in turn: what
one call did to the task's scope is seen by the calls after it.
"""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, ToolCall

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)


def calls(*keys: str) -> list[ToolCall]:
    return [ToolCall(f"c{i}", "tool", {"key": key}) for i, key in enumerate(keys)]


@pytest.mark.backends("asyncio", "trio")
async def test_cancelling_a_running_call_ends_it_alone_and_the_task_goes_on() -> None:
    """A call cancelled while it runs ends CANCELLED; the calls its task runs after it are not cancelled."""
    started = anyio.Event()

    async def tool(key: str) -> str:
        if key == "wait":
            started.set()
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                works = batch.submit_all(calls("a", "wait", "b", "c"))
                await started.wait()
                works[1].cancel()
            results = batch.results()
            again = await dispatcher.dispatch(calls("d", "e"))
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.CANCELLED, CallStatus.OK, CallStatus.OK]
    assert all(r.status is CallStatus.OK for r in again)


@pytest.mark.backends("asyncio", "trio")
async def test_a_cancel_that_comes_with_the_answer_leaves_the_next_call_alone() -> None:
    """A call cancelled in the same instant its tool is woken with its answer: it ends OK (the answer was in
    hand, under trio) or CANCELLED (asyncio throws the cancellation in), and the call after it in the same
    task runs as usual, not cut short by a cancellation meant for the one before."""
    wake = anyio.Event()
    woken: list[str] = []

    async def tool(key: str) -> str:
        if key == "wait":
            await wake.wait()
            return key  # no checkpoint after the wake: under trio, the cancellation lands in no await of the tool
        woken.append(key)
        await anyio.lowlevel.checkpoint()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                works = batch.submit_all(calls("wait", "next", "last"))
                await anyio.wait_all_tasks_blocked()
                wake.set()
                works[0].cancel()  # no checkpoint between: the tool's task is woken and cancelled at once
            results = batch.results()
    assert results[0].status in (CallStatus.OK, CallStatus.CANCELLED)
    assert [r.status for r in results[1:]] == [CallStatus.OK, CallStatus.OK]
    assert woken == ["next", "last"]


@pytest.mark.backends("trio-mockclock", "asyncio")
async def test_a_call_timeout_cuts_its_call_alone() -> None:
    """The call timeout ends a call that overruns it as TIMEOUT; the next call of the task, which takes less
    than the timeout but ends after the first one's deadline, ends OK."""

    async def tool(key: str) -> str:
        await anyio.sleep(5.0 if key == "long" else 0.3)
        return key

    with anyio.fail_after(30):
        async with Dispatcher(max_concurrency=1, call_timeout=0.5) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            results = await dispatcher.dispatch(calls("short", "long", "short", "short"))
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.TIMEOUT, CallStatus.OK, CallStatus.OK]


@pytest.mark.backends("asyncio", "trio")
async def test_closing_the_dispatcher_ends_a_call_without_a_timeout() -> None:
    """A call with no call timeout that runs when the dispatcher closes ends CANCELLED, and so do the calls
    queued behind it; no waiter hangs and the caller's block goes on."""
    started = anyio.Event()
    results = []

    async def tool(key: str) -> str:
        if key == "wait":
            started.set()
            await anyio.sleep_forever()
        return key

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with Dispatcher(max_concurrency=1, call_timeout=None) as dispatcher:
                dispatcher.add_function(tool, annotations=READ_ONLY)

                async def run() -> None:
                    results.extend(await dispatcher.dispatch(calls("a", "wait", "b")))

                tg.start_soon(run)
                await started.wait()
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.CANCELLED, CallStatus.CANCELLED]


@pytest.mark.backends("asyncio")
@pytest.mark.parametrize("how", ["returns", "absorbs"])
async def test_a_tool_that_cancels_its_own_task_then_a_later_call_cancelled(how: str) -> None:
    """A tool cancels its own task (`Task.cancel`) and returns, or catches the cancellation itself and returns:
    the task's request count stays up. A later call of the same task cancelled by its caller ends CANCELLED
    alone, though its scope's cancellation does not stop at the scope (anyio lets it through when the task
    has more requests than when the scope was entered); the calls after it run, and so does the next batch."""
    started = anyio.Event()

    async def tool(key: str) -> str:
        if key == "self":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            if how == "absorbs":
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    pass
        elif key == "wait":
            started.set()
            await anyio.sleep_forever()
        return key

    rounds = []
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                works = batch.submit_all(calls("a", "self", "b", "wait", "c"))
                await started.wait()
                works[3].cancel()
            results = batch.results()
            rounds.append(1)
            again = await dispatcher.dispatch(calls("d", "e"))
            rounds.append(2)
    statuses = [r.status for r in results]
    assert statuses[3] is CallStatus.CANCELLED
    assert [statuses[i] for i in (0, 2, 4)] == [CallStatus.OK] * 3
    assert statuses[1] in (CallStatus.OK, CallStatus.CANCELLED)  # its own cancellation may land in it
    assert all(r.status is CallStatus.OK for r in again)
    assert rounds == [1, 2]
