"""call_timeout: a slow call becomes TIMEOUT, its server handler is cancelled, its siblings are untouched."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from dispatcher import CallStatus, Dispatcher, ToolCall

from .recording import READ, Recorder, recording_server

pytestmark = [pytest.mark.anyio, pytest.mark.backends("asyncio", "trio", "trio-mockclock")]


async def test_slow_call_times_out_and_its_handler_is_cancelled(virtual_clock: bool) -> None:
    """A call past call_timeout is TIMEOUT, the server-side handler sees cancellation, siblings are OK."""
    recorder = Recorder()
    timeout = 0.5 if virtual_clock else 2.0  # the siblings must answer in time on a loaded machine too
    async with Client(recording_server(recorder)) as client, Dispatcher(call_timeout=timeout) as dispatcher:
        await dispatcher.add_mcp_server("rec", client, trusted=True)
        started = anyio.current_time()
        results = await dispatcher.dispatch(
            [
                ToolCall("slow", "sleep", {"key": "slow", "seconds": 3600}),
                ToolCall("fast", "read", {"key": "fast"}),
                ToolCall("w", "write", {"key": "w"}),
            ]
        )
        elapsed = anyio.current_time() - started
    slow, fast, w = results
    assert slow.status is CallStatus.TIMEOUT and f"call_timeout={timeout}s" in (slow.error or "")
    assert slow.attempts == 1 and slow.result is None
    assert fast.ok and w.ok
    assert recorder.by_key("slow")[-1].cancelled
    assert elapsed < 60, "the timeout did not bound the call"


async def test_timeout_frees_the_slot_for_later_calls() -> None:
    """After a timed-out call, its worker and limit slot serve the next calls."""

    async def hang() -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def quick(n: int) -> int:
        return n

    # 1 s: room for a loaded machine to run the quick calls in time on the real clocks.
    async with Dispatcher(max_concurrency=1, call_timeout=1.0) as dispatcher:
        dispatcher.add_function(hang, annotations=READ)
        dispatcher.add_function(quick, annotations=READ)
        results = await dispatcher.dispatch(
            [ToolCall("h1", "hang"), ToolCall("q1", "quick", {"n": 1}), ToolCall("h2", "hang")]
            + [ToolCall(f"q{i}", "quick", {"n": i}) for i in range(2, 6)]
        )
        assert dispatcher.idle and dispatcher.running == 0
    assert [r.status for r in results] == [CallStatus.TIMEOUT, CallStatus.OK, CallStatus.TIMEOUT] + [CallStatus.OK] * 4


async def test_each_call_gets_its_own_deadline() -> None:
    """A call that starts late is measured from its own start, not from the batch's."""

    async def nap(seconds: float) -> float:
        await anyio.sleep(seconds)
        return seconds

    # Ten naps of 0.3 s in a row end at 3 s, past a deadline counted from the batch's start; each has
    # 2.2 s to spare against its own, room for a loaded machine to stall the loop.
    async with Dispatcher(max_concurrency=1, call_timeout=2.5) as dispatcher:
        dispatcher.add_function(nap)
        results = await dispatcher.dispatch([ToolCall(str(i), "nap", {"seconds": 0.3}) for i in range(10)])
    assert all(r.ok for r in results), [r.error for r in results]


async def test_no_timeout_when_disabled() -> None:
    """call_timeout=None lets a call take as long as it needs."""

    async def nap() -> str:
        await anyio.sleep(0.3)
        return "done"

    async with Dispatcher(call_timeout=None) as dispatcher:
        dispatcher.add_function(nap)
        (result,) = await dispatcher.dispatch([ToolCall("1", "nap")])
    assert result.ok
