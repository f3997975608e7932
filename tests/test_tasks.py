"""Task-augmented tool calls (MCP 2025-11-25 tasks) against server-everything's `simulate-research-query`.

The tool declares `execution.taskSupport: "required"` and the server advertises task-augmented
`tools/call`: the dispatcher makes the call a task, polls it, and returns its final result; cancelling
the call cancels the task on the server. These run on both backends (the stdio transport and the
task calls are anyio throughout).
"""

from __future__ import annotations

import itertools
import math

import anyio
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, ConfigurationError, Dispatcher, ToolCall, ToolResult

from .everything import WireLog, everything, logged_everything

pytestmark = [pytest.mark.reference_servers, pytest.mark.anyio]

RESEARCH = "simulate-research-query"
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def _text(result: ToolResult) -> str:
    assert result.result is not None, result.error
    return "\n".join(getattr(block, "text", "") for block in result.result.content)


async def test_task_tool_returns_its_final_result() -> None:
    """A tool that requires tasks is called as a task, polled with tasks/get; its tasks/result is the call's result."""
    log = WireLog()
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("everything", logged_everything(log), trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", RESEARCH, {"topic": "octopus cognition"})])
    assert result.status is CallStatus.OK, result.error
    assert "octopus cognition" in _text(result)
    create = log.first("tools/call")
    assert create.params is not None and create.params["name"] == RESEARCH and "task" in create.params
    methods = log.methods()
    assert methods.index("tools/call") < methods.index("tasks/get") < methods.index("tasks/result")
    assert "tasks/cancel" not in methods
    # Polled at the interval the server asked for (server-everything asks for 1 s; its task takes about 4 s).
    polls = [entry.at for entry in log.sent if entry.method == "tasks/get"]
    asked = next(m["result"]["task"].get("pollInterval") for _, m in log.received if m.get("id") == create.id)
    wait = 1.0 if asked is None else asked / 1000
    assert all(later - earlier >= wait * 0.9 for earlier, later in itertools.pairwise([create.at, *polls]))


@pytest.mark.parametrize("how", ["caller", "close"])
async def test_cancelling_the_call_cancels_the_task_on_the_server(how: str) -> None:
    """Cancelled by its caller or by the dispatcher closing, the call sends tasks/cancel within 100 ms, confirmed."""
    log = WireLog()
    cancelled_at = math.nan
    outcome: list[ToolResult] = []
    async with anyio.create_task_group() as tg:
        async with Dispatcher() as dispatcher:
            await dispatcher.connect("everything", logged_everything(log), trusted=True)
            scope = anyio.CancelScope()
            ended = anyio.Event()

            async def run() -> None:
                try:
                    with scope:
                        outcome.extend(await dispatcher.dispatch([ToolCall("1", RESEARCH, {"topic": "tides"})]))
                finally:
                    ended.set()

            tg.start_soon(run)
            await log.event("tasks/get").wait()
            cancelled_at = anyio.current_time()
            if how == "caller":
                scope.cancel()
                await ended.wait()
            # Leaving the block closes the dispatcher with the call in flight ("close").
    if how == "close":
        assert [r.status for r in outcome] == [CallStatus.CANCELLED], outcome
    cancel = log.first("tasks/cancel")
    assert cancel.at - cancelled_at < 0.1, f"tasks/cancel sent {cancel.at - cancelled_at:.3f}s after the cancellation"
    create = log.first("tools/call")
    task_id = next(m["result"]["task"]["taskId"] for _, m in log.received if m.get("id") == create.id)
    assert cancel.params == {"taskId": task_id}
    answer = log.answer_to(cancel.id)
    assert answer is not None and answer["result"]["status"] == "cancelled", answer


async def test_task_timeout_cancels_the_task_and_ends_timeout() -> None:
    """A task still working at `task_timeout` is cancelled on the server; the call ends TIMEOUT saying so."""
    log = WireLog()
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("everything", logged_everything(log), trusted=True, task_timeout=0.5)
        [result] = await dispatcher.dispatch([ToolCall("1", RESEARCH, {"topic": "tides"})])
    assert result.status is CallStatus.TIMEOUT, result.error
    assert (
        result.error is not None and "task_timeout=0.5s" in result.error and "cancelled on the server" in result.error
    )
    create = log.first("tools/call")
    assert create.params is not None and create.params["task"] == {"ttl": 500}
    assert result.attempts == 1  # a task cut off at its bound is not repeated


async def test_unconfirmed_cancellation_reports_an_unknown_outcome() -> None:
    """A server that refuses tasks/cancel leaves the task's outcome unknown, and the result says so."""
    log = WireLog(refuse={"tasks/cancel"})
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("everything", logged_everything(log), trusted=True, task_timeout=0.5)
        [result] = await dispatcher.dispatch([ToolCall("1", RESEARCH, {"topic": "tides"})])
    assert result.status is CallStatus.FAILED, result.error
    assert result.error is not None and "outcome is unknown" in result.error
    assert "tasks/cancel" in log.methods()


async def test_a_write_task_keeps_its_exclusive_turn() -> None:
    """While the write task is polled, the read after it waits: it starts only once the task has ended."""
    log = WireLog()
    async with Dispatcher() as dispatcher:
        tools = await dispatcher.connect("everything", logged_everything(log), trusted=True)
        assert {entry.name: entry for entry in tools}[RESEARCH].exclusive
        results = await dispatcher.dispatch(
            [ToolCall("1", RESEARCH, {"topic": "tides"}), ToolCall("2", "echo", {"message": "after"})]
        )
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK], [r.error for r in results]
    # The echo was not sent before the task's result was read.
    methods = log.methods()
    echo = next(
        i
        for i, entry in enumerate(log.sent)
        if entry.method == "tools/call" and entry.params and entry.params["name"] == "echo"
    )
    assert methods.index("tasks/result") < echo
    assert results[1].started_at is not None and results[1].started_at >= results[0].finished_at


@pytest.mark.slow
async def test_a_read_task_counts_against_its_server_limit() -> None:
    """Declared a read by the user, two task calls on a server limited to one run one after the other."""
    log = WireLog()
    async with Dispatcher() as dispatcher:
        tools = await dispatcher.connect(
            "everything", logged_everything(log), trusted=True, max_concurrency=1, overrides={RESEARCH: READ}
        )
        assert {entry.name: entry for entry in tools}[RESEARCH].concurrent
        results = await dispatcher.dispatch(
            [ToolCall("1", RESEARCH, {"topic": "tides"}), ToolCall("2", RESEARCH, {"topic": "winds"})]
        )
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK], [r.error for r in results]
    creates = [i for i, entry in enumerate(log.sent) if entry.method == "tools/call"]
    first_result = log.methods().index("tasks/result")
    assert first_result < creates[1], "the second task was created while the first still held the server's one slot"


async def test_a_read_task_without_a_limit_overlaps() -> None:
    """The oracle of the limit test: with no limit, the same two read tasks are created before either ends."""
    log = WireLog()
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("everything", logged_everything(log), trusted=True, overrides={RESEARCH: READ})
        results = await dispatcher.dispatch(
            [ToolCall("1", RESEARCH, {"topic": "tides"}), ToolCall("2", RESEARCH, {"topic": "winds"})]
        )
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK]
    creates = [i for i, entry in enumerate(log.sent) if entry.method == "tools/call"]
    assert log.methods().index("tasks/result") > creates[1]


async def test_task_timeout_is_checked() -> None:
    """`task_timeout` must be a positive number no larger than the dispatcher's call_timeout."""
    async with Dispatcher(call_timeout=60) as dispatcher:
        with pytest.raises(ConfigurationError, match="exceeds the dispatcher's call_timeout"):
            await dispatcher.connect("everything", everything(), task_timeout=600)
        for bad in (0, -1.0, math.inf, True, "10"):
            with pytest.raises(ConfigurationError, match="task_timeout must be a positive number"):
                await dispatcher.connect("everything", everything(), task_timeout=bad)  # type: ignore[arg-type]
    async with Dispatcher(call_timeout=None) as dispatcher:
        await dispatcher.connect("everything", everything(), task_timeout=600)
