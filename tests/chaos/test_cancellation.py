"""Cancelling batches under load at points hypothesis chooses: queued, running, retrying, backing off."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher import CallStatus, Dispatcher, RetryPolicy, ToolCall
from dispatcher.examples import Workspace
from dispatcher.testing import inject_faults

from . import harness
from .harness import FIGURES, call_key, scale
from .scenario import make_call

if TYPE_CHECKING:
    from dispatcher import CallEvent, PendingCall, ToolResult

pytestmark = pytest.mark.anyio

Trigger = tuple[Literal["checkpoints", "events", "seconds"], float]

triggers: st.SearchStrategy[Trigger] = st.one_of(
    st.tuples(st.just("checkpoints"), st.integers(0, 400).map(float)),
    st.tuples(st.just("events"), st.integers(1, 80).map(float)),
    st.tuples(st.just("seconds"), st.floats(0.0, 0.08)),
)


async def eventually(condition: Any, within: float = 10.0) -> bool:
    """Whether `condition()` holds within `within` seconds (for work left to the server's tasks)."""
    with anyio.move_on_after(within):
        while not condition():  # noqa: ASYNC110  # the server's tasks change it: no event to wait on
            await anyio.sleep(0.005)
        return True
    return False


@settings(
    max_examples=scale(20, 250),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kinds=st.lists(st.sampled_from(["ws", "raw", "retryable"]), min_size=1, max_size=24),
    how=st.sampled_from(["scope", "batch", "one"]),
    trigger=triggers,
    seed=st.integers(0, 2**16),
    limit=st.sampled_from([None, 1, 3, 8]),
    victim=st.integers(0, 23),
)
async def test_cancelling_a_batch_at_any_point(
    anyio_backend: Any, kinds: list[str], how: str, trigger: Trigger, seed: int, limit: int | None, victim: int
) -> None:
    """Cancellation propagates, nothing starts again after it, in-flight calls end, and the next batch runs.

    ``how``: the task waiting for the batch is cancelled ("scope"), `Batch.cancel()` ("batch"), or one
    call's `PendingCall.cancel()` ("one": only that call may end CANCELLED).
    """
    import random

    rng = random.Random(seed)
    workspace = Workspace(latency_by_tool={"set_note": 0.004, "search_notes": 0.002, "append_note": 0.003})
    faults = inject_faults(
        workspace.server, rate=0.3, seed=seed, kinds=("error", "drop", "hang", "crash"), strike="either"
    )
    events: list[CallEvent] = []
    fired = anyio.Event()
    policy = RetryPolicy(attempts=5, wait_initial=0.005, wait_max=0.03, seed=seed)

    def on_event(event: CallEvent) -> None:
        events.append(event)
        if trigger[0] == "events" and len(events) >= trigger[1]:
            fired.set()

    # "retryable": an idempotent write on the trusted server, which transient faults make retry.
    calls = [
        ToolCall(f"c{i}", "set_note", {"name": "r", "text": f"c{i}"}, server="ws")
        if kind == "retryable"
        else make_call(rng, f"c{i}", kind)
        for i, kind in enumerate(kinds)
    ]
    async with Dispatcher(max_concurrency=limit, call_timeout=0.25, retry=policy, on_event=on_event) as d:
        await d.connect("ws", workspace.server, trusted=True)
        await d.connect("raw", workspace.server)
        batch = d.batch()
        pending: list[PendingCall] = []
        mark: int | None = None
        done_at_trigger = False
        completed = False

        async def cancel_later(scope: anyio.CancelScope) -> None:
            nonlocal mark, done_at_trigger
            kind, amount = trigger
            if kind == "checkpoints":
                for _ in range(int(amount)):
                    await anyio.lowlevel.checkpoint()
            elif kind == "seconds":
                await anyio.sleep(amount)
            else:
                await fired.wait()
            done_at_trigger = batch.done
            if how == "batch":
                batch.cancel()
                mark = len(events)  # cancel() is synchronous: nothing may start after this point
            elif how == "one":
                pending[victim % len(pending)].cancel()
                mark = len(events)
            else:
                scope.cancel()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    tg.start_soon(cancel_later, scope)
                    pending.extend(batch.submit_all(calls))
                    await batch.wait()
                    completed = True
                tg.cancel_scope.cancel()  # a trigger that has not fired yet never will

        FIGURES.cancellations += 1
        FIGURES.batches += 1
        FIGURES.calls += len(calls)
        assert batch.done, "the batch has calls without a result after its wait returned"
        results: list[ToolResult] = batch.results()
        assert not harness.check_results(calls, results)
        cancelled = [r for r in results if r.status is CallStatus.CANCELLED]
        if how == "scope" and cancelled:
            assert not completed, "the cancellation was swallowed by wait()"
        if done_at_trigger:
            assert not cancelled, "calls that had ended were cancelled"
        target = {calls[victim % len(calls)].id} if how == "one" else {call.id for call in calls}
        assert {r.call_id for r in cancelled} <= target, "a call that was not cancelled ended CANCELLED"
        if how == "one":
            assert completed, "cancelling one call cancelled the wait for the batch"

        # Nothing starts after the cancellation was taken into account.
        if mark is None:
            first = next(
                (i for i, e in enumerate(events) if e.result is not None and e.result.status is CallStatus.CANCELLED),
                None,
            )
            mark = first if first is not None else len(events)
        late = [
            f"{e.kind} {e.call.id}" for e in events[mark:] if e.kind in ("started", "retried") and e.call.id in target
        ]
        FIGURES.retried_after_cancel += len(late)
        assert not late, f"calls started after the cancellation: {late}"

        # In-flight calls end, on the client and on the server.
        assert await eventually(lambda: workspace.in_flight == 0), f"{workspace.in_flight} executions still running"
        assert await eventually(lambda: all(e.outcome != "running" for e in faults.ledger))
        assert not harness.check_idle(d)

        # Every execution on the server was an attempt the client made, and none was repeated unsafely.
        allowed = {
            call.id: min(result.attempts, harness.may_run(call, policy.attempts))
            for call, result in zip(calls, results, strict=True)
        }
        tool_of = {call.id: call.name for call in calls}
        executed = [call_key(e.tool, e.arguments) for e in faults.ledger]
        assert not harness.count_executions(executed, calls, allowed, tool_of=tool_of)
        FIGURES.fault("cancel-" + how)
        for execution in faults.ledger:
            if execution.fault is not None:
                FIGURES.fault(f"{execution.fault}-{execution.strike}")

        # The dispatcher is still usable.
        faults.rate = 0.0
        probe = [ToolCall(f"p{i}", "search_notes", {"query": f"p{i}"}, server="ws") for i in range(3)]
        probe.append(ToolCall("p-write", "set_note", {"name": "after", "text": "x"}, server="ws"))
        # A real clock: a loaded machine may stall a probe call past call_timeout, which sends it again.
        with anyio.fail_after(60):
            after, problems = await harness.dispatch_until_answered(d, probe, rounds=10)
        assert not problems
        assert [r.status for r in after] == [CallStatus.OK] * len(probe), [r.error for r in after]


@settings(
    max_examples=scale(10, 150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kinds=st.lists(st.sampled_from(["ws", "raw", "retryable"]), min_size=1, max_size=16),
    trigger=triggers,
    seed=st.integers(0, 2**16),
)
async def test_closing_the_dispatcher_mid_batch(
    anyio_backend: Any, kinds: list[str], trigger: Trigger, seed: int
) -> None:
    """A dispatcher closed while a batch runs: dispatch() returns every result, unfinished ones CANCELLED."""
    import random

    from dispatcher import DispatcherClosedError

    rng = random.Random(seed)
    workspace = Workspace(latency_by_tool={"set_note": 0.004, "search_notes": 0.002, "append_note": 0.003})
    faults = inject_faults(workspace.server, rate=0.3, seed=seed, kinds=("error", "drop", "hang"), strike="either")
    calls = [
        ToolCall(f"c{i}", "set_note", {"name": "r", "text": f"c{i}"}, server="ws")
        if kind == "retryable"
        else make_call(rng, f"c{i}", kind)
        for i, kind in enumerate(kinds)
    ]
    events: list[CallEvent] = []
    fired = anyio.Event()

    def on_event(event: CallEvent) -> None:
        events.append(event)
        finished = sum(1 for e in events if e.kind == "finished")
        if (trigger[0] == "events" and len(events) >= trigger[1]) or finished == len(calls):
            fired.set()

    results: list[ToolResult] = []

    async def run(d: Dispatcher, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # What dispatch() does, with a signal once the calls are submitted.
        batch = d.batch()
        batch.submit_all(calls)
        task_status.started()
        results.extend(await batch.wait())

    policy = RetryPolicy(attempts=5, wait_initial=0.005, wait_max=0.03, seed=seed)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as outer:
            async with Dispatcher(call_timeout=0.25, retry=policy, on_event=on_event) as d:
                await d.connect("ws", workspace.server, trusted=True)
                await d.connect("raw", workspace.server)
                await outer.start(run, d)
                kind, amount = trigger
                if kind == "checkpoints":
                    for _ in range(int(amount)):
                        await anyio.lowlevel.checkpoint()
                elif kind == "seconds":
                    await anyio.sleep(amount)
                else:
                    await fired.wait()  # the n-th event, or the end of the batch
            closed_at = len(events)
    FIGURES.cancellations += 1
    FIGURES.batches += 1
    FIGURES.calls += len(calls)
    FIGURES.fault("close-mid-batch")
    assert not harness.check_results(calls, results)
    for result in results:
        if result.status is CallStatus.CANCELLED:
            assert result.error in ("the dispatcher closed", "cancelled before it started", "cancelled while running")
    late = [f"{e.kind} {e.call.id}" for e in events[closed_at:] if e.kind in ("started", "retried")]
    assert not late, late
    assert await eventually(lambda: workspace.in_flight == 0)
    assert await eventually(lambda: all(e.outcome != "running" for e in faults.ledger))
    executed = [call_key(e.tool, e.arguments) for e in faults.ledger]
    allowed = {c.id: min(r.attempts, harness.may_run(c, policy.attempts)) for c, r in zip(calls, results, strict=True)}
    assert not harness.count_executions(executed, calls, allowed, tool_of={c.id: c.name for c in calls})
    with pytest.raises(DispatcherClosedError):
        await d.dispatch(calls)
