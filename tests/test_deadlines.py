"""The executor's deadline watcher (`_deadlines`): one FIFO of call timeouts instead of a timer per call."""

from __future__ import annotations

import gc
import weakref

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, ToolCall
from dispatcher._driver._clock import CallClock
from dispatcher._driver._deadlines import Deadlines

pytestmark = pytest.mark.anyio


@pytest.mark.backends("trio-mockclock")
async def test_a_watched_scope_is_cancelled_at_its_deadline_and_a_forgotten_one_never() -> None:
    cut_at: list[float] = []
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(anyio.current_time, tg.start_soon)

        async def call(seconds: float, runs: float) -> None:
            with anyio.CancelScope() as scope:
                watch = deadlines.watch(scope, anyio.current_time() + seconds)
                try:
                    await anyio.sleep(runs)
                finally:
                    watch.forget()
            if scope.cancelled_caught:
                cut_at.append(anyio.current_time())

        start = anyio.current_time()
        tg.start_soon(call, 5.0, 10.0)  # cut at 5
        await anyio.sleep(1)
        tg.start_soon(call, 5.0, 1.0)  # ends at 2, before its deadline (6)
        await anyio.sleep(1)
        tg.start_soon(call, 5.0, 100.0)  # cut at 7
        tg.start_soon(call, 1.0, 100.0)  # out of order: its scope's own deadline cuts it at 3
        await anyio.sleep(20)
        tg.cancel_scope.cancel()
    assert sorted(round(t - start, 6) for t in cut_at) == [3.0, 5.0, 7.0]


@pytest.mark.backends("asyncio", "trio")
async def test_an_ended_call_s_scope_is_not_kept_alive_by_the_watcher() -> None:
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(anyio.current_time, tg.start_soon)
        scope = anyio.CancelScope()
        with scope:
            watch = deadlines.watch(scope, anyio.current_time() + 60)
            await anyio.lowlevel.checkpoint()
            watch.forget()
        gone = weakref.ref(scope)
        del scope, watch
        await anyio.sleep(0.01)  # the watcher runs, and sleeps until the oldest deadline
        gc.collect()
        assert gone() is None
        tg.cancel_scope.cancel()


@pytest.mark.backends("trio-mockclock")
async def test_a_pause_hands_the_deadline_to_the_scope_and_stops_it() -> None:
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(anyio.current_time, tg.start_soon)
        start = anyio.current_time()
        with anyio.CancelScope() as scope:
            clock = CallClock(None, scope)
            watch = deadlines.watch(scope, start + 5)
            clock.bound(scope, watch)
            await anyio.sleep(2)
            with clock.pausing():  # a person answers for 100 s: not counted
                await anyio.sleep(100)
            await anyio.sleep(10)
        watch.forget()
        assert scope.cancelled_caught
        assert anyio.current_time() - start == pytest.approx(105.0)
        tg.cancel_scope.cancel()


@pytest.mark.backends("trio-mockclock")
async def test_calls_that_end_behind_a_long_call_leave_no_entries_and_the_long_one_is_still_cut() -> None:
    """One call runs the whole time; a thousand start and end behind it: the FIFO stays small."""
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(anyio.current_time, tg.start_soon)
        queued: list[int] = []
        long_scope = anyio.CancelScope()
        with long_scope:
            deadlines.watch(long_scope, anyio.current_time() + 60)
            for _ in range(1000):
                with anyio.CancelScope() as scope:
                    watch = deadlines.watch(scope, anyio.current_time() + 60)
                    await anyio.sleep(0.01)
                    watch.forget()
                queued.append(len(deadlines._watches))
            await anyio.sleep(100)  # the long call's deadline cuts it
        assert long_scope.cancelled_caught
        assert max(queued) <= 2, max(queued)
        tg.cancel_scope.cancel()


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_an_earlier_deadline_after_the_entry_the_watcher_sleeps_for_was_dropped_is_still_kept() -> None:
    """The watcher sleeps for a deadline whose call ended; a shorter deadline watched next is not cut late."""
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(anyio.current_time, tg.start_soon)
        with anyio.CancelScope() as first:
            watch = deadlines.watch(first, anyio.current_time() + 60)
            await anyio.wait_all_tasks_blocked()  # the watcher sleeps until the first deadline
            watch.forget()
        start = anyio.current_time()
        with anyio.CancelScope() as second:
            # Dropped from the FIFO (front and back), the ended entry no longer shows that it is later.
            deadlines.watch(second, start + 0.2)
            await anyio.sleep(5)
        assert second.cancelled_caught, "not cut at its own deadline (the watcher sleeps until the first's)"
        assert anyio.current_time() - start < 3
        tg.cancel_scope.cancel()


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_calls_behind_a_long_call_at_the_head_of_the_fifo_still_time_out_at_their_own_deadline() -> None:
    """A call that runs nearly its whole timeout heads the FIFO; the calls after it are cut at theirs, in order."""
    timeout = 1.0
    async with Dispatcher(call_timeout=timeout, max_concurrency=3) as dispatcher:

        async def work(seconds: float) -> float:
            await anyio.sleep(seconds)
            return seconds

        dispatcher.add_function(work, annotations=ToolAnnotations(read_only_hint=True))
        lengths = [0.95] + [(0.01, 30.0, 0.5)[i % 3] for i in range(12)]
        calls = [ToolCall(f"c{i}", "work", {"seconds": seconds}) for i, seconds in enumerate(lengths)]
        results = await dispatcher.dispatch(calls)
    assert [result.call_id for result in results] == [call.id for call in calls]
    for seconds, result in zip(lengths, results, strict=True):
        assert result.started_at is not None and result.finished_at is not None
        took = result.finished_at - result.started_at
        if seconds > timeout:
            assert result.status is CallStatus.TIMEOUT, result
            assert timeout - 1e-9 <= took < timeout + 0.5, took  # not at the head's deadline, nor later
        else:
            assert result.status is CallStatus.OK, result
