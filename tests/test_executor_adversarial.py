"""The executor under hostile tools: every call still gets exactly one result, in order, and nothing hangs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, ErrorData, ToolAnnotations

from dispatcher import CallStatus, Dispatcher, PendingCall, RetryPolicy, ToolCall

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("read_only", [True, False])
async def test_a_tool_raising_the_cancellation_exception_strands_no_call_behind_it(read_only: bool) -> None:
    """A tool that raises asyncio's CancelledError (or cancels its own task) leaves every other call a result."""

    async def hostile(key: str) -> str:
        if key == "raise":
            raise asyncio.CancelledError
        if key == "self":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
        return key

    annotations = READ_ONLY if read_only else ToolAnnotations(read_only_hint=False, idempotent_hint=False)
    keys = ["a", "raise", "b", "self", "c"] * 3
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(hostile, annotations=annotations)
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "hostile", {"key": k}) for i, k in enumerate(keys)])
            again = await dispatcher.dispatch([ToolCall("d", "hostile", {"key": "d"})])
    assert [result.call_id for result in results] == [f"c{i}" for i in range(len(keys))]
    for key, result in zip(keys, results, strict=True):
        if key in ("raise", "self"):
            assert result.status is CallStatus.CANCELLED
        else:
            assert result.status is CallStatus.OK, result
    assert again[0].status is CallStatus.OK


class Hostile(BaseException):
    """A BaseException subclass of a tool's own."""


@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize("retried", [False, True])
async def test_a_tool_raising_a_base_exception_fails_its_call_alone(read_only: bool, retried: bool) -> None:
    """GeneratorExit, a BaseException of the tool's own, or a group of them fail that call; the batch goes on."""

    async def hostile(key: str) -> str:
        if key == "genexit":
            raise GeneratorExit
        if key == "own":
            raise Hostile
        if key == "group":
            raise BaseExceptionGroup("inner", [Hostile(), ValueError()])
        await anyio.lowlevel.checkpoint()
        return key

    annotations = READ_ONLY if read_only else ToolAnnotations(read_only_hint=False, idempotent_hint=False)
    if retried:
        annotations = ToolAnnotations(read_only_hint=read_only, idempotent_hint=True)
    keys = ["a", "genexit", "b", "own", "c", "group", "d"] * 2
    retry = RetryPolicy(attempts=2, wait_initial=0.0, wait_max=0.0) if retried else None
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=2, call_timeout=5, retry=retry) as dispatcher:
            dispatcher.add_function(hostile, annotations=annotations)
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "hostile", {"key": k}) for i, k in enumerate(keys)])
    assert [result.call_id for result in results] == [f"c{i}" for i in range(len(keys))]
    for key, result in zip(keys, results, strict=True):
        if key in ("genexit", "own", "group"):
            assert result.status is CallStatus.FAILED, result
        else:
            assert result.status is CallStatus.OK, result


adversarial_specs = st.lists(
    st.tuples(
        st.sampled_from(["read", "write", "flaky", "cancel_next", "cancel_self", "slow"]),
        st.sampled_from([0, 0, 0, 1, 2]),  # checkpoints before it returns
        st.booleans(),  # cancelled from outside right after submission
        st.sampled_from([0, 0, 1]),  # checkpoints the submitter waits after submitting it
    ),
    max_size=40,
)


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=adversarial_specs,
    limit=st.sampled_from([None, 1, 2, 3, 64, 65]),
    call_timeout=st.sampled_from([None, 0.02, 5.0]),
    retried=st.booleans(),
)
async def test_hostile_interleavings_give_every_call_one_result_in_order(
    anyio_backend: Any,
    virtual_clock: bool,
    specs: list[tuple[str, int, bool, int]],
    limit: int | None,
    call_timeout: float | None,
    retried: bool,
) -> None:
    """Streamed submission, cancels from inside and outside, timeouts and retries: one result each, limits hold.

    Only `slow` outlasts a call_timeout of 0.02 s on the virtual clock. On a real one a loaded machine can
    stall the loop past it in a call of a few checkpoints: such a call may end TIMEOUT, once its time was up.
    """
    active = {"all": 0, "writes": 0, "most": 0}
    overlaps: list[str] = []
    pending: list[PendingCall] = []

    async def run(key: str, steps: int, write: bool) -> str:
        if write and active["all"]:
            overlaps.append(key)
        active["all"] += 1
        active["writes"] += write
        if active["writes"] and active["all"] > 1:
            overlaps.append(key)
        active["most"] = max(active["most"], active["all"])
        try:
            for _ in range(steps):
                await anyio.lowlevel.checkpoint()
        finally:
            active["all"] -= 1
            active["writes"] -= write
        return key

    async def read(key: str, steps: int = 0) -> str:
        return await run(key, steps, False)

    async def write(key: str, steps: int = 0) -> str:
        return await run(key, steps, True)

    async def flaky(key: str, steps: int = 0) -> str:
        await run(key, steps, False)
        raise OSError("transient")

    async def slow(key: str, steps: int = 0) -> str:
        await anyio.sleep(0.05)
        return await run(key, steps, False)

    async def cancel_next(key: str, steps: int = 0) -> str:
        index = int(key[1:])
        if index + 1 < len(pending):
            pending[index + 1].cancel()
        return await run(key, steps, False)

    async def cancel_self(key: str, steps: int = 0) -> str:
        pending[int(key[1:])].cancel()
        return await run(key, steps + 1, False)

    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True)
    retry = RetryPolicy(attempts=2, wait_initial=0.0, wait_max=0.0, retry_read_only=True) if retried else None
    with anyio.fail_after(60):
        async with Dispatcher(max_concurrency=limit, call_timeout=call_timeout, retry=retry) as dispatcher:
            dispatcher.add_function(read, annotations=read_only)
            dispatcher.add_function(write, annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False))
            for fn in (flaky, slow, cancel_next, cancel_self):
                dispatcher.add_function(fn, annotations=read_only)
            async with dispatcher.batch() as batch:
                for index, (tool, steps, cancel, pause) in enumerate(specs):
                    work = batch.submit(ToolCall(f"c{index}", tool, {"key": f"c{index}", "steps": steps}))
                    pending.append(work)
                    if cancel:
                        work.cancel()
                    for _ in range(pause):
                        await anyio.lowlevel.checkpoint()
                results = await batch.wait()
            assert dispatcher.idle
    assert [result.call_id for result in results] == [f"c{i}" for i in range(len(specs))]
    assert all(work.done for work in pending)
    assert overlaps == []
    assert limit is None or active["most"] <= limit
    for (tool, _, cancel, _), result in zip(specs, results, strict=True):
        if cancel or tool == "cancel_self":
            continue
        if result.status is CallStatus.TIMEOUT and tool != "slow":
            assert not virtual_clock and call_timeout is not None, result
            assert result.run_time >= call_timeout - 1e-9, result  # stalled past its timeout, not cut early
            continue
        if tool in ("read", "write", "cancel_next"):
            assert result.status in (CallStatus.OK, CallStatus.CANCELLED), result
        elif tool == "slow":
            assert result.status in (CallStatus.OK, CallStatus.CANCELLED, CallStatus.TIMEOUT), result
        else:
            assert result.status in (CallStatus.TOOL_ERROR, CallStatus.FAILED, CallStatus.CANCELLED), result


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize("limit", [1, 2, None])
@pytest.mark.parametrize(
    "keys", [["a", "self"], ["a", "self", "b"], ["self", "nap", "b"], ["a", "nap", "self", "nap", "b"]]
)
async def test_a_tool_that_cancels_its_own_task_and_returns_strands_no_later_call(
    read_only: bool, limit: int | None, keys: list[str]
) -> None:
    """A tool that cancels its own task and returns at once leaves no runner dead: later calls and batches run.

    The cancellation is still pending when the tool returns, so it lands wherever its runner next waits:
    letting the loop run at the end of a time slice (after a call that napped past it), or parked
    between batches.
    """

    async def hostile(key: str) -> str:
        if key == "self":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        elif key == "nap":
            await anyio.sleep(0.003)  # past the runners' time slice: the next call follows a yield
        return key

    annotations = READ_ONLY if read_only else ToolAnnotations(read_only_hint=False, idempotent_hint=False)
    rounds: list[int] = []
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=limit) as dispatcher:
            dispatcher.add_function(hostile, annotations=annotations)
            for round_, round_keys in enumerate([keys, ["a", "b", "c"], keys, ["a", "nap", "b"]]):
                calls = [ToolCall(f"{round_}-{i}", "hostile", {"key": key}) for i, key in enumerate(round_keys)]
                results = await dispatcher.dispatch(calls)
                assert [result.call_id for result in results] == [call.id for call in calls]
                assert all(result.status is CallStatus.OK for result in results), [
                    (r.status.value, r.error) for r in results
                ]
                await anyio.wait_all_tasks_blocked()
                rounds.append(round_)
            assert dispatcher.idle
    # A runner ended by the cancellation would cancel the dispatcher's task group, and with it this block.
    assert rounds == [0, 1, 2, 3]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("limit", [1, 2, 16, None])
@pytest.mark.parametrize("how", ["soon", "uncancel"])
async def test_a_tool_that_has_its_own_task_cancelled_later_leaves_no_task_dead(limit: int | None, how: str) -> None:
    """A tool that schedules its own task's cancellation (`call_soon(task.cancel)`), or cancels and uncancels
    it (the request count is back to 0, the cancellation still lands), among calls that take the runners
    past their time slices: the cancellation lands where a runner lets the loop run, and no runner dies.

    A call it lands in may end CANCELLED; the batch and the next ones run, and the caller's block goes on.
    """

    async def hostile(i: int) -> int:
        clock_until = time.perf_counter() + 0.0003
        while time.perf_counter() < clock_until:
            pass  # computing: takes the runners past their 2 ms slices
        if i % 13 == 5:
            task = asyncio.current_task()
            assert task is not None
            if how == "soon":
                asyncio.get_running_loop().call_soon(task.cancel)
            else:
                task.cancel()
                task.uncancel()
        return i

    calls = [ToolCall(f"c{i}", "hostile", {"i": i}) for i in range(400)]
    rounds: list[int] = []
    with anyio.fail_after(20):
        async with Dispatcher(max_concurrency=limit, call_timeout=5) as dispatcher:
            dispatcher.add_function(hostile, annotations=READ_ONLY)
            results = await dispatcher.dispatch(calls)
            rounds.append(1)
            again = await dispatcher.dispatch([ToolCall(f"a{i}", "hostile", {"i": 0}) for i in range(50)])
            rounds.append(2)
    assert rounds == [1, 2], "a runner ended by the cancellation cancelled the dispatcher's task group"
    assert [result.call_id for result in results] == [call.id for call in calls]
    assert all(result.status in (CallStatus.OK, CallStatus.CANCELLED) for result in results)
    assert all(result.ok for result in again)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("limit", [1, None])
async def test_a_tool_cancelling_its_own_task_as_its_call_is_cancelled_leaves_the_next_batch_running(
    limit: int | None,
) -> None:
    """A call cancelled while its tool cancels its own task and returns: the next batch runs."""
    handles: dict[str, PendingCall] = {}
    rounds: list[int] = []

    async def hostile(key: str) -> str:
        if key == "both":
            handles[key].cancel()  # cancels the call's scope
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # still pending as the call ends
        return key

    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=limit) as dispatcher:
            dispatcher.add_function(hostile, annotations=READ_ONLY)
            for round_ in range(3):
                async with dispatcher.batch() as batch:
                    handles["both"] = batch.submit(ToolCall(f"{round_}-both", "hostile", {"key": "both"}))
                await anyio.wait_all_tasks_blocked()
                results = await dispatcher.dispatch(
                    [ToolCall(f"{round_}-{key}", "hostile", {"key": key}) for key in "ab"]
                )
                assert [result.status for result in results] == [CallStatus.OK] * 2, results
                rounds.append(round_)
    assert rounds == [0, 1, 2]


def _cancel_own_task(how: str) -> None:
    """Cancel the current asyncio task now, later (`call_soon`), or now and uncancel it (still delivered)."""
    task = asyncio.current_task()
    assert task is not None
    if how == "soon":
        asyncio.get_running_loop().call_soon(task.cancel)
    elif how == "uncancel":
        task.cancel()
        task.uncancel()
    else:
        task.cancel()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("limit", [1, 2, None])
@pytest.mark.parametrize("how", ["now", "soon", "uncancel"])
@pytest.mark.parametrize("wait", [0.0, 0.01])
async def test_a_retried_tool_leaving_a_cancellation_on_its_task_leaves_no_task_dead(
    limit: int | None, how: str, wait: float
) -> None:
    """An idempotent tool fails transiently and leaves a cancellation on its task: it is withdrawn before the
    wait for the next attempt, which succeeds; one scheduled to land later (`call_soon`) ends the call it
    lands in as CANCELLED, saying so. The runner lives on and the next batch runs."""
    tries: dict[int, int] = {}

    async def flaky(i: int) -> int:
        tries[i] = tries.get(i, 0) + 1
        if i % 3 == 1 and tries[i] == 1:
            _cancel_own_task(how)
            raise MCPError.from_error_data(ErrorData(code=INTERNAL_ERROR, message="transient"))
        return i

    idempotent = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
    rounds: list[int] = []
    retry = RetryPolicy(attempts=3, wait_initial=wait, wait_max=wait, jitter=False)
    with anyio.fail_after(20):
        async with Dispatcher(max_concurrency=limit, call_timeout=5, retry=retry) as dispatcher:
            dispatcher.add_function(flaky, annotations=idempotent)
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "flaky", {"i": i}) for i in range(12)])
            rounds.append(1)
            tries.clear()
            again = await dispatcher.dispatch([ToolCall(f"d{i}", "flaky", {"i": 0}) for i in range(4)])
            rounds.append(2)
    assert rounds == [1, 2], "a runner ended by the cancellation cancelled the dispatcher's task group"
    assert [result.call_id for result in results] == [f"c{i}" for i in range(12)]
    failed = [(r.call_id, r.status, r.error) for r in results if not r.ok]
    if how == "soon":
        assert all(status is CallStatus.CANCELLED for _, status, _ in failed), failed
        assert all(error is not None and "earlier call run by the same task" in error for _, _, error in failed), failed
    else:
        assert failed == []
    assert all(result.ok for result in again)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancellation_a_write_leaves_past_its_deadline_strands_no_read() -> None:
    """A write schedules its own task's cancellation and returns past its deadline: letting it land lets
    the deadline's timer fire too, and the runner still brings runners for the reads it releases."""
    timeout, meets = 0.3, 100
    arrived = 0
    everyone = anyio.Event()

    async def write() -> str:
        await anyio.sleep(timeout - 0.003)
        _cancel_own_task("soon")
        time.sleep(0.006)  # noqa: ASYNC251 - past the deadline and its slack without a checkpoint
        return "w"

    async def meet(k: int) -> int:
        nonlocal arrived
        arrived += 1
        if arrived == meets:
            everyone.set()
        await everyone.wait()
        return k

    rounds: list[int] = []
    with anyio.fail_after(20):
        async with Dispatcher(max_concurrency=None, call_timeout=timeout) as dispatcher:
            dispatcher.add_function(write)
            dispatcher.add_function(meet, annotations=READ_ONLY)
            calls = [ToolCall("w", "write")] + [ToolCall(f"m{k}", "meet", {"k": k}) for k in range(meets)]
            results = await dispatcher.dispatch(calls)
            rounds.append(1)
    assert rounds == [1]
    assert [result.call_id for result in results] == [call.id for call in calls]
    assert [(result.call_id, result.status) for result in results if not result.ok] == []


async def test_a_call_cancelled_in_each_phase_settles_once_saying_where_it_was(anyio_backend: Any) -> None:
    """Cancelled while queued behind a write, while its approval is asked, while it runs, and after it ended:
    each gets one result that says which (the ended one keeps its answer), and the batch goes on."""
    asking = anyio.Event()
    running = anyio.Event()
    release = anyio.Event()

    async def write() -> str:  # no annotations: may mutate, runs alone, needs approval
        running.set()
        await release.wait()
        return "w"

    async def read(key: str) -> str:
        return key

    async def approve(request: Any) -> bool:
        asking.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with Dispatcher() as d:
        d.add_function(write)
        d.add_function(read, annotations=READ_ONLY)
        async with d.batch() as free:
            done = free.submit(ToolCall("done", "read", {"key": "k"}))
            await done.wait()
            done.cancel()  # after its result: nothing changes
            running_call = free.submit(ToolCall("running", "write"))
            queued = free.submit(ToolCall("queued", "read", {"key": "q"}))  # behind the write
            await running.wait()
            queued.cancel()
            running_call.cancel()
        async with d.batch(approve=approve) as asked:
            held = asked.submit(ToolCall("held", "write"))
            await asking.wait()
            held.cancel()
        release.set()
        again = await d.dispatch([ToolCall("again", "read", {"key": "a"})])
    outcomes = {r.call_id: (r.status, r.error) for r in [*free.results(), *asked.results()]}
    assert outcomes == {
        "done": (CallStatus.OK, None),
        "running": (CallStatus.CANCELLED, "cancelled while running"),
        "queued": (CallStatus.CANCELLED, "cancelled before it started"),
        "held": (CallStatus.CANCELLED, "cancelled while waiting for approval"),
    }
    assert again[0].ok


@pytest.mark.parametrize("limit", [4, None])
async def test_the_dispatcher_closing_mid_batch_gives_every_call_one_result(
    anyio_backend: Any, limit: int | None
) -> None:
    """The dispatcher's block ends while 500 calls are queued or running: every call has one result (OK if
    it ended first, else CANCELLED), the waiter is not left hanging, and no task of a call outlives it."""
    started = anyio.Event()

    async def slow(i: int) -> int:
        started.set()
        await anyio.sleep(0.01 * (i % 3))
        return i

    batch = None
    with anyio.fail_after(20):
        async with Dispatcher(max_concurrency=limit) as d:
            d.add_function(slow, annotations=READ_ONLY)
            batch = d.batch()
            batch.submit_all([ToolCall(f"c{i}", "slow", {"i": i}) for i in range(500)])
            await started.wait()
        results = await batch.wait()
    assert len(results) == 500
    assert {r.status for r in results} <= {CallStatus.OK, CallStatus.CANCELLED}
    assert any(r.status is CallStatus.CANCELLED for r in results)
    assert not any("Executor._run" in (task.name or "") for task in anyio.get_running_tasks())


class Interrupt(KeyboardInterrupt):
    """Stands for a Ctrl-C arriving inside a tool."""


# trio only: on asyncio a KeyboardInterrupt raised in a task is re-raised by the event loop itself
# (`Task.__step`), past the task group and the test runner, which stops the whole test session; the
# dispatcher's part (re-raise it, never make it a result, still give the call its result) is the same.
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_keyboard_interrupt_inside_a_tool_stops_the_program_not_only_the_call(anyio_backend: Any) -> None:
    """KeyboardInterrupt (and SystemExit) are not a tool's failure: they leave the dispatcher's block, and the
    caller waiting for the batch is not left hanging (the call settles as the dispatcher closes)."""

    async def stop() -> str:
        raise Interrupt

    with pytest.raises((Interrupt, BaseExceptionGroup)) as caught:
        async with Dispatcher() as d:
            d.add_function(stop, annotations=READ_ONLY)
            await d.dispatch([ToolCall("s", "stop")])
    error = caught.value
    if isinstance(error, BaseExceptionGroup):
        assert error.subgroup(Interrupt) is not None
