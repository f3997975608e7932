"""With `max_concurrency=None` every call that waits runs at once, and calls that never wait share a few tasks.

The gate admits every call at once when there is no limit; the executor starts a bounded number of tasks
per loop turn (`_execution._SPAWN`), the calls' tasks carry on with the calls still queued, and every
loop turn starts a task for each call whose task is in a wait (`Executor._pump_unlimited`).
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, ToolCall, ToolResult
from dispatcher._driver._execution import _SPAWN

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)


def values(results: list[ToolResult]) -> list[object]:
    """What each call's function returned (its structured result)."""
    return [
        r.result.structured_content["result"] if r.result and r.result.structured_content else None for r in results
    ]


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_every_waiting_call_runs_at_once_with_no_limit() -> None:
    """Each call waits until all of them have started: this ends only if every call runs at the same time."""
    n = 20 * _SPAWN
    started = 0
    everyone = anyio.Event()
    async with Dispatcher(max_concurrency=None) as dispatcher:

        async def wait_for_all(i: int) -> int:
            nonlocal started
            started += 1
            if started == n:
                everyone.set()
            await everyone.wait()
            return i

        dispatcher.add_function(wait_for_all, annotations=READ_ONLY)
        calls = [ToolCall(f"c{i}", "wait_for_all", {"i": i}) for i in range(n)]
        with anyio.fail_after(30):
            results = await dispatcher.dispatch(calls)
    assert [result.status for result in results] == [CallStatus.OK] * n
    assert values(results) == list(range(n))


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_waiting_calls_behind_calls_that_never_wait_all_run_at_once_with_no_limit() -> None:
    """Every tenth call waits for all the waiting ones to start, behind thousands that never wait: none is held back."""
    n = 3000
    waiting = n // 10
    started = 0
    everyone = anyio.Event()
    async with Dispatcher(max_concurrency=None) as dispatcher:

        async def quick(i: int) -> int:
            return i

        async def wait_for_all(i: int) -> int:
            nonlocal started
            started += 1
            if started == waiting:
                everyone.set()
            await everyone.wait()
            return i

        dispatcher.add_function(quick, annotations=READ_ONLY)
        dispatcher.add_function(wait_for_all, annotations=READ_ONLY)
        calls = [ToolCall(f"c{i}", "wait_for_all" if i % 10 == 9 else "quick", {"i": i}) for i in range(n)]
        with anyio.fail_after(30):
            results = await dispatcher.dispatch(calls)
    assert [result.call_id for result in results] == [call.id for call in calls]
    assert [result.status for result in results] == [CallStatus.OK] * n
    assert values(results) == list(range(n))


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_calls_that_never_wait_run_on_a_few_tasks_with_no_limit() -> None:
    """A long batch of calls that never wait is not given a task per call: the calls in flight stay few."""
    n = 2000
    seen: list[int] = []
    async with Dispatcher(max_concurrency=None) as dispatcher:

        async def quick(i: int) -> int:
            seen.append(dispatcher.running)
            return i

        dispatcher.add_function(quick, annotations=READ_ONLY)
        calls = [ToolCall(f"c{i}", "quick", {"i": i}) for i in range(n)]
        results = await dispatcher.dispatch(calls)
        # Calls that wait still run at once after the batch that did not.
        started = 0
        everyone = anyio.Event()

        async def wait_for_all(i: int) -> int:
            nonlocal started
            started += 1
            if started == 4 * _SPAWN:
                everyone.set()
            await everyone.wait()
            return i

        dispatcher.add_function(wait_for_all, annotations=READ_ONLY)
        with anyio.fail_after(30):
            later = await dispatcher.dispatch([ToolCall(f"w{i}", "wait_for_all", {"i": i}) for i in range(4 * _SPAWN)])
    assert values(results) == list(range(n))
    assert len(seen) == n
    # Each task holds one call in flight: a task per call would show close to n.
    assert max(seen) <= 4 * _SPAWN, max(seen)
    assert [result.status for result in later] == [CallStatus.OK] * (4 * _SPAWN)
