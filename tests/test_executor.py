"""How the driver runs admitted calls, one task each, seen from the calls' results and the loop's tasks."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations
from trio.testing import MockClock

from dispatcher import CallStatus, Dispatcher, PendingCall, ToolCall, ToolResult
from dispatcher._driver._clock import current_clock, start_clock
from tests.batches import mixed_batch

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)


class Overlap:
    """A tool that sleeps, counting how many of its calls are running at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.active = 0
        self.most = 0

    async def sleeper(self, key: str) -> str:
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            await anyio.sleep(self.seconds)
        finally:
            self.active -= 1
        return key


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
@pytest.mark.parametrize("limit", [None, 100])
async def test_calls_that_wait_all_run_together_up_to_the_limit(limit: int | None) -> None:
    """200 waiting reads with no limit (or 100 with a limit of 100) all overlap."""
    sleeper = Overlap(1.0)
    count = 200 if limit is None else 100
    async with Dispatcher(max_concurrency=limit) as dispatcher:
        dispatcher.add_function(sleeper.sleeper, annotations=READ_ONLY)
        started = anyio.current_time()
        results = await dispatcher.dispatch([ToolCall(f"c{i}", "sleeper", {"key": str(i)}) for i in range(count)])
        elapsed = anyio.current_time() - started
    assert [result.status for result in results] == [CallStatus.OK] * count
    assert sleeper.most == count
    assert elapsed < 30, "the calls ran one after another"


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_calls_admitted_together_start_in_the_same_turn_of_the_loop() -> None:
    """The reads of one batch all start before any of them gets past its first checkpoint."""
    events: list[tuple[str, str]] = []

    async def step(key: str) -> str:
        events.append(("entered", key))
        await anyio.lowlevel.checkpoint()
        events.append(("passed", key))
        return key

    async with Dispatcher() as dispatcher:
        dispatcher.add_function(step, annotations=READ_ONLY)
        for _ in range(2):
            events.clear()
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "step", {"key": str(i)}) for i in range(8)])
            assert all(result.ok for result in results)
            assert [what for what, _ in events[:8]] == ["entered"] * 8, events


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_a_call_cancelled_as_it_ends_leaves_the_next_call_alone() -> None:
    """A call that is cancelled while it returns does not carry the cancellation into the next call."""
    handles: dict[str, PendingCall] = {}

    async def first() -> str:
        handles["first"].cancel()  # lands on the call's scope, but the call returns before a checkpoint
        return "first"

    async def second() -> str:
        await anyio.sleep(0.01)  # a leftover cancellation would land here
        return "second"

    async with Dispatcher(max_concurrency=1) as dispatcher:
        dispatcher.add_function(first, annotations=READ_ONLY)
        dispatcher.add_function(second, annotations=READ_ONLY)
        async with dispatcher.batch() as batch:
            handles["first"] = batch.submit(ToolCall("1", "first"))
            batch.submit(ToolCall("2", "second"))
            batch.submit(ToolCall("3", "second"))
        one, two, three = batch.results()
    assert one.status in (CallStatus.OK, CallStatus.CANCELLED)
    assert two.ok and three.ok, (two, three)


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_a_timed_out_call_leaves_the_next_calls_their_whole_timeout(virtual_clock: bool) -> None:
    """After a call times out, the next calls run under a fresh deadline of their own."""

    async def hang() -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def nap(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "rested"

    # Naps of 0.6 of the timeout: the second would outlast what is left of the first's deadline. On a
    # real clock the naps are short, so that a loaded machine's stalls fit in what they leave: a stale
    # deadline has passed already there. The whole-timeout bound is checked exactly on the virtual clock.
    timeout, seconds = (1.0, 0.6) if virtual_clock else (2.0, 0.1)
    async with Dispatcher(max_concurrency=1, call_timeout=timeout) as dispatcher:
        dispatcher.add_function(hang, annotations=READ_ONLY)
        dispatcher.add_function(nap, annotations=READ_ONLY)
        results = await dispatcher.dispatch(
            [
                ToolCall("h", "hang"),
                ToolCall("a", "nap", {"seconds": seconds}),
                ToolCall("b", "nap", {"seconds": seconds}),
            ]
        )
    hung, first, second = results
    assert hung.status is CallStatus.TIMEOUT and hung.attempts == 1
    assert first.ok and second.ok, (first, second)


@pytest.mark.backends("trio-mockclock")
async def test_a_call_times_out_at_its_timeout_and_not_before(anyio_backend: Any) -> None:
    """On a virtual clock, a call that never answers ends at call_timeout, within a few milliseconds."""

    async def quick() -> str:
        return "quick"

    async def hang() -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with Dispatcher(max_concurrency=1, call_timeout=5.0) as dispatcher:
        dispatcher.add_function(quick, annotations=READ_ONLY)
        dispatcher.add_function(hang, annotations=READ_ONLY)
        # Quick calls first: their deadlines were set before the hanging call started.
        calls = [ToolCall(f"q{i}", "quick") for i in range(50)] + [ToolCall("h", "hang")]
        results = await dispatcher.dispatch(calls)
    hung = results[-1]
    assert hung.status is CallStatus.TIMEOUT
    assert hung.started_at is not None
    assert 5.0 <= hung.finished_at - hung.started_at <= 5.01


@pytest.mark.backends("trio-mockclock")
@pytest.mark.parametrize("call_timeout", [0.5, 600.0])
async def test_a_call_is_cut_off_at_its_timeout_exactly(anyio_backend: Any, call_timeout: float) -> None:
    """A call that never answers ends at call_timeout to the tick of the virtual clock, after short calls
    that each had a deadline of their own (no deadline is shared between calls, so none is moved late)."""

    async def nap() -> str:
        await anyio.sleep(call_timeout / 5000)
        return "rested"

    async def hang() -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with Dispatcher(max_concurrency=1, call_timeout=call_timeout) as dispatcher:
        dispatcher.add_function(nap, annotations=READ_ONLY)
        dispatcher.add_function(hang, annotations=READ_ONLY)
        results = await dispatcher.dispatch([ToolCall(f"n{i}", "nap") for i in range(20)] + [ToolCall("h", "hang")])
    hung = results[-1]
    assert all(result.ok for result in results[:-1])
    assert hung.status is CallStatus.TIMEOUT and hung.started_at is not None
    assert call_timeout <= hung.finished_at - hung.started_at <= call_timeout + 1e-9


def _call_tasks() -> int:
    """How many tasks of the loop are running a call (the driver's `Executor._run`)."""
    return sum("Executor._run" in (task.name or "") for task in anyio.get_running_tasks())


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("limit", [1, 16])
@pytest.mark.slow
async def test_a_long_batch_has_no_more_call_tasks_than_its_limit(anyio_backend: Any, limit: int) -> None:
    """5,000 calls that never wait, and as many that wait a turn: only admitted calls get a task, so the
    tasks of calls never outnumber max_concurrency, however long the batch (twice it at most for one turn
    of the loop: a call's task lets the loop run once after its call ended and its place went to the
    next, so that a tool's cancellation of its own task lands there)."""
    counts: list[int] = []

    async def count(n: int, wait: bool) -> int:
        if wait:
            await anyio.lowlevel.checkpoint()
        if n % 125 == 0:
            counts.append(_call_tasks())
        return n

    dispatcher = Dispatcher(max_concurrency=limit)
    dispatcher.add_function(count, annotations=READ_ONLY)
    async with dispatcher:
        for wait in (False, True):
            calls = [ToolCall(id=str(n), name="count", arguments={"n": n, "wait": wait}) for n in range(5_000)]
            results = await dispatcher.dispatch(calls)
            assert all(result.ok for result in results)
            await anyio.wait_all_tasks_blocked()
            assert _call_tasks() == 0, "a call's task outlived its call"
    assert len(counts) == 80
    assert 1 <= max(counts) <= 2 * limit, counts


def _line_counter(lines: list[int]) -> Callable[[FrameType, str, Any], Any]:
    """A `sys.settrace` function counting the lines Python runs (the dispatcher's, anyio's, trio's)."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            lines[0] += 1
        return local

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        return local

    return trace


@pytest.mark.backends("trio-mockclock")
@pytest.mark.parametrize("limit", [1, 16, None])
async def test_the_work_per_call_does_not_grow_with_the_batch(anyio_backend: Any, limit: int | None) -> None:
    """The lines of Python run per call are the same in a batch of 500 calls and one of 2,000: nothing
    in the dispatcher walks the batch, the queue or the results once per call (a list scanned or popped
    from the front, positions recomputed, every pending call looked at when one ends).

    Counted, not timed, on the virtual clock (whose time does not move while calls compute, so the
    batch is submitted and run the same way at both sizes): a mix of reads, some that wait a turn,
    writes (each one a barrier), unknown tools and bad arguments.
    """

    async def peek(key: int, wait: bool) -> int:
        if wait:
            await anyio.lowlevel.checkpoint()
        return key

    async def bump(key: int) -> int:
        return key

    def batch(size: int) -> list[ToolCall]:
        return mixed_batch(size, writes=(2, 27), waits=True)

    per_call = {}
    async with Dispatcher(max_concurrency=limit) as dispatcher:
        dispatcher.add_function(peek, annotations=READ_ONLY)
        dispatcher.add_function(bump)
        await dispatcher.dispatch(batch(50))  # anything done once (first calls of a tool) is done before
        for size in (500, 2_000):
            calls = batch(size)
            lines = [0]
            previous = sys.gettrace()  # a coverage tool's, say: put back afterwards
            sys.settrace(_line_counter(lines))
            try:
                results = await dispatcher.dispatch(calls)
            finally:
                sys.settrace(previous)
            assert [result.call for result in results] == calls
            assert sum(result.ok for result in results) == size - 2 * size // 50
            per_call[size] = lines[0] / size
    assert per_call[500] > 50, per_call  # the trace saw the calls run
    assert per_call[2_000] <= 1.02 * per_call[500], per_call


@pytest.mark.backends("trio-mockclock")
@pytest.mark.parametrize("limit", [1, 4, 16, 64])
@pytest.mark.parametrize("wait", [False, True])
async def test_calls_that_compute_hold_the_loop_for_at_most_two_turns_of_the_limit(
    anyio_backend: Any, limit: int, wait: bool
) -> None:
    """On a virtual clock where a call's computing is a jump of the clock (0.3 ms, no checkpoint), a task
    in the same loop is late by at most two turns of the loop, each running at most `limit` calls: a
    call that ends brings the next one in a new task, which runs in the next turn, after the loop has
    looked at its timers. The tasks running calls never outnumber the limit.

    (Without a limit every admitted call runs in the same turn, as one task per call does: a
    `max_concurrency` is what bounds how long calls that compute hold the loop.)
    """
    import trio

    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    work = 0.0003
    peak = {"running": 0, "tasks": 0}

    async with Dispatcher(max_concurrency=limit) as dispatcher:

        async def compute(n: int) -> int:
            if wait or n == 0:
                await anyio.lowlevel.checkpoint()
            clock.jump(work)  # computing: time passes and nothing else runs
            peak["running"] = max(peak["running"], dispatcher.running)
            peak["tasks"] = max(peak["tasks"], _call_tasks())
            return n

        late: list[float] = []

        async def ticker(done: anyio.Event) -> None:
            while not done.is_set():
                due = anyio.current_time() + 0.0002
                await anyio.sleep(0.0002)
                late.append(anyio.current_time() - due)

        dispatcher.add_function(compute, annotations=READ_ONLY)
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker, done)
            results = await dispatcher.dispatch([ToolCall(str(n), "compute", {"n": n}) for n in range(2000)])
            done.set()
    assert all(result.ok for result in results)
    assert peak["running"] <= limit and peak["tasks"] <= limit, peak
    # The calls compute for 0.6 s in all: the ticker ran between turns all along.
    assert len(late) >= 0.6 / (2 * limit * work) / 2, len(late)
    assert max(late) <= 2 * limit * work + 1e-9, max(late)


@pytest.mark.backends("trio-mockclock")
async def test_reads_released_by_a_write_ending_at_its_deadline_all_start_together(anyio_backend: Any) -> None:
    """A write ends just before its deadline and releases 100 reads that compute past that deadline and can
    only end once all of them have started: every read gets its task and its own deadline (twelve rounds),
    none is stranded by the write's deadline passing while they run."""
    import trio

    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    timeout, meets = 1.0, 100

    async def one_round() -> list[ToolResult]:
        arrived = 0
        everyone = anyio.Event()

        async def write() -> str:  # no annotations: may mutate, runs alone
            await anyio.sleep(timeout - 0.001)
            return "w"

        async def meet(k: int) -> int:
            nonlocal arrived
            clock.jump(0.004)  # computing: takes the clock past the write's deadline
            arrived += 1
            if arrived == meets:
                everyone.set()
            await everyone.wait()
            return k

        async with Dispatcher(max_concurrency=None, call_timeout=timeout) as dispatcher:
            dispatcher.add_function(write)
            dispatcher.add_function(meet, annotations=READ_ONLY)
            calls = [ToolCall("w", "write")] + [ToolCall(f"m{k}", "meet", {"k": k}) for k in range(meets)]
            return await dispatcher.dispatch(calls)

    for _ in range(12):
        results = await one_round()
        assert [(result.call_id, result.status) for result in results if not result.ok] == []


async def test_batch_after_batch_every_call_gets_its_task_and_none_is_left(anyio_backend: Any) -> None:
    """Fifty batches of 1 to 6 calls in a row: each call runs and settles, and no call's task is left between
    batches."""
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
            await anyio.wait_all_tasks_blocked()
            assert _call_tasks() == 0


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


@pytest.mark.backends("asyncio", "trio")
async def test_a_local_function_call_runs_with_no_clock_nor_that_of_the_call_before_it() -> None:
    """No person is asked about a local function: its call has no clock, even in a task whose last call left one."""

    async def leaver(key: str) -> str:
        start_clock(None)  # what a server's call leaves in its task
        return key

    async def reader(key: str) -> str:
        if current_clock() is not None:
            raise RuntimeError("a clock in a local function's call")
        return key

    async with Dispatcher(max_concurrency=1) as dispatcher:
        dispatcher.add_function(leaver, annotations=READ_ONLY)
        dispatcher.add_function(reader, annotations=READ_ONLY)
        calls = [ToolCall(f"c{i}", "leaver" if i % 2 == 0 else "reader", {"key": str(i)}) for i in range(20)]
        results = await dispatcher.dispatch(calls)
    assert [(result.status, result.error) for result in results] == [(CallStatus.OK, None)] * 20
