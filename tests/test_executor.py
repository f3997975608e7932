"""How the executor brings runners and reuses their cancel scope, seen from the calls' results."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp.types import ToolAnnotations
from trio.testing import MockClock

from dispatcher import CallStatus, Dispatcher, PendingCall, ToolCall, ToolResult

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)


def all_clocks() -> pytest.MarkDecorator:
    """asyncio, trio, and trio under a virtual clock that jumps whenever every task waits."""
    clock = MockClock(autojump_threshold=0)
    return pytest.mark.parametrize(
        "anyio_backend", ["asyncio", "trio", pytest.param(("trio", {"clock": clock}), id="trio-mock")]
    )


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


@all_clocks()
@pytest.mark.parametrize("limit", [None, 100])
async def test_calls_that_wait_all_run_together_beyond_the_runners_brought_at_once(limit: int | None) -> None:
    """200 waiting reads with no limit (or 100 with a limit of 100) all overlap: runners keep coming."""
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


@all_clocks()
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
        for _ in range(2):  # with new runners, then with the parked ones
            events.clear()
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "step", {"key": str(i)}) for i in range(8)])
            assert all(result.ok for result in results)
            assert [what for what, _ in events[:8]] == ["entered"] * 8, events


@all_clocks()
async def test_a_call_cancelled_as_it_ends_leaves_the_next_call_on_its_runner_alone() -> None:
    """A call that is cancelled while it returns does not carry the cancellation into the next call."""
    handles: dict[str, PendingCall] = {}

    async def first() -> str:
        handles["first"].cancel()  # lands on the runner's scope, but the call returns before a checkpoint
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


@all_clocks()
async def test_a_timed_out_call_leaves_the_next_calls_on_its_runner_their_whole_timeout(virtual_clock: bool) -> None:
    """After a call times out on a runner, the next calls run under a fresh deadline of their own."""

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


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))])
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
        # Quick calls first: the runner's deadline was set for them, before the hanging call started.
        calls = [ToolCall(f"q{i}", "quick") for i in range(50)] + [ToolCall("h", "hang")]
        results = await dispatcher.dispatch(calls)
    hung = results[-1]
    assert hung.status is CallStatus.TIMEOUT
    assert hung.started_at is not None
    assert 5.0 <= hung.finished_at - hung.started_at <= 5.01


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))])
@pytest.mark.parametrize("call_timeout", [0.5, 600.0])
async def test_a_call_is_cut_off_within_a_thousandth_of_its_timeout(anyio_backend: Any, call_timeout: float) -> None:
    """A call that never answers ends no sooner than call_timeout and no later than 0.1% (at least 2 ms)
    after it, after naps that kept the runner's deadline where the first call set it."""

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
    assert call_timeout <= hung.finished_at - hung.started_at <= call_timeout + max(0.002, call_timeout / 1000) + 1e-9


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_calls_that_never_wait_take_few_runners_without_a_limit(anyio_backend: Any) -> None:
    """With max_concurrency=None, a long batch of calls that never wait is carried out by a few runners.

    Runners let the loop run at the end of each time slice; a runner doing so comes back for the next
    calls, so a batch spanning many slices does not start a new runner at each one.
    """
    counts: list[int] = []

    async def count(n: int) -> int:
        if n % 250 == 0:
            counts.append(sum("_runner" in (task.name or "") for task in anyio.get_running_tasks()))
        return n

    dispatcher = Dispatcher(max_concurrency=None)
    dispatcher.add_function(count, annotations=READ_ONLY)
    calls = [ToolCall(id=str(n), name="count", arguments={"n": n}) for n in range(5000)]
    async with dispatcher:
        start = anyio.current_time()
        results = await dispatcher.dispatch(calls)
        elapsed = anyio.current_time() - start
    assert all(result.ok for result in results)
    assert elapsed > 0.01, "the batch should span several time slices of 2 ms"
    assert max(counts) <= 4, counts


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))])
@pytest.mark.parametrize("limit", [1, 4, 16, None])
async def test_calls_that_compute_hold_the_loop_for_a_slice_once_the_runners_have_started(
    anyio_backend: Any, limit: int | None
) -> None:
    """On a virtual clock where a call's computing is a jump of the clock (0.3 ms, no checkpoint), a task
    in the same loop waits at most about two time slices (2 ms each) and a call, once the runners
    brought by a call that waits have started theirs.

    The first call waits, so more runners come, each with a call: together they hold one turn of the
    loop, as one task per call would. After that, one of them goes on computing calls in each slice
    and the others park until a call waits again: they do not each run a call in every turn.
    """
    import trio

    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    work = 0.0003

    async def compute(n: int) -> int:
        if n == 0:
            await anyio.sleep(0.0001)
        clock.jump(work)  # computing: time passes and nothing else runs
        return n

    late: list[tuple[float, float]] = []

    async def ticker(done: anyio.Event) -> None:
        while not done.is_set():
            due = anyio.current_time() + 0.0002
            await anyio.sleep(0.0002)
            late.append((due, anyio.current_time() - due))

    async with Dispatcher(max_concurrency=limit) as dispatcher:
        dispatcher.add_function(compute, annotations=READ_ONLY)
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker, done)
            start = anyio.current_time()
            results = await dispatcher.dispatch([ToolCall(str(n), "compute", {"n": n}) for n in range(2000)])
            done.set()
    assert all(result.ok for result in results)
    brought = 64 if limit is None else limit  # runners brought at once for calls admitted together
    assert max(lateness for _, lateness in late) <= 2 * 0.002 + brought * work + 1e-9
    # The calls compute for 0.6 s in all: the ticker ran between slices all along.
    assert len(late) > 100, len(late)
    steady = [lateness for due, lateness in late if due >= start + 0.1]
    assert max(steady) <= 2 * 0.002 + 2 * work + 1e-9, max(steady)


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))])
@pytest.mark.parametrize("limit", [16, 64, None])
async def test_runners_letting_the_loop_run_count_as_on_their_way(anyio_backend: Any, limit: int | None) -> None:
    """Calls that wait a turn and then compute: runners letting the loop run between slices hold no call,
    and count as on their way, so runners and calls in flight stay within the limit.

    (Not counting them brought up to 64 more runners at every slice: 290 runner tasks without a limit,
    and a 91 ms stall.)
    """
    import trio

    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    work = 0.0003
    peak = {"running": 0, "runners": 0}

    async with Dispatcher(max_concurrency=limit) as dispatcher:

        async def compute(n: int) -> int:
            await anyio.lowlevel.checkpoint()
            clock.jump(work)  # computing: time passes and nothing else runs
            runners = sum("_runner" in (task.name or "") for task in anyio.get_running_tasks())
            peak["running"] = max(peak["running"], dispatcher.running)
            peak["runners"] = max(peak["runners"], runners)
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
            results = await dispatcher.dispatch([ToolCall(str(n), "compute", {"n": n}) for n in range(3000)])
            done.set()
    assert all(result.ok for result in results)
    if limit is not None:
        assert peak["running"] <= limit, peak
        assert peak["runners"] <= limit + 2, peak
        assert max(late) <= 2 * 0.002 + limit * work + 1e-9, max(late)
    else:
        # Calls that wait keep bringing runners, one at a time past the 64 brought at once.
        assert peak["runners"] <= 2 * 64, peak
        assert max(late) <= 2 * 0.002 + 2 * 64 * work + 1e-9, max(late)


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))])
async def test_reads_released_by_a_write_ending_at_its_deadline_all_start_together(anyio_backend: Any) -> None:
    """A write ends just before its deadline, long past the time slice, and releases 100 reads that can only
    end once all of them have started: however the runners' turns fall (twelve rounds), the runner whose
    scope's deadline passed while it let the loop run brings runners for the reads it leaves."""
    import trio

    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    timeout, meets = 1.0, 100  # more reads than are brought at once: one runner comes when the write ends

    async def one_round() -> list[ToolResult]:
        arrived = 0
        everyone = anyio.Event()

        async def write() -> str:  # no annotations: may mutate, runs alone
            await anyio.sleep(timeout - 0.001)
            return "w"

        async def meet(k: int) -> int:
            nonlocal arrived
            clock.jump(0.004)  # computing: takes the clock past the write's runner's deadline
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
