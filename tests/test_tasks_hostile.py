"""Task-augmented calls against a scripted server that misbehaves: polling bounds, endless tasks, silent cancels.

On trio's virtual clock, so minutes of a task take no time and the times are exact.
"""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher import CallStatus, Dispatcher, Effect, ToolCall

from .task_server import TaskScript

pytestmark = [pytest.mark.anyio, pytest.mark.backends("trio-mockclock")]


async def _run(script: TaskScript, **connect: Any) -> Any:
    async with Dispatcher(call_timeout=None) as dispatcher:
        await dispatcher.connect("scripted", script.client, trusted=True, **connect)
        [result] = await dispatcher.dispatch([ToolCall("1", "slow", {})])
    return result


async def test_polls_at_the_interval_the_server_asks() -> None:
    """A task asking for polls every 250 ms is polled every 250 ms, and its tasks/result is the call's result."""
    script = TaskScript(poll_interval=250, finish_after=4)
    result = await _run(script)
    assert result.status is CallStatus.OK, result.error
    assert "done after 4 polls" in str(result.result.content)
    start = script.times("tools/call")[0]
    assert [round(at - start, 3) for at in script.times("tasks/get")] == [0.25, 0.5, 0.75, 1.0]


async def test_a_zero_poll_interval_cannot_make_the_client_spin() -> None:
    """pollInterval 0 is raised to 50 ms: a task working for 1 s costs 20 polls, not thousands."""
    script = TaskScript(poll_interval=0)
    result = await _run(script, task_timeout=1.0)
    assert result.status is CallStatus.TIMEOUT
    assert len(script.times("tasks/get")) <= 20


async def test_a_huge_poll_interval_cannot_stall_the_client() -> None:
    """pollInterval of an hour is cut to 5 s: a task done at its first poll ends 5 s after it began."""
    script = TaskScript(poll_interval=3_600_000, finish_after=1)
    result = await _run(script)
    assert result.status is CallStatus.OK
    assert script.times("tasks/get")[0] - script.times("tools/call")[0] == pytest.approx(5.0)


async def test_a_task_that_works_forever_is_cut_off_at_task_timeout() -> None:
    """A task that never leaves "working" ends TIMEOUT at task_timeout, cancelled on the server."""
    script = TaskScript(poll_interval=1000)
    result = await _run(script, task_timeout=30)
    assert result.status is CallStatus.TIMEOUT
    assert result.finished_at - result.started_at == pytest.approx(30, abs=0.1)
    assert len(script.times("tasks/cancel")) == 1


async def test_a_silent_cancel_ends_with_an_unknown_outcome_after_the_wait() -> None:
    """A server that never answers tasks/cancel: the call ends FAILED, outcome unknown, 5 s after task_timeout."""
    script = TaskScript(confirm_cancel=False)
    result = await _run(script, task_timeout=10)
    assert result.status is CallStatus.FAILED
    assert result.error is not None and "its outcome is unknown" in result.error
    assert result.finished_at - result.started_at == pytest.approx(15, abs=0.1)


async def test_a_long_status_message_is_cut_short() -> None:
    """A task the server cancels by itself ends FAILED with its status message, at most 300 characters of it."""
    script = TaskScript(status_message="x" * 10_000)
    script_answer = script._answer

    def cancelled_at_first_poll(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        answer = script_answer(method, params)
        if method == "tasks/get" and answer is not None:
            answer["status"] = "cancelled"
        return answer

    script._answer = cancelled_at_first_poll  # type: ignore[method-assign]
    result = await _run(script)
    assert result.status is CallStatus.FAILED
    assert result.error is not None and "the server cancelled task 't-1'" in result.error
    assert "x" * 300 in result.error and "x" * 301 not in result.error


async def test_task_support_buys_an_untrusted_server_nothing() -> None:
    """An untrusted server's task tool is scheduled as unannotated: exclusive and never retried, task or not."""
    script = TaskScript(finish_after=1)
    async with Dispatcher(call_timeout=None) as dispatcher:
        [entry] = await dispatcher.connect("scripted", script.client, trusted=False)
        [result] = await dispatcher.dispatch([ToolCall("1", "slow", {})])
    assert entry.exclusive and not entry.idempotent
    assert result.status is CallStatus.OK
    assert script.times("tasks/result")  # it still ran as the task the tool requires


async def test_a_task_whose_state_stops_changing_is_cut_off_at_idle_timeout() -> None:
    """A task polled as "working" with the same message for idle_timeout ends TIMEOUT, cancelled on the server."""
    script = TaskScript(poll_interval=1000)
    result = await _run(script, idle_timeout=3)
    assert result.status is CallStatus.TIMEOUT
    assert result.error is not None and "reported no change within idle_timeout=3s" in result.error
    assert result.started_at is not None and result.finished_at - result.started_at == pytest.approx(3, abs=0.1)
    assert len(script.times("tasks/cancel")) == 1


async def test_a_task_that_reports_each_step_outlives_its_idle_timeout() -> None:
    """The oracle: the same task reporting a new status message at each poll runs past idle_timeout to its result."""
    script = TaskScript(poll_interval=1000, finish_after=10, reports_steps=True)
    result = await _run(script, idle_timeout=3)
    assert result.status is CallStatus.OK, result.error
    assert script.times("tasks/cancel") == []


async def test_a_task_cut_off_from_outside_without_a_confirmed_cancel_reads_unknown() -> None:
    """call_timeout ends a task whose server never confirms tasks/cancel: TIMEOUT, its effect UNKNOWN."""
    script = TaskScript(confirm_cancel=False)
    async with Dispatcher(call_timeout=20) as dispatcher:
        await dispatcher.connect("scripted", script.client, trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", "slow", {})])
    assert result.status is CallStatus.TIMEOUT
    assert result.effect is Effect.UNKNOWN
    assert len(script.times("tasks/cancel")) == 1


async def test_a_failed_poll_with_an_unconfirmed_cancel_says_the_outcome_is_unknown() -> None:
    """tasks/get answered with an error, tasks/cancel never answered: FAILED, saying the task's outcome is unknown."""
    script = TaskScript(confirm_cancel=False)
    script_answer = script._answer

    def refusing_polls(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        if method == "tasks/get":
            raise LookupError("no such task")
        return script_answer(method, params)

    script._answer = refusing_polls  # type: ignore[method-assign]
    result = await _run(script)
    assert result.status is CallStatus.FAILED
    assert result.error is not None and "following task 't-1' failed" in result.error
    assert "its outcome is unknown" in result.error and result.effect is Effect.UNKNOWN
