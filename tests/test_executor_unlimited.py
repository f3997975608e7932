"""With `max_concurrency=None` every call that waits runs at once, and calls that never wait share a few tasks.

The gate admits every call at once when there is no limit; the executor starts a bounded number of tasks
per loop turn (`_unlimited.SPAWN`), the calls' tasks carry on with the calls still queued, and every
loop turn starts a task for each call whose task is in a wait (`_unlimited.UnlimitedStarts`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher import ApprovalPolicy, ApprovalRequest, CallStatus, Dispatcher, Effect, ToolCall, ToolResult
from dispatcher._driver._unlimited import SPAWN as _SPAWN

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False)


class Barrier:
    """Each waiter waits until `n` have started waiting: all of them end only if all `n` run at once."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.started = 0
        self.met = anyio.Event()

    async def wait(self) -> None:
        self.started += 1
        if self.started == self.n:
            self.met.set()
        await self.met.wait()


def add_meet_and_quick(dispatcher: Dispatcher, barrier: Barrier) -> None:
    """Two read-only tools: `meet` waits at `barrier`, `quick` returns at once; both return their `i`."""

    async def meet(i: int) -> int:
        await barrier.wait()
        return i

    async def quick(i: int) -> int:
        return i

    dispatcher.add_function(meet, annotations=READ_ONLY)
    dispatcher.add_function(quick, annotations=READ_ONLY)


def values(results: list[ToolResult]) -> list[object]:
    """What each call's function returned (its structured result)."""
    return [
        r.result.structured_content["result"] if r.result and r.result.structured_content else None for r in results
    ]


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
@pytest.mark.parametrize("n", [20 * _SPAWN, 5000])
async def test_every_waiting_call_runs_at_once_with_no_limit(n: int) -> None:
    """Each call waits until all of them have started: this ends only if every call runs at the same time."""
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


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_calls_that_only_checkpoint_until_all_have_started_all_run_at_once_with_no_limit() -> None:
    """Calls that never block, only let the loop run until every one has started, still all get a task."""
    n = 400
    started = 0
    async with Dispatcher(max_concurrency=None) as dispatcher:

        async def spin(i: int) -> int:
            nonlocal started
            started += 1
            while started < n:
                await anyio.lowlevel.checkpoint()
            return i

        dispatcher.add_function(spin, annotations=READ_ONLY)
        with anyio.fail_after(30):
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "spin", {"i": i}) for i in range(n)])
    assert values(results) == list(range(n))


@pytest.mark.backends("trio-mockclock")
async def test_thousands_of_calls_that_sleep_and_time_out_all_start_at_the_same_instant_with_no_limit() -> None:
    """On a virtual clock 5,000 calls sleeping 1 s end at 1 s, and half of them, sleeping past a 1 s call
    timeout, all time out at 1 s: none started a loop turn late enough for the clock to move."""
    n = 5000
    async with Dispatcher(max_concurrency=None, call_timeout=1) as dispatcher:

        async def nap(i: int) -> int:
            await anyio.sleep(0.5 if i % 2 else 10)
            return i

        dispatcher.add_function(nap, annotations=READ_ONLY)
        start = anyio.current_time()
        results = await dispatcher.dispatch([ToolCall(f"c{i}", "nap", {"i": i}) for i in range(n)])
        elapsed = anyio.current_time() - start
    assert [r.status for r in results] == [CallStatus.OK if i % 2 else CallStatus.TIMEOUT for i in range(n)]
    assert elapsed == 1.0, elapsed


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_waiting_calls_of_batches_submitted_from_many_tasks_all_run_at_once_with_no_limit() -> None:
    """Twenty tasks each dispatch a batch, a loop turn apart, whose every third call waits for all the waiting
    calls of all twenty batches: every batch ends, each with its own results in its own order."""
    tasks, per = 20, 100
    barrier = Barrier(tasks * per)
    out: dict[int, list[ToolResult]] = {}
    async with Dispatcher(max_concurrency=None) as dispatcher:
        add_meet_and_quick(dispatcher, barrier)

        async def one(k: int) -> None:
            for _ in range(k):
                await anyio.lowlevel.checkpoint()
            calls = [ToolCall(f"c{k}-{i}", "quick" if i % 3 else "meet", {"i": i}) for i in range(3 * per)]
            out[k] = await dispatcher.dispatch(calls)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for k in range(tasks):
                    tg.start_soon(one, k)
    for k in range(tasks):
        assert [r.call_id for r in out[k]] == [f"c{k}-{i}" for i in range(3 * per)]
        assert values(out[k]) == list(range(3 * per))


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_a_caller_submitting_calls_every_loop_turn_holds_back_no_waiting_call_with_no_limit() -> None:
    """While a caller keeps submitting 40 calls a loop turn, the 64 waiting calls queued before them all start
    within a few turns: submitting calls is no sign that the tasks running calls are not waiting."""
    n = 64
    barrier = Barrier(n)
    turns = 0
    async with Dispatcher(max_concurrency=None) as dispatcher:
        add_meet_and_quick(dispatcher, barrier)
        with anyio.fail_after(30):
            async with dispatcher.batch() as batch:
                batch.submit_all([ToolCall(f"m{i}", "meet", {"i": i}) for i in range(n)])
                while not barrier.met.is_set() and turns < 300:
                    for j in range(40):
                        batch.submit(ToolCall(f"q{turns}-{j}", "quick", {"i": j}))
                    await anyio.lowlevel.checkpoint()
                    turns += 1
            results = batch.results()
    assert values(results[:n]) == list(range(n))
    assert all(r.status is CallStatus.OK for r in results)
    # Doubling the tasks each turn from 16 takes 2 turns to reach 64; counting the submissions as calls
    # that ended started none, for as long as the caller went on (300 turns).
    assert turns <= 20, turns


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_waiting_calls_approved_one_by_one_all_run_at_once_with_no_limit() -> None:
    """Reads that each need approval, approved one at a time, all run at once once approved."""
    n = 300
    barrier = Barrier(n)

    async def approver(request: ApprovalRequest) -> bool:
        await anyio.lowlevel.checkpoint()
        return True

    policy = ApprovalPolicy(always={"meet"})
    async with Dispatcher(max_concurrency=None, approve=approver, approval=policy) as dispatcher:

        async def meet(i: int) -> int:
            await barrier.wait()
            return i

        dispatcher.add_function(meet, annotations=READ_ONLY)
        with anyio.fail_after(30):
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "meet", {"i": i}) for i in range(n)])
    assert values(results) == list(range(n))


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_writes_between_groups_of_waiting_reads_run_alone_and_in_order_with_no_limit() -> None:
    """Five groups of 300 reads that wait for their whole group, each group followed by a write: each group
    runs at once, each write alone after it, in request order."""
    groups, per = 5, 300
    barriers = [Barrier(per) for _ in range(groups)]
    running = 0
    log: list[int] = []
    async with Dispatcher(max_concurrency=None) as dispatcher:

        async def meet(g: int, i: int) -> int:
            nonlocal running
            running += 1
            try:
                await barriers[g].wait()
            finally:
                running -= 1
            return i

        async def write(g: int) -> int:
            nonlocal running
            assert running == 0, "a write overlapped another call"
            running += 1
            await anyio.sleep(0.001)
            log.append(g)
            running -= 1
            return g

        dispatcher.add_function(meet, annotations=READ_ONLY)
        dispatcher.add_function(write, annotations=WRITE)
        calls = []
        for g in range(groups):
            calls += [ToolCall(f"m{g}-{i}", "meet", {"g": g, "i": i}) for i in range(per)]
            calls.append(ToolCall(f"w{g}", "write", {"g": g}))
        with anyio.fail_after(30):
            results = await dispatcher.dispatch(calls)
    assert [r.call_id for r in results] == [call.id for call in calls]
    assert all(r.status is CallStatus.OK for r in results)
    assert log == list(range(groups))


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_reads_of_other_keys_all_run_at_once_beside_writes_of_one_key_with_no_limit() -> None:
    """900 reads of keys k1-k9, which wait for one another, and writes of key k0 between them: the reads never
    wait for those writes, which run one at a time, in order."""
    n = 900
    barrier = Barrier(n)
    writes: list[int] = []
    async with Dispatcher(max_concurrency=None) as dispatcher:

        async def meet(key: str, i: int) -> int:
            await barrier.wait()
            return i

        async def write(key: str, i: int) -> int:
            writes.append(i)
            await anyio.sleep(0.01)
            writes.append(i)
            return i

        dispatcher.add_function(meet, annotations=READ_ONLY, domain="d", keys=lambda args: args["key"])
        dispatcher.add_function(write, annotations=WRITE, domain="d", keys=lambda args: args["key"])
        calls = []
        for i in range(n):
            calls.append(ToolCall(f"m{i}", "meet", {"key": f"k{1 + i % 9}", "i": i}))
            if i % 100 == 0:
                calls.append(ToolCall(f"w{i}", "write", {"key": "k0", "i": i}))
        with anyio.fail_after(30):
            results = await dispatcher.dispatch(calls)
    assert [r.call_id for r in results] == [call.id for call in calls]
    assert all(r.status is CallStatus.OK for r in results)
    assert writes == [i for i in range(0, n, 100) for _ in (0, 1)]


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
@pytest.mark.parametrize("how", ["cancel", "close"])
async def test_cancelling_or_closing_while_tasks_are_still_being_started_gives_every_call_one_result(
    how: str,
) -> None:
    """5,000 calls that never end, cancelled (the batch) or closed (the dispatcher's block) once 100 have
    started: every call ends CANCELLED, in request order, and no task of the dispatcher outlives it."""
    n = 5000
    never = anyio.Event()
    started = 0
    with anyio.fail_after(30):
        async with Dispatcher(max_concurrency=None) as dispatcher:

            async def stuck(i: int) -> int:
                nonlocal started
                started += 1
                await never.wait()
                return i

            dispatcher.add_function(stuck, annotations=READ_ONLY)
            batch = dispatcher.batch()
            batch.submit_all([ToolCall(f"c{i}", "stuck", {"i": i}) for i in range(n)])
            while started < 100:
                await anyio.lowlevel.checkpoint()
            assert started < n  # the feeder is still starting tasks
            if how == "cancel":
                batch.cancel()
                results = await batch.wait()
                never.set()
                again = await dispatcher.dispatch([ToolCall(f"a{i}", "stuck", {"i": i}) for i in range(50)])
                assert values(again) == list(range(50))
        if how == "close":
            results = await batch.wait()
    assert [r.call_id for r in results] == [f"c{i}" for i in range(n)]
    assert {r.status for r in results} == {CallStatus.CANCELLED}
    assert not any("Executor" in (task.name or "") for task in anyio.get_running_tasks())


@pytest.mark.backends("asyncio")
async def test_tools_that_raise_or_cancel_their_own_task_among_waiting_calls_leave_every_write_whole() -> None:
    """Four groups of 250 reads, each followed by a write: a fifth of the reads wait for one another, a fifth
    raise, a fifth cancel their own task, a fifth schedule its cancellation for later (`call_later`). The
    waiting reads all meet, every write runs to its answer, and a read a late cancellation lands on ends
    CANCELLED of unknown effect, naming the cause."""
    groups, per = 4, 250
    barriers = [Barrier(per // 5) for _ in range(groups)]
    async with Dispatcher(max_concurrency=None) as dispatcher:

        async def hostile(g: int, i: int) -> int:
            task = asyncio.current_task()
            assert task is not None
            if i % 5 == 0:
                await barriers[g].wait()
            elif i % 5 == 1:
                raise ValueError("boom")
            elif i % 5 == 2:
                task.cancel()
            elif i % 5 == 3:
                asyncio.get_running_loop().call_later(0.005, task.cancel)
            else:
                await anyio.sleep(0.01)
            return i

        async def write(g: int) -> int:
            await anyio.sleep(0.02)  # the late cancellations fire meanwhile
            return g

        dispatcher.add_function(hostile, annotations=READ_ONLY)
        dispatcher.add_function(write, annotations=WRITE)
        calls = []
        for g in range(groups):
            calls += [ToolCall(f"h{g}-{i}", "hostile", {"g": g, "i": i}) for i in range(per)]
            calls.append(ToolCall(f"w{g}", "write", {"g": g}))
        with anyio.fail_after(30):
            results = await dispatcher.dispatch(calls)
            again = await dispatcher.dispatch([ToolCall(f"a{i}", "hostile", {"g": 0, "i": 4}) for i in range(50)])
    assert [r.call_id for r in results] == [call.id for call in calls]
    assert all(barrier.met.is_set() for barrier in barriers)
    for call, result in zip(calls, results, strict=True):
        assert call.arguments is not None
        i = call.arguments.get("i", 0)
        if call.name == "write":
            assert (result.status, result.effect) == (CallStatus.OK, Effect.RAN), result
        elif i % 5 == 1:
            assert result.status is CallStatus.TOOL_ERROR, result
        elif result.status is not CallStatus.OK:
            assert (result.status, result.effect) == (CallStatus.CANCELLED, Effect.UNKNOWN), result
            assert result.error is not None and "cancelled its own task" in result.error, result.error
    assert all(r.ok for r in again)


def _meeting_server(n: int) -> MCPServer[Any]:
    server = MCPServer("meeting")
    barrier = Barrier(n)

    @server.tool(annotations=READ_ONLY)
    async def meet(i: int) -> int:
        await barrier.wait()
        return i

    return server


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_mcp_calls_that_wait_for_one_another_all_run_at_once_with_no_limit() -> None:
    """300 calls to an in-process MCP server (the real SDK), whose tool waits until all 300 have reached it."""
    n = 300
    async with Client(_meeting_server(n)) as client, Dispatcher(max_concurrency=None) as dispatcher:
        await dispatcher.add_mcp_server("meeting", client, trusted=True)
        with anyio.fail_after(30):
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "meet", {"i": i}) for i in range(n)])
    assert [r.status for r in results] == [CallStatus.OK] * n, {r.error for r in results}
    assert [r.call_id for r in results] == [f"c{i}" for i in range(n)]
