"""Attacks on the task's shared cancel scope (`Executor._run`): hostile tools and odd callers, one task carrying
many calls (``max_concurrency`` 1 to 3), under asyncio and trio.

What every test checks: each call gets exactly one result, in request order; a call's cancellation or
timeout ends that call alone; a tool's own cancellation tricks end its call at most; the dispatcher stays
usable for the next batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher import ApprovalPolicy, CallStatus, Dispatcher, PendingCall, RetryPolicy, ToolCall

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)
OK = CallStatus.OK


def calls(*keys: str) -> list[ToolCall]:
    return [ToolCall(f"c{i}", "tool", {"key": key}) for i, key in enumerate(keys)]


async def usable(dispatcher: Dispatcher) -> None:
    """The dispatcher runs a next batch as usual."""
    again = await dispatcher.dispatch([ToolCall(f"n{i}", "tool", {"key": "n"}) for i in range(4)])
    assert [r.status for r in again] == [OK] * 4, again


def statuses(results: list[Any]) -> list[CallStatus]:
    assert [r.call_id for r in results] == [f"c{i}" for i in range(len(results))]
    return [r.status for r in results]


# Caller cancellations --------------------------------------------------------------------------


@pytest.mark.backends("asyncio", "trio")
@pytest.mark.parametrize("limit", [1, 2])
async def test_a_tool_cancelling_its_own_call_then_returning_ends_ok_and_leaves_the_next_alone(limit: int) -> None:
    """A tool that cancels its own call (`PendingCall.cancel`) and returns without waiting keeps its answer;
    the calls its task runs after it are not cancelled."""
    pending: list[PendingCall] = []

    async def tool(key: str) -> str:
        if key == "self":
            pending[1].cancel()
            pending[1].cancel()  # twice: the same
            return key
        await anyio.lowlevel.checkpoint()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=limit) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                pending.extend(batch.submit_all(calls("a", "self", "b", "c", "d")))
            assert statuses(batch.results()) == [OK] * 5
            await usable(dispatcher)


@pytest.mark.backends("asyncio", "trio")
@pytest.mark.parametrize("limit", [1, 3])
async def test_a_tool_cancelling_its_own_call_then_waiting_ends_cancelled_alone(limit: int) -> None:
    """A tool that cancels its own call and then waits ends CANCELLED; no other call does."""
    pending: list[PendingCall] = []

    async def tool(key: str) -> str:
        if key == "self":
            pending[2].cancel()
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=limit) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                pending.extend(batch.submit_all(calls("a", "b", "self", "c", "d", "e")))
            assert statuses(batch.results()) == [OK, OK, CallStatus.CANCELLED, OK, OK, OK]
            await usable(dispatcher)


@pytest.mark.backends("asyncio", "trio")
@pytest.mark.parametrize("where", ["first", "middle", "last"])
async def test_a_tool_cancelling_its_batch_ends_the_calls_not_done(where: str) -> None:
    """`Batch.cancel` from inside a tool: the calls that ended before keep their results, the tool's own call
    keeps the answer it returns without waiting, the rest end CANCELLED, and the next batch runs."""
    keys = ["a", "b", "c", "d"]
    at = {"first": 0, "middle": 2, "last": 3}[where]
    keys[at] = "cancel"
    holder: list[Any] = []

    async def tool(key: str) -> str:
        if key == "cancel":
            holder[0].cancel()
            return key
        await anyio.lowlevel.checkpoint()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                holder.append(batch)
                batch.submit_all(calls(*keys))
            got = statuses(batch.results())
            assert got[: at + 1] == [OK] * (at + 1)
            assert got[at + 1 :] == [CallStatus.CANCELLED] * (len(keys) - at - 1)
            await usable(dispatcher)


@pytest.mark.backends("asyncio", "trio")
async def test_cancelling_a_call_just_as_the_one_before_it_settles_cancels_that_call_alone() -> None:
    """The caller cancels call N+1 (admitted to the same task, not started) in the instant call N answers;
    N ends OK, N+1 CANCELLED, N+2 OK; and cancelling N once it ended changes nothing."""
    wake = anyio.Event()
    ran: list[str] = []

    async def tool(key: str) -> str:
        ran.append(key)
        if key == "wait":
            await wake.wait()
            return key
        await anyio.lowlevel.checkpoint()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                works = batch.submit_all(calls("wait", "victim", "after"))
                await anyio.wait_all_tasks_blocked()
                wake.set()
                works[1].cancel()
                works[1].cancel()
                await works[0].wait()
                works[0].cancel()  # already over: changes nothing, and reaches no other call
            assert statuses(batch.results()) == [OK, CallStatus.CANCELLED, OK]
            assert ran == ["wait", "after"]
            await usable(dispatcher)


# Tools that cancel their own task (asyncio) ---------------------------------------------------


def self_cancel() -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()


@pytest.mark.backends("asyncio")
@pytest.mark.parametrize("how", ["returns", "raises", "awaits", "twice", "absorbs-then-awaits", "soon"])
@pytest.mark.parametrize("limit", [1, 2])
async def test_a_tool_cancelling_its_own_task_ends_its_call_at_most(how: str, limit: int) -> None:
    """A tool cancels its own task (`Task.cancel`) and returns, raises, waits again, does it twice, absorbs
    it and waits again, or has it cancelled at the loop's next turn; a later call of the same task is cancelled
    by its caller and another times out: those end CANCELLED and TIMEOUT, the hostile call at most CANCELLED,
    every other call OK."""
    started = anyio.Event()

    async def tool(key: str) -> str:
        if key == "self":
            if how == "soon":  # at the loop's next turn, after the call ended
                task = asyncio.current_task()
                assert task is not None
                asyncio.get_running_loop().call_soon(task.cancel)
                return key
            self_cancel()
            if how == "raises":
                raise ValueError("after cancelling itself")
            if how == "awaits":
                await asyncio.sleep(0)
            if how == "twice":
                self_cancel()
            if how == "absorbs-then-awaits":
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    pass
                await asyncio.sleep(0)
        elif key == "wait":
            started.set()
            await anyio.sleep_forever()
        elif key == "long":
            await anyio.sleep(60)
        await anyio.lowlevel.checkpoint()
        return key

    keys = ["a", "self", "b", "wait", "c", "self", "long", "d", "self"]
    with anyio.fail_after(20):
        async with Dispatcher(max_concurrency=limit, call_timeout=0.5) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                works = batch.submit_all(calls(*keys))
                await started.wait()
                works[3].cancel()
            got = statuses(batch.results())
            await usable(dispatcher)
    for key, status in zip(keys, got, strict=True):
        if key == "self":
            expected = (CallStatus.TOOL_ERROR,) if how == "raises" else (OK, CallStatus.CANCELLED)
            assert status in expected, (key, status)
        elif key == "wait":
            assert status is CallStatus.CANCELLED
        elif key == "long":
            assert status is CallStatus.TIMEOUT
        else:
            assert status is OK, (key, got)


@pytest.mark.backends("asyncio", "trio")
async def test_a_tool_raising_the_cancellation_exception_by_hand_ends_its_call_alone() -> None:
    """A tool raises the backend's cancellation exception with nothing cancelled (trio's has no public
    constructor: the attempt fails); the next call of the task, cancelled by its caller, ends CANCELLED alone."""
    started = anyio.Event()

    async def tool(key: str) -> str:
        if key == "raise":
            raise anyio.get_cancelled_exc_class()()
        if key == "wait":
            started.set()
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                works = batch.submit_all(calls("a", "raise", "b", "wait", "c"))
                await started.wait()
                works[3].cancel()
            got = statuses(batch.results())
            # asyncio's CancelledError raised by hand: CANCELLED; trio's Cancelled() raises TypeError: TOOL_ERROR.
            assert got[1] in (CallStatus.CANCELLED, CallStatus.TOOL_ERROR)
            assert [got[i] for i in (0, 2, 3, 4)] == [OK, OK, CallStatus.CANCELLED, OK]
            await usable(dispatcher)


@pytest.mark.backends("asyncio", "trio")
@pytest.mark.parametrize("how", ["own-scope", "shield", "swallow"])
async def test_a_tool_playing_with_cancel_scopes_ends_its_call_alone(how: str) -> None:
    """A tool cancels a scope of its own, shields itself from its call's cancellation, or swallows that
    cancellation and returns: its call ends OK (the answer came back) and the next calls run untouched."""
    started = anyio.Event()

    async def tool(key: str) -> str:
        if key == "scopes":
            if how == "own-scope":
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await anyio.sleep_forever()
                return key
            started.set()
            if how == "shield":
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.05)
                return key
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                return key  # hostile: swallows its call's cancellation
        await anyio.lowlevel.checkpoint()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                works = batch.submit_all(calls("a", "scopes", "b", "c"))
                if how != "own-scope":
                    await started.wait()
                    works[1].cancel()
            assert statuses(batch.results()) == [OK, OK, OK, OK]
            await usable(dispatcher)


async def cancelled_with_a_failing_child(started: anyio.Event) -> None:
    """A tool's task group whose child raises as it is cancelled: trio's nursery raises the cancellation and
    the child's error together, in one group."""

    async def child() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            raise ValueError("the child fails as it is cancelled")  # the hostile part

    async with anyio.create_task_group() as tg:
        tg.start_soon(child)
        started.set()
        await anyio.sleep_forever()


@pytest.mark.backends("asyncio", "trio")
@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize("retried", [False, True])
async def test_a_tool_whose_task_group_fails_as_it_is_cancelled_ends_its_call_alone(limit: int, retried: bool) -> None:
    """A call cancelled while its tool's task group runs a child that raises as it is cancelled ends CANCELLED
    (under asyncio, whose task group keeps only the child's error, TOOL_ERROR): the group does not leave the
    call's task and end the dispatcher; the other calls run, and so does the next batch."""
    started = anyio.Event()

    async def tool(key: str) -> str:
        if key == "group":
            await cancelled_with_a_failing_child(started)
        await anyio.lowlevel.checkpoint()
        return key

    annotations = ToolAnnotations(read_only_hint=True, idempotent_hint=True)
    retry = RetryPolicy(attempts=3, wait_initial=0.0, wait_max=0.0) if retried else None
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=limit, call_timeout=None, retry=retry) as dispatcher:
            dispatcher.add_function(tool, annotations=annotations)
            async with dispatcher.batch() as batch:
                works = batch.submit_all(calls("a", "group", "b", "c"))
                await started.wait()
                works[1].cancel()
            got = statuses(batch.results())
            assert got[1] in (CallStatus.CANCELLED, CallStatus.TOOL_ERROR)
            if anyio.get_cancelled_exc_class() is not asyncio.CancelledError:
                assert got[1] is CallStatus.CANCELLED
            assert [got[i] for i in (0, 2, 3)] == [OK, OK, OK]
            await usable(dispatcher)


@pytest.mark.backends("trio-mockclock", "asyncio")
@pytest.mark.parametrize("retried", [False, True])
async def test_a_tool_whose_task_group_fails_at_its_timeout_ends_its_call_alone(retried: bool) -> None:
    """The same tool cut by the call timeout ends TIMEOUT (asyncio: TOOL_ERROR); the next calls run."""

    async def tool(key: str) -> str:
        if key == "group":
            await cancelled_with_a_failing_child(anyio.Event())
        await anyio.sleep(0.1)
        return key

    annotations = ToolAnnotations(read_only_hint=True, idempotent_hint=True)
    retry = RetryPolicy(attempts=2, wait_initial=0.0, wait_max=0.0) if retried else None
    with anyio.fail_after(20):
        async with Dispatcher(max_concurrency=1, call_timeout=0.5, retry=retry) as dispatcher:
            dispatcher.add_function(tool, annotations=annotations)
            got = statuses(await dispatcher.dispatch(calls("a", "group", "b", "group", "c")))
            await usable(dispatcher)
    assert [got[i] for i in (0, 2, 4)] == [OK, OK, OK]
    assert {got[1], got[3]} <= {CallStatus.TIMEOUT, CallStatus.TOOL_ERROR}
    if anyio.get_cancelled_exc_class() is not asyncio.CancelledError:
        assert got[1] is got[3] is CallStatus.TIMEOUT


@pytest.mark.backends("asyncio", "trio")
async def test_a_tool_whose_task_group_fails_as_the_dispatcher_closes_gives_every_call_one_result() -> None:
    """The same tool running as the dispatcher closes: its call and the one queued behind it end, the group
    does not come out of the dispatcher's block, and the caller's block goes on."""
    started = anyio.Event()
    results: list[Any] = []

    async def tool(key: str) -> str:
        if key == "group":
            await cancelled_with_a_failing_child(started)
        return key

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with Dispatcher(max_concurrency=1, call_timeout=None) as dispatcher:
                dispatcher.add_function(tool, annotations=READ_ONLY)

                async def run() -> None:
                    results.extend(await dispatcher.dispatch(calls("a", "group", "b")))

                tg.start_soon(run)
                await started.wait()
    got = statuses(results)
    assert got[0] is OK
    assert got[1] in (CallStatus.CANCELLED, CallStatus.TOOL_ERROR)
    assert got[2] is CallStatus.CANCELLED


# Time ------------------------------------------------------------------------------------------


@pytest.mark.backends("trio-mockclock", "asyncio")
@pytest.mark.parametrize("seconds", [1e-9, 1e-6, 0.5])
async def test_a_call_ending_at_its_deadline_exactly_leaves_the_next_call_its_whole_timeout(seconds: float) -> None:
    """Call N sleeps its whole timeout (ending at its deadline, as the watcher may cut it): N ends OK or
    TIMEOUT; call N+1, admitted in that instant to the same task, gets its whole timeout; timeouts of 0 and
    of a nanosecond or a microsecond cut no call that does not wait."""

    async def tool(key: str) -> str:
        if key == "edge":
            await anyio.sleep(seconds)
        elif key == "wait":
            await anyio.sleep(seconds * 0.5)
        return key

    keys = ["edge", "wait", "edge", "now", "wait", "now"]
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1, call_timeout=seconds) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            got = statuses(await dispatcher.dispatch(calls(*keys)))
            await usable(dispatcher)
    for key, status in zip(keys, got, strict=True):
        if key == "edge":
            assert status in (OK, CallStatus.TIMEOUT)
        elif key == "now":
            assert status is OK
        elif seconds > 0.01:
            assert status is OK
        else:
            assert status in (OK, CallStatus.TIMEOUT)  # a sleep of 0 may not wait at all


# KeyboardInterrupt, SystemExit -----------------------------------------------------------------


# trio only: on asyncio the event loop re-raises a KeyboardInterrupt or SystemExit raised in a task itself
# (`Task.__step`), past the task group and the test runner (see test_executor_adversarial.py).
@pytest.mark.backends("trio")
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("limit", [1, 2])
async def test_a_tool_stopping_the_program_gives_every_call_one_result(exc: type[BaseException], limit: int) -> None:
    """A tool raising KeyboardInterrupt or SystemExit ends the dispatcher's block with it; every call of the
    batch, those before, beside and after it, still has exactly one result."""
    holder: list[Any] = []

    async def tool(key: str) -> str:
        if key == "stop":
            raise exc
        if key == "wait":
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        return key

    # Beside a call that never ends, when two run at once.
    keys = ["a", "wait", "b", "stop", "c", "d"] if limit == 2 else ["a", "b", "stop", "c", "d"]
    with anyio.fail_after(10), pytest.raises((exc, BaseExceptionGroup)) as caught:
        async with Dispatcher(max_concurrency=limit) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            batch = dispatcher.batch()
            holder.append(batch)
            batch.submit_all(calls(*keys))
            await batch.wait()
    if isinstance(caught.value, BaseExceptionGroup):
        assert caught.value.split(exc)[0] is not None
    batch = holder[0]
    assert batch.done
    got = statuses(batch.results())
    stop = keys.index("stop")
    assert [got[i] for i, key in enumerate(keys[:stop]) if key != "wait"] == [OK] * (stop - limit + 1)
    assert all(status is not OK for status in got[stop:])


# Interleavings ---------------------------------------------------------------------------------

Step = tuple[str, int]  # what a call's tool does ("ok", "sleep", "hang", "stray", "stray-raise"), and a delay
steps: st.SearchStrategy[Step] = st.tuples(
    st.sampled_from(["ok", "sleep", "hang", "stray", "stray-raise", "server", "approved"]), st.integers(0, 3)
)


@pytest.mark.slow
@pytest.mark.backends("asyncio", "trio-mockclock")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(steps, min_size=1, max_size=10),
    cancels=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 6)), max_size=4),
    limit=st.integers(1, 3),
)
async def test_cancels_timeouts_and_stray_cancellations_in_any_order_end_each_call_alone(
    anyio_backend: Any, plan: list[Step], cancels: list[tuple[int, int]], limit: int
) -> None:
    """Calls of local functions (some hostile: they cancel their own task, under asyncio), of an in-process MCP
    server and calls that need an approval, one task carrying several in turn; the caller cancels some at
    moments hypothesis picks and the call timeout cuts those that hang. Every call gets one result in order;
    a call that ended before its cancel keeps its result; a call neither cancelled, hanging nor hostile ends
    OK; and the dispatcher runs the next batch."""
    strays = anyio_backend == "asyncio"

    async def tool(key: str, delay: int = 0) -> str:
        if key == "sleep":
            await anyio.sleep(0.01 * delay)
        elif key == "hang":
            await anyio.sleep(60)
        elif key.startswith("stray"):
            if strays:
                self_cancel()
            if key == "stray-raise":
                raise ValueError("hostile")
        await anyio.lowlevel.checkpoint()
        return key

    async def approve(request: Any) -> bool:
        await anyio.sleep(0.001)
        return True

    server = MCPServer("srv")

    @server.tool(annotations=READ_ONLY)
    async def read(delay: int = 0) -> str:
        await anyio.sleep(0.01 * delay)
        return "read"

    async def approved(key: str) -> str:  # async: a function run in a thread lets the mock clock jump
        await anyio.lowlevel.checkpoint()
        return key

    def make(i: int, step: Step) -> ToolCall:
        kind, delay = step
        if kind == "server":
            return ToolCall(f"c{i}", "read", {"delay": delay}, server="srv")
        if kind == "approved":
            return ToolCall(f"c{i}", "approved", {"key": kind})
        return ToolCall(f"c{i}", "tool", {"key": kind, "delay": delay})

    ended_before: dict[int, CallStatus] = {}
    cancelled: set[int] = set()
    with anyio.fail_after(30):
        async with Dispatcher(
            max_concurrency=limit,
            call_timeout=0.2,
            approve=approve,
            approval=ApprovalPolicy(always={"approved"}),
        ) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            dispatcher.add_function(approved, annotations=READ_ONLY)
            await dispatcher.connect("srv", server, trusted=True)
            async with dispatcher.batch() as batch:
                works = batch.submit_all([make(i, step) for i, step in enumerate(plan)])
                for victim, wait in sorted(cancels, key=lambda c: c[1]):
                    for _ in range(wait):
                        await anyio.lowlevel.checkpoint()
                    target = victim % len(works)
                    if works[target].done:
                        ended_before.setdefault(target, works[target].result().status)
                    cancelled.add(target)
                    works[target].cancel()
            results = batch.results()
            await dispatcher.dispatch([ToolCall("n0", "tool", {"key": "ok"}), ToolCall("n1", "read", server="srv")])
            assert all(r.status is OK for r in await dispatcher.dispatch([ToolCall("n", "tool", {"key": "ok"})]))
    assert [r.call_id for r in results] == [f"c{i}" for i in range(len(plan))]
    for i, (result, (kind, _)) in enumerate(zip(results, plan, strict=True)):
        if i in ended_before:
            assert result.status is ended_before[i], (i, result)
        elif kind == "stray-raise":
            assert result.status in (CallStatus.TOOL_ERROR, CallStatus.CANCELLED), (i, result)
        elif i in cancelled:
            assert result.status in (OK, CallStatus.CANCELLED, CallStatus.TIMEOUT), (i, result)
        elif kind == "hang":
            assert result.status is CallStatus.TIMEOUT, (i, result)
        elif kind == "stray":
            assert result.status in (OK, CallStatus.CANCELLED), (i, result)
        else:
            assert result.status is OK, (i, result)


@pytest.mark.backends("asyncio", "trio")
async def test_closing_with_a_call_running_and_the_next_admitted_to_its_task_gives_each_one_result() -> None:
    """The dispatcher closes as a task's call ends with the next one already admitted to that task (the caller
    waits on the first call, then leaves the block at once): every call gets one result, the dispatcher's
    block raises nothing."""
    wake = anyio.Event()
    holder: list[Any] = []

    async def tool(key: str) -> str:
        if key == "wait":
            await wake.wait()
        else:
            await anyio.sleep_forever()
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1, call_timeout=None) as dispatcher:
            dispatcher.add_function(tool, annotations=READ_ONLY)
            batch = dispatcher.batch()
            holder.append(batch)
            works = batch.submit_all(calls("wait", "next", "last"))
            await anyio.wait_all_tasks_blocked()
            wake.set()
            await works[0].wait()
    got = statuses(holder[0].results())
    assert got == [OK, CallStatus.CANCELLED, CallStatus.CANCELLED]


@pytest.mark.backends("asyncio", "trio")
@pytest.mark.parametrize("limit", [1, 2])
async def test_fail_fast_skips_dependents_while_one_task_carries_the_calls(limit: int) -> None:
    """A write fails on the shared-scope path; fail-fast skips the writes after it, a cancelled call between
    them ends CANCELLED, and the calls after them are skipped (no keys: each depends on every write); the next
    batch runs."""
    started = anyio.Event()

    async def write(key: str) -> str:
        if key == "fail":
            raise ValueError("the write fails")
        if key == "wait":
            started.set()
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        return key

    async def tool(key: str) -> str:
        await anyio.lowlevel.checkpoint()
        return key

    plan = [("tool", "a"), ("write", "wait"), ("write", "fail"), ("write", "b"), ("tool", "c")]
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=limit, fail_fast=True) as dispatcher:
            dispatcher.add_function(write, annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
            dispatcher.add_function(tool, annotations=READ_ONLY)
            async with dispatcher.batch() as batch:
                works = batch.submit_all([ToolCall(f"c{i}", name, {"key": key}) for i, (name, key) in enumerate(plan)])
                await started.wait()
                works[1].cancel()
            results = batch.results()
            await usable(dispatcher)
    got = statuses(results)
    skipped = [r.error is not None and r.error.startswith("not run: it depends on") for r in results]
    assert got[:2] == [OK, CallStatus.CANCELLED]
    assert got[2] is CallStatus.TOOL_ERROR or skipped[2]  # the cancelled write before it may skip it
    assert skipped[3:] == [True, True]
