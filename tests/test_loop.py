"""The loop primitives the executor parks its runners on: one-shot wake-ups on asyncio and trio."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, ToolCall
from dispatcher._loop import Wakeup, loop_clock, wakeups

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)


async def test_a_wakeup_wakes_its_waiting_task_once(anyio_backend: Any) -> None:
    """`set` lets the parked task go on; a second `set` changes nothing."""
    wakeup = wakeups()()
    woke: list[float] = []

    async def park() -> None:
        await wakeup.wait()
        woke.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        tg.start_soon(park)
        await anyio.wait_all_tasks_blocked()
        assert woke == []
        wakeup.set()
        wakeup.set()
    assert len(woke) == 1


async def test_a_wakeup_set_before_its_wait_returns_at_once(anyio_backend: Any) -> None:
    """A wake-up that was set first does not park its task."""
    wakeup = wakeups()()
    wakeup.set()
    with anyio.fail_after(5):
        await wakeup.wait()


async def test_a_cancelled_wait_leaves_a_later_set_harmless(anyio_backend: Any) -> None:
    """A task cancelled while parked ends cancelled; setting its wake-up afterwards raises nothing."""
    wakeup: Wakeup = wakeups()()
    with anyio.move_on_after(0.01) as scope:
        await wakeup.wait()
    assert scope.cancelled_caught
    wakeup.set()
    await anyio.lowlevel.checkpoint()


async def test_the_loop_clock_is_the_backends_clock(anyio_backend: Any) -> None:
    """`loop_clock` reads the same clock as `anyio.current_time`."""
    clock = loop_clock()
    before = anyio.current_time()
    now = clock()
    after = anyio.current_time()
    assert before <= now <= after


async def test_parked_runners_are_woken_batch_after_batch(anyio_backend: Any) -> None:
    """Runners parked between batches are woken for the next one, on every backend, and are cancelled on exit."""
    dispatcher = Dispatcher(max_concurrency=4)

    async def probe(n: int) -> int:
        await anyio.lowlevel.checkpoint()
        return n

    dispatcher.add_function(probe, annotations=READ_ONLY)
    async with dispatcher:
        for round_ in range(50):
            calls = [ToolCall(id=f"{round_}-{i}", name="probe", arguments={"n": i}) for i in range(1 + round_ % 6)]
            with anyio.fail_after(10):
                results = await dispatcher.dispatch(calls)
            assert [r.status for r in results] == [CallStatus.OK] * len(calls)
            assert [r.call_id for r in results] == [c.id for c in calls]
            await anyio.wait_all_tasks_blocked()  # every runner parks before the next batch


async def test_several_tasks_wait_for_one_batch_and_one_call(anyio_backend: Any) -> None:
    """Every task waiting for a batch or a call is woken; one waiter cancelled does not strand the others."""
    dispatcher = Dispatcher()
    release = anyio.Event()

    async def slow(n: int) -> int:
        await release.wait()
        return n

    dispatcher.add_function(slow, annotations=READ_ONLY)
    seen: list[str] = []
    async with dispatcher:
        async with dispatcher.batch() as batch:
            first = batch.submit(ToolCall(id="a", name="slow", arguments={"n": 1}))
            batch.submit(ToolCall(id="b", name="slow", arguments={"n": 2}))

            async def wait_batch(tag: str) -> None:
                results = await batch.wait()
                seen.append(f"{tag}:{len(results)}")

            async def wait_call(tag: str) -> None:
                result = await first.wait()
                seen.append(f"{tag}:{result.status.value}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_batch, "batch1")
                tg.start_soon(wait_batch, "batch2")
                tg.start_soon(wait_call, "call1")
                tg.start_soon(wait_call, "call2")
                with anyio.move_on_after(0.01):
                    await first.wait()  # a waiter cancelled while the others keep waiting
                await anyio.wait_all_tasks_blocked()
                release.set()
    assert sorted(seen) == ["batch1:2", "batch2:2", "call1:ok", "call2:ok"]


async def test_a_caller_polling_a_long_call_leaves_nothing_behind(anyio_backend: Any) -> None:
    """Waiting for one call under a timeout, again and again, keeps no wake-up per attempt on the call."""
    dispatcher = Dispatcher()
    release = anyio.Event()

    async def slow() -> str:
        await release.wait()
        return "done"

    dispatcher.add_function(slow, annotations=READ_ONLY)
    async with dispatcher:
        async with dispatcher.batch() as batch:
            pending = batch.submit(ToolCall(id="a", name="slow", arguments={}))
            for _ in range(100):
                with anyio.move_on_after(0.001):
                    await pending.wait()
            assert not pending._waiters  # no public view of this: the wake-ups the call would set when it ends
            release.set()
            result = await pending.wait()
    assert result.ok
