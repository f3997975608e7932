"""A cancellation that lands as a retry's backoff wait ends: no attempt starts after it.

The chaos suite once saw ``retried c1`` after ``Batch.cancel()`` under asyncio on a loaded machine. The window:
the backoff's sleep has ended (its timer fired, the task is due to resume) when another task cancels the call.
anyio's asyncio backend cancels only a task whose awaited future is not done yet, so the cancellation is left for
the task's next checkpoint, and nothing between the end of the sleep and the next attempt's start was one: the
attempt started, its ``retried`` event emitted, after the cancel. Under trio the sleep ends with its own
`Cancelled`, which the cancelled call's scope takes over, so the window is asyncio's alone; the tests pin the
rule on every backend.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, ToolAnnotations

from dispatcher import CallStatus, Dispatcher, RetryPolicy, ToolCall
from dispatcher._driver import _retry
from dispatcher.examples import Workspace
from dispatcher.testing import inject_faults

if TYPE_CHECKING:
    from collections.abc import Callable

    from dispatcher import CallEvent

IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)

pytestmark = [pytest.mark.anyio, pytest.mark.backends("asyncio", "trio", "trio-mockclock")]


class _Anyio(types.SimpleNamespace):
    """anyio as the retrier sees it, with its backoff's sleep followed by `woke()` (nothing in between)."""

    def __init__(self, woke: Callable[[], None]) -> None:
        super().__init__()
        self._woke = woke

    def __getattr__(self, name: str) -> Any:
        return getattr(anyio, name)

    async def sleep(self, delay: float) -> None:
        await anyio.sleep(delay)
        self._woke()


@pytest.mark.parametrize("how", ["batch", "one"])
async def test_a_cancel_as_the_backoff_ends_starts_no_attempt(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The call is cancelled once its backoff's sleep has returned and before the retrier goes on: it ends
    CANCELLED after its one attempt, with no ``retried`` event and no second run of the tool."""
    runs: list[int] = []
    events: list[CallEvent] = []
    marks: list[int] = []

    async def flaky() -> str:
        runs.append(1)
        raise MCPError(code=INTERNAL_ERROR, message="try later")

    policy = RetryPolicy(attempts=3, wait_initial=0.01, wait_max=0.01, jitter=False, timeout=None)
    async with Dispatcher(retry=policy, on_event=events.append) as dispatcher:
        dispatcher.add_function(flaky, annotations=IDEMPOTENT)
        batch = dispatcher.batch()
        pending = batch.submit(ToolCall("f", "flaky"))

        def woke() -> None:
            marks.append(len(events))
            if how == "batch":
                batch.cancel()
            else:
                pending.cancel()

        monkeypatch.setattr(_retry, "anyio", _Anyio(woke))
        with anyio.fail_after(10):
            await batch.wait()
    assert marks, "the backoff never ended: the test did not reach the window it is about"
    late = [f"{e.kind} {e.call.id}" for e in events[marks[0] :] if e.kind in ("started", "retried")]
    assert not late, f"calls started after the cancellation: {late}"
    result = pending.result()
    assert result.status is CallStatus.CANCELLED, result
    assert result.attempts == 1 and runs == [1]
    assert result.attempt_errors == ("the server answered with error -32603: try later",)


@pytest.mark.backends("asyncio")
async def test_a_cancel_in_the_loop_turn_the_backoff_ends_in_starts_no_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race itself, on asyncio and with nothing of the dispatcher patched: a stalled loop (its clock jumps past
    the backoff) runs the backoff's timer, then a callback that cancels the batch, in one turn. The sleep's future
    is done by then, so anyio leaves the cancellation for the task's next checkpoint; the call must not start its
    second attempt before it."""
    import asyncio

    wait = 30.0  # seconds of the loop's clock, never waited for: the clock jumps over them
    loop = asyncio.get_running_loop()
    offset = [0.0]
    clock = loop.time
    monkeypatch.setattr(loop, "time", lambda: clock() + offset[0])
    runs: list[int] = []
    events: list[CallEvent] = []
    marks: list[int] = []
    failed = anyio.Event()

    async def flaky() -> str:
        runs.append(1)
        if len(runs) == 1:
            failed.set()
            raise MCPError(code=INTERNAL_ERROR, message="try later")
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    policy = RetryPolicy(attempts=3, wait_initial=wait, wait_max=wait, jitter=False, timeout=None)
    async with Dispatcher(retry=policy, on_event=events.append) as dispatcher:
        dispatcher.add_function(flaky, annotations=IDEMPOTENT)
        batch = dispatcher.batch()
        pending = batch.submit(ToolCall("f", "flaky"))

        def cancel() -> None:
            marks.append(len(events))
            batch.cancel()

        async def stall() -> None:
            await failed.wait()
            # The backoff's timer: the one `wait` ahead (every other timer here is nearer or far beyond it),
            # found in the loop's heap of timers (asyncio's own, read only).
            scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
            timers: list[float] = []
            for _ in range(1000):
                now = loop.time()
                timers = [
                    h.when() for h in scheduled if not h.cancelled() and now + wait / 2 < h.when() < now + 2 * wait
                ]
                if timers:
                    break
                await asyncio.sleep(0)
            assert len(timers) == 1, timers
            loop.call_at(timers[0] + 0.001, cancel)
            offset[0] += wait + 1.0  # the loop stalls past both: they run in its next turn, in that order

        async with anyio.create_task_group() as tg:
            tg.start_soon(stall)
            await batch.wait()
    assert marks, "the cancel never ran"
    late = [f"{e.kind} {e.call.id}" for e in events[marks[0] :] if e.kind in ("started", "retried")]
    assert not late, f"calls started after the cancellation: {late}"
    result = pending.result()
    assert result.status is CallStatus.CANCELLED and result.attempts == 1, result
    assert runs == [1], "the tool ran again after its call was cancelled"


async def test_a_server_call_cancelled_as_its_backoff_ends_is_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chaos suite's case: a trusted server's idempotent write whose first attempt failed transiently is
    cancelled as its backoff ends; the server sees one execution, and the call ends CANCELLED."""
    workspace = Workspace()
    faults = inject_faults(workspace.server, rate=0.0, seed=0)
    faults.fail_next("set_note", "error")
    events: list[CallEvent] = []
    marks: list[int] = []
    policy = RetryPolicy(attempts=3, wait_initial=0.01, wait_max=0.01, jitter=False, timeout=None)
    async with Dispatcher(call_timeout=5.0, retry=policy, on_event=events.append) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        batch = dispatcher.batch()
        pending = batch.submit(ToolCall("c1", "set_note", {"name": "r", "text": "c1"}, server="ws"))

        def woke() -> None:
            marks.append(len(events))
            batch.cancel()

        monkeypatch.setattr(_retry, "anyio", _Anyio(woke))
        with anyio.fail_after(10):
            await batch.wait()
    assert marks, "the backoff never ended: the test did not reach the window it is about"
    late = [f"{e.kind} {e.call.id}" for e in events[marks[0] :] if e.kind in ("started", "retried")]
    assert not late, f"calls started after the cancellation: {late}"
    result = pending.result()
    assert result.status is CallStatus.CANCELLED and result.attempts == 1, result
    assert [e.fault for e in faults.ledger] == ["error"], faults.ledger
