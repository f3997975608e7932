"""The real-clock probe sends a timed-out call again, and still fails a dispatcher that never answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, ToolCall

from .harness import dispatch_until_answered

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends("trio-mockclock"),
]

READ_ONLY = ToolAnnotations(read_only_hint=True)


def stuck_counting(tries: list[None]) -> Callable[[], Awaitable[str]]:
    """A tool that never answers and notes each time it is called in `tries`."""

    async def stuck() -> str:
        tries.append(None)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    return stuck


async def test_a_call_that_timed_out_once_is_answered_in_the_next_round(anyio_backend: Any) -> None:
    """A call stalled past call_timeout once ends OK in the second round, noted in the trace."""
    stalls = {"slow": 1}

    async def lookup(key: str) -> str:
        if stalls.get(key, 0):
            stalls[key] -= 1
            await anyio.sleep_forever()
        return key

    trace: list[str] = []
    async with Dispatcher(call_timeout=0.25, retry=None) as d:
        d.add_function(lookup, annotations=READ_ONLY)
        calls = [ToolCall("a", "lookup", {"key": "fast"}), ToolCall("b", "lookup", {"key": "slow"})]
        results, problems = await dispatch_until_answered(d, calls, rounds=10, trace=trace)
    assert problems == []
    assert [(r.call_id, r.status) for r in results] == [("a", CallStatus.OK), ("b", CallStatus.OK)]
    assert trace == ["round 2: b again after a timeout"]


async def test_a_dispatcher_that_never_answers_still_fails_the_probe(anyio_backend: Any) -> None:
    """A call that times out in every round ends TIMEOUT after the last one (the rounds have teeth)."""
    tries: list[None] = []
    async with Dispatcher(call_timeout=0.25, retry=None) as d:
        d.add_function(stuck_counting(tries), name="stuck", annotations=READ_ONLY)
        [result], problems = await dispatch_until_answered(d, [ToolCall("s", "stuck")], rounds=3)
    assert problems == []
    assert result.status is CallStatus.TIMEOUT
    assert len(tries) == 3


async def test_one_round_is_one_plain_dispatch(anyio_backend: Any) -> None:
    """With rounds=1 (the virtual clock's probe) a timeout is final and nothing is sent again."""
    tries: list[None] = []
    trace: list[str] = []
    async with Dispatcher(call_timeout=0.25, retry=None) as d:
        d.add_function(stuck_counting(tries), name="stuck", annotations=READ_ONLY)
        [result], _ = await dispatch_until_answered(d, [ToolCall("s", "stuck")], rounds=1, trace=trace)
    assert result.status is CallStatus.TIMEOUT and len(tries) == 1 and trace == []
