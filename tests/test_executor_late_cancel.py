"""A tool that schedules its own task's cancellation to land later (asyncio's `loop.call_later(delay, task.cancel)`)
and returns: no turn of the loop its task lets run between calls absorbs it, so it lands on whatever that task runs
when it fires. A call that may mutate never runs in a task that ran another call before it, so it cannot be
the one cut short; a read it lands on ends CANCELLED with an unknown effect, saying who can have cancelled it.

Every test runs with ``max_concurrency=1``, so that one task would carry every call of the batch in turn.
Under trio a tool cannot cancel its task without a cancel scope, which the call's own scope contains.
"""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, Effect, ToolCall

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False)
DELAY = 0.01


def _cancel_own_task_later() -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().call_later(DELAY, task.cancel)


def _register(dispatcher: Dispatcher, hostile_annotations: ToolAnnotations) -> list[str]:
    ran: list[str] = []

    async def hostile() -> str:
        _cancel_own_task_later()
        return "h"

    async def slow_write(key: str) -> str:
        await anyio.sleep(DELAY * 5)  # the scheduled cancellation fires meanwhile
        ran.append(key)
        return key

    async def slow_read(key: str) -> str:
        await anyio.sleep(DELAY * 5)
        return key

    dispatcher.add_function(hostile, annotations=hostile_annotations)
    dispatcher.add_function(slow_write, annotations=WRITE)
    dispatcher.add_function(slow_read, annotations=READ_ONLY)
    return ran


@pytest.mark.backends("asyncio")
@pytest.mark.parametrize("hostile", ["read", "write"])
async def test_a_write_after_a_tool_that_cancels_its_task_later_is_not_cut_short(hostile: str) -> None:
    """A read or a write schedules its own task's cancellation and returns; the write after it runs to its
    answer (it runs in a task of its own), and so does the next batch."""
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            ran = _register(dispatcher, READ_ONLY if hostile == "read" else WRITE)
            results = await dispatcher.dispatch(
                [
                    ToolCall("h", "hostile"),
                    ToolCall("w1", "slow_write", {"key": "w1"}),
                    ToolCall("w2", "slow_write", {"key": "w2"}),
                ]
            )
            again = await dispatcher.dispatch([ToolCall("r", "slow_read", {"key": "r"})])
    assert [(r.call_id, r.status, r.effect) for r in results] == [
        ("h", CallStatus.OK, Effect.RAN),
        ("w1", CallStatus.OK, Effect.RAN),
        ("w2", CallStatus.OK, Effect.RAN),
    ]
    assert ran == ["w1", "w2"]
    assert again[0].status is CallStatus.OK


@pytest.mark.backends("asyncio")
async def test_a_read_a_late_cancellation_lands_on_ends_cancelled_of_unknown_effect_saying_who_can_have() -> None:
    """A read carried on by the task of a tool that scheduled that task's cancellation is cut short: it ends
    CANCELLED (never OK), its effect UNKNOWN (it was sent), and its error names an earlier call of the same
    task as a possible source; the calls after it, and the dispatcher, go on."""
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            _register(dispatcher, READ_ONLY)
            results = await dispatcher.dispatch(
                [
                    ToolCall("h", "hostile"),
                    ToolCall("r1", "slow_read", {"key": "r1"}),
                    ToolCall("r2", "slow_read", {"key": "r2"}),
                ]
            )
            again = await dispatcher.dispatch([ToolCall("r3", "slow_read", {"key": "r3"})])
    hostile, victim, after = results
    assert hostile.status is CallStatus.OK
    assert (victim.status, victim.effect, victim.attempts) == (CallStatus.CANCELLED, Effect.UNKNOWN, 1)
    assert victim.error is not None and "earlier call run by the same task" in victim.error
    assert victim.result is None
    assert after.status is CallStatus.OK
    assert again[0].status is CallStatus.OK


@pytest.mark.backends("asyncio", "trio")
async def test_writes_in_a_row_each_get_a_result_in_order_and_the_gate_s_order_holds() -> None:
    """Writes that each run in a task of their own still run one at a time, in request order, each to its answer."""
    order: list[str] = []
    running = 0

    async def write(key: str) -> str:
        nonlocal running
        running += 1
        assert running == 1, "two writes overlapped"
        await anyio.lowlevel.checkpoint()
        order.append(key)
        running -= 1
        return key

    async def read(key: str) -> str:
        await anyio.lowlevel.checkpoint()
        order.append(key)
        return key

    keys = ["r0", "w1", "w2", "r3", "r4", "w5", "w6", "w7", "r8"]
    with anyio.fail_after(10):
        async with Dispatcher() as dispatcher:
            dispatcher.add_function(write, annotations=WRITE)
            dispatcher.add_function(read, annotations=READ_ONLY)
            results = await dispatcher.dispatch(
                [ToolCall(k, "write" if k[0] == "w" else "read", {"key": k}) for k in keys]
            )
            assert dispatcher.idle
    assert [r.call_id for r in results] == keys
    assert all(r.status is CallStatus.OK for r in results)
    # Each write waits for everything before it, and everything after it waits for it.
    for i, key in enumerate(keys):
        if key[0] == "w":
            assert order.index(key) == i, order
