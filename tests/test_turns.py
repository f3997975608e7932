"""Calls handed over by position in any order keep the model's order (`Batch.submit_at`, `Positions`)."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client

from dispatcher import BatchError, CallStatus, Dispatcher, PendingCall, ToolCall
from dispatcher._driver._turns import Positions

from .recording import Recorder, recording_server


@given(st.permutations(range(12)), st.sets(st.integers(0, 11)))
def test_positions_release_every_item_once_in_order(order: list[int], skipped: set[int]) -> None:
    """Whatever order positions arrive in, every put item is released once, in position order."""
    positions: Positions[int] = Positions()
    released: list[int] = []
    for position in order:
        if position in skipped:
            released += positions.skip(position)
        else:
            released += positions.put(position, position)
        # Nothing is released past a position that has not been handed over.
        assert all(item < positions.next for item in released)
    assert released == [p for p in range(12) if p not in skipped]
    assert positions.next == 12


def test_positions_reject_a_position_handed_over_twice_or_negative() -> None:
    """A position is handed over once; a negative or non-int position is an error."""
    positions: Positions[str] = Positions()
    assert positions.put(0, "a") == ["a"]
    with pytest.raises(ValueError, match="already handed over"):
        positions.put(0, "b")
    positions.put(2, "c")
    with pytest.raises(ValueError, match="already handed over"):
        positions.skip(2)
    with pytest.raises(ValueError, match="int >= 0"):
        positions.put(-1, "d")
    with pytest.raises(ValueError, match="int >= 0"):
        positions.put(True, "d")


def _calls(kinds: str) -> list[ToolCall]:
    names = {"r": "read", "w": "write"}
    return [ToolCall(f"c{i}", names[kind], {"key": f"c{i}"}) for i, kind in enumerate(kinds)]


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(5))
async def test_calls_handed_over_in_random_task_order_run_in_position_order(seed: int) -> None:
    """Tasks started in a shuffled order still run the writes in position order, each alone."""
    recorder = Recorder()
    calls = _calls("rrwrwwrrw")
    order = list(range(len(calls)))
    random.Random(seed).shuffle(order)
    results: dict[int, Any] = {}
    async with Client(recording_server(recorder)) as client, Dispatcher() as dispatcher:
        await dispatcher.add_mcp_server("rec", client, trusted=True)
        batch = dispatcher.batch()

        async def one(position: int) -> None:
            # Yield a random number of times so that tasks reach submit_at in an arbitrary order.
            for _ in range(random.Random(seed * 100 + position).randrange(5)):
                await anyio.lowlevel.checkpoint()
            pending = await batch.submit_at(position, calls[position])
            results[position] = await pending.wait()

        async with anyio.create_task_group() as tg:
            for position in order:
                tg.start_soon(one, position)
    assert [results[p].call_id for p in range(len(calls))] == [c.id for c in calls]
    assert all(result.ok for result in results.values())
    assert [result.call_id for result in batch.results()] == [c.id for c in calls]
    writes = [e.key for e in sorted(recorder.executions, key=lambda e: e.start) if e.tool == "write"]
    assert writes == [c.id for c in calls if c.name == "write"]
    assert recorder.violations == []


@pytest.mark.anyio
async def test_a_later_position_waits_for_the_earlier_ones_and_skip_lets_it_go() -> None:
    """A call at position 2 is not queued until positions 0 and 1 are handed over (one of them skipped)."""
    recorder = Recorder()
    async with Client(recording_server(recorder)) as client, Dispatcher() as dispatcher:
        await dispatcher.add_mcp_server("rec", client, trusted=True)
        batch = dispatcher.batch()
        got: list[PendingCall] = []

        async def hand_over(position: int, call: ToolCall) -> None:
            got.append(await batch.submit_at(position, call))

        async with anyio.create_task_group() as tg:
            tg.start_soon(hand_over, 2, ToolCall("w2", "write", {"key": "w2"}))
            await anyio.wait_all_tasks_blocked()
            assert len(batch) == 0 and recorder.executions == []
            tg.start_soon(hand_over, 0, ToolCall("w0", "write", {"key": "w0"}))
            await anyio.wait_all_tasks_blocked()
            assert [p.call.id for p in got] == ["w0"]
            batch.skip(1)
        assert [p.call.id for p in got] == ["w0", "w2"]
        results = await batch.wait()
    assert [r.call_id for r in results] == ["w0", "w2"]
    assert [e.key for e in recorder.executions] == ["w0", "w2"]


@pytest.mark.anyio
async def test_a_caller_cancelled_while_waiting_leaves_its_call_unqueued() -> None:
    """Cancelling a task waiting for earlier positions never runs its call; later positions still go."""
    recorder = Recorder()
    async with Client(recording_server(recorder)) as client, Dispatcher() as dispatcher:
        await dispatcher.add_mcp_server("rec", client, trusted=True)
        batch = dispatcher.batch()
        scope = anyio.CancelScope()

        async def cancelled_one() -> None:
            with scope:
                await batch.submit_at(1, ToolCall("w1", "write", {"key": "w1"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled_one)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
            pending = await batch.submit_at(0, ToolCall("w0", "write", {"key": "w0"}))
            later = await batch.submit_at(2, ToolCall("w2", "write", {"key": "w2"}))
            assert (await pending.wait()).status is CallStatus.OK
            assert (await later.wait()).status is CallStatus.OK
    assert [e.key for e in recorder.executions] == ["w0", "w2"]


@pytest.mark.anyio
async def test_bad_positions_and_duplicate_ids_are_batch_errors() -> None:
    """A position handed over twice, a negative position and a reused id are `BatchError`s."""
    async with Client(recording_server(Recorder())) as client, Dispatcher() as dispatcher:
        await dispatcher.add_mcp_server("rec", client, trusted=True)
        batch = dispatcher.batch()
        await batch.submit_at(0, ToolCall("a", "read", {"key": "a"}))
        with pytest.raises(BatchError, match="already handed over"):
            await batch.submit_at(0, ToolCall("b", "read", {"key": "b"}))
        with pytest.raises(BatchError, match="int >= 0"):
            await batch.submit_at(-1, ToolCall("c", "read", {"key": "c"}))
        with pytest.raises(BatchError, match="duplicate call id"):
            await batch.submit_at(1, ToolCall("a", "read", {"key": "a"}))
        with pytest.raises(BatchError, match="already handed over"):
            batch.skip(0)
        assert [r.call_id for r in await batch.wait()] == ["a"]
