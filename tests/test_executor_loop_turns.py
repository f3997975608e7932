"""The executor's calls that never wait, and a long batch's submission, let the loop run, under a virtual clock too.

Under trio a call's task carries on with the calls it takes for a short window before letting the loop run
(`_execution._FOLLOW`), and a long batch is submitted in slices of a few milliseconds (`_submission._SLICE`).
trio's MockClock stands still while tasks run, so a window of time alone never ended there: one task ran a
whole batch, or submitted one, while nothing else could run (a caller's cancel, a watcher, a person).
"""

from __future__ import annotations

from typing import Annotated

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations
from pydantic import AfterValidator

from dispatcher import CallStatus, Dispatcher, ToolCall
from dispatcher._driver._execution import _FOLLOW_CALLS
from dispatcher._driver._submission import _SLICE_CHECK, _SLICE_READINGS

pytestmark = pytest.mark.anyio

_CALLS = 3000
# The arguments checked so far (`_count` checks one, as pydantic validates a call's arguments at submission).
_checked: list[int] = []


def _count(x: int) -> int:
    _checked.append(x)
    return x


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_a_batch_of_calls_that_never_wait_lets_another_task_run_between_a_few_calls() -> None:
    """Another task runs at least once every `_FOLLOW_CALLS` calls (or so), and each call gets its result in order."""
    ran = 0
    turns: list[int] = []
    async with Dispatcher(max_concurrency=1) as dispatcher:

        async def quick() -> int:
            nonlocal ran
            ran += 1
            return ran

        dispatcher.add_function(quick, annotations=ToolAnnotations(read_only_hint=True))

        async def other() -> None:
            while ran < _CALLS:
                turns.append(ran)
                await anyio.lowlevel.checkpoint()

        calls = [ToolCall(f"c{i}", "quick", {}) for i in range(_CALLS)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            results = await dispatcher.dispatch(calls)
    assert [result.call_id for result in results] == [call.id for call in calls]
    assert [result.status for result in results] == [CallStatus.OK] * _CALLS
    gaps = [later - earlier for earlier, later in zip(turns, [*turns[1:], _CALLS], strict=True)]
    assert len(turns) > _CALLS // (2 * _FOLLOW_CALLS + 2), len(turns)
    assert max(gaps) <= 2 * _FOLLOW_CALLS + 2, max(gaps)


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_a_long_batch_s_submission_lets_another_task_run_every_slice() -> None:
    """While a batch's arguments are checked, another task runs at least once every two slices' calls."""
    _checked.clear()
    turns: list[int] = []
    async with Dispatcher(max_concurrency=1) as dispatcher:

        async def quick(x: Annotated[int, AfterValidator(_count)]) -> int:
            return x

        dispatcher.add_function(quick, annotations=ToolAnnotations(read_only_hint=True))

        async def other() -> None:
            while len(_checked) < _CALLS:
                turns.append(len(_checked))
                await anyio.lowlevel.checkpoint()

        calls = [ToolCall(f"c{i}", "quick", {"x": i}) for i in range(_CALLS)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            results = await dispatcher.dispatch(calls)
    assert [result.call_id for result in results] == [call.id for call in calls]
    assert [result.status for result in results] == [CallStatus.OK] * _CALLS
    assert turns, "the submission never let the loop run"
    gaps = [later - earlier for earlier, later in zip(turns, [*turns[1:], _CALLS], strict=True)]
    # Two slices at most: trio may run the submitting task first in one loop turn and last in the one before.
    assert max(gaps) <= 2 * _SLICE_CHECK * _SLICE_READINGS, max(gaps)
