"""Task-augmented tool calls: create the task, poll it within its bounds, read its outcome, cancel it.

The 2025-11-25 revision lets a client make `tools/call` a task: the server answers at once with a
`CreateTaskResult`, the client polls `tasks/get` at the interval the server asks for and reads the
outcome with `tasks/result`; `tasks/cancel` cancels it. The SDK (2.3) carries the types but leaves
`tasks/*` out of its 2025-11-25 result surface on purpose and checks every `tools/call` answer as a
`CallToolResult`, so the request that creates a task goes through the session's raw request path
(`_send_raw`); `tasks/get`, `tasks/result` and `tasks/cancel` go through its public `send_request`.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    CancelTaskResult,
    CreateTaskResult,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    TaskMetadata,
)

from .._core._calls import CallStatus
from .._driver._clock import current_clock
from ._failures import TaskFailed, explain, is_transport_failure

if TYPE_CHECKING:
    from collections.abc import Callable

    from mcp import Client
    from mcp.shared.dispatcher import CallOptions
    from mcp.types import RequestParamsMeta, Task, Tool

    from .._driver._clock import CallClock
    from ._questions import Flight

__all__ = ["TASK_CANCEL_WAIT", "TaskBound", "TaskCaller", "call_as_task", "serves_tasks", "wants_task"]

logger = logging.getLogger("dispatcher")


# The poll interval a server may ask for is kept within these bounds (seconds): a hostile server cannot
# make the client spin (0 ms) or stall (an hour between polls of a task that has finished).
_POLL_MIN = 0.05
_POLL_MAX = 5.0
_POLL_DEFAULT = 1.0
# How long a cancelled task waits for the server to confirm `tasks/cancel` before its outcome is unknown.
TASK_CANCEL_WAIT = 5.0
# The most of a server's status message that goes into an error.
_STATUS_TEXT = 300


class TaskBound:
    """How a tool's calls run as tasks on its server.

    `timeout` bounds the whole task, `idle` the time between two changes of its polled state (seconds, or None).
    """

    __slots__ = ("idle", "timeout")

    def __init__(self, timeout: float | None, idle: float | None = None) -> None:
        self.timeout = timeout
        self.idle = idle


class TaskCaller(Protocol):
    """A connection the dispatcher owns that can run a call as a task (see `call_as_task`)."""

    async def call_task(
        self,
        name: str,
        arguments: dict[str, Any],
        bound: TaskBound,
        *,
        confirm: Callable[[], None] | None = None,
        flight: Flight | None = None,
        meta: dict[str, Any] | None = None,
    ) -> CallToolResult: ...


def serves_tasks(client: Client) -> bool:
    """Whether a connected server advertises task-augmented `tools/call` (its 2025-11-25 `tasks` capability)."""
    try:
        capabilities = client.session.server_capabilities
    except (RuntimeError, AttributeError):  # not connected, or a client of the user's that is no `mcp.Client`
        return False
    tasks = getattr(capabilities, "tasks", None) if capabilities is not None else None
    requests = tasks.requests if tasks is not None else None
    tools = requests.tools if requests is not None else None
    return tools is not None and tools.call is not None


def wants_task(tool: Tool) -> bool:
    """Whether a tool requires or allows task-augmented calls (`execution.taskSupport`)."""
    execution = tool.execution
    return execution is not None and execution.task_support in ("required", "optional")


def _poll_wait(task: Task) -> float:
    interval = task.poll_interval
    if interval is None:
        return _POLL_DEFAULT
    return min(max(interval / 1000, _POLL_MIN), _POLL_MAX)


def _status_text(task: Task) -> str:
    text = task.status_message
    return f": {text[:_STATUS_TEXT]!r}" if text else ""


async def _send_raw(client: Client, request: CallToolRequest) -> dict[str, Any]:
    """Send a request through the session without the SDK's check of its answer (see the module docstring)."""
    session = client.session
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    opts: CallOptions = {}
    # The SDK has no public raw request: its own send_request stamps and sends exactly so.
    session._stamp(data, opts)
    raw: dict[str, Any] = await session._dispatcher.send_raw_request(data["method"], data.get("params"), opts)
    return raw


class _Followed:
    """What a task's follower has learned: the last state the server reported, and whether it is final."""

    __slots__ = ("final", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.final = False


async def call_as_task(
    client: Client,
    name: str,
    arguments: dict[str, Any],
    bound: TaskBound,
    flight: Flight | None = None,
    *,
    meta: dict[str, Any] | None = None,
) -> CallToolResult:
    """Call a tool as a task and return its final result; cancelling this cancels the task on the server.

    A server that answers with an ordinary result (allowed for a tool whose task support is optional)
    has that result returned. `bound.timeout`, when set, bounds the whole task (and is the task's
    requested TTL); `bound.idle`, when set, bounds the time between two changes of the task's state
    (its status or status message, as polled). When either passes the task is cancelled and this raises
    `TaskFailed` (TIMEOUT if the server confirmed the cancellation, FAILED saying the outcome is unknown
    if it did not). Both stop while the person answers a question of the task's (`_clock`). Cancelled
    from outside (its caller, the call timeout, the dispatcher closing), this sends `tasks/cancel` at
    once, waits up to `TASK_CANCEL_WAIT` seconds for the confirmation, logs a warning if none comes,
    and lets the cancellation go on (the call's effect reads unknown). A failure of the polling itself
    (an error answer to `tasks/get`, a lost connection) cancels the task the same way; unconfirmed, it
    becomes a `TaskFailed` saying that the outcome is unknown. `flight`, the call's entry among its
    connection's calls in flight, learns the task's id, by which the task's questions name it.

    Raises:
        TaskFailed: The task ended cancelled by the server, one of its bounds passed, or following
            it failed and its cancellation was not confirmed.
        MCPError: The server refused the task or answered `tasks/*` with an error.
    """
    timeout = bound.timeout
    params = CallToolRequestParams(
        name=name,
        arguments=arguments,
        task=TaskMetadata(ttl=None if timeout is None else math.ceil(timeout * 1000)),
        _meta=cast("RequestParamsMeta | None", meta),
    )
    raw = await _send_raw(client, CallToolRequest(params=params))
    if "task" not in raw:
        return CallToolResult.model_validate(raw, by_name=False)
    followed = _Followed(CreateTaskResult.model_validate(raw, by_name=False).task)
    task_id = followed.task.task_id[:100]
    if flight is not None:
        flight.task_id = followed.task.task_id
    clock = current_clock()
    idle = bound.idle
    try:
        with anyio.move_on_after(math.inf if timeout is None else timeout) as whole:
            if clock is not None:
                clock.bound(whole)
            with anyio.move_on_after(math.inf if idle is None else idle) as quiet:
                if clock is not None:
                    clock.bound(quiet)
                return await _follow(client, followed, quiet, idle, clock)
        # One of the two bounds passed (an outer cancellation would have been raised).
        if whole.cancelled_caught:
            what = f"did not finish within task_timeout={timeout}s"
        else:
            what = f"reported no change within idle_timeout={idle}s"
    except Exception as exc:
        if followed.final or _connection_gone(exc):
            raise  # the outcome is the server's; or a lost connection, which the caller reports as such
        # Following it failed (an error answer to tasks/get, a lost connection): the task may run on.
        with anyio.CancelScope(shield=True):
            confirmed = await _cancel_task(client, followed)
        if confirmed:
            raise
        raise TaskFailed(
            f"following task {task_id!r} failed ({explain(exc)}) and the server did not confirm its "
            f"cancellation within {TASK_CANCEL_WAIT}s: its outcome is unknown"
        ) from exc
    except BaseException:
        if not followed.final:
            with anyio.CancelScope(shield=True):
                confirmed = await _cancel_task(client, followed)
            if not confirmed:
                logger.warning(
                    "task %r of tool %r was abandoned and the server did not confirm its cancellation: "
                    "its outcome is unknown",
                    task_id,
                    name[:100],
                )
        raise
    if await _cancel_task(client, followed):
        raise TaskFailed(f"task {task_id!r} {what}; it was cancelled on the server", CallStatus.TIMEOUT)
    raise TaskFailed(
        f"task {task_id!r} {what} and the server did not confirm its cancellation within {TASK_CANCEL_WAIT}s "
        f"(last status {followed.task.status!r}): its outcome is unknown"
    )


async def _follow(
    client: Client, followed: _Followed, quiet: anyio.CancelScope, idle: float | None, clock: CallClock | None
) -> CallToolResult:
    """Poll a task until it leaves "working", then read its outcome (`tasks/result` waits for input_required).

    Each poll that finds the task's status or status message changed gives `quiet` `idle` seconds again.
    """
    session = client.session
    task_id = followed.task.task_id
    while followed.task.status == "working":
        await anyio.sleep(_poll_wait(followed.task))
        before = (followed.task.status, followed.task.status_message)
        followed.task = await session.send_request(
            GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)), GetTaskResult
        )
        if idle is not None and (followed.task.status, followed.task.status_message) != before:
            if clock is not None:
                clock.reset(quiet, idle)
            else:
                quiet.deadline = anyio.current_time() + idle
    status = followed.task.status
    if status == "cancelled":
        followed.final = True
        raise TaskFailed(f"the server cancelled task {task_id[:100]!r}{_status_text(followed.task)}")
    if status != "input_required":
        followed.final = True  # completed or failed: the outcome is the server's to give
    # The outcome may take long to come (input_required: a question to the person): no idle bound on it.
    if clock is not None:
        clock.reset(quiet, math.inf)
    else:
        quiet.deadline = math.inf
    result = await session.send_request(
        GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task_id)), CallToolResult
    )
    followed.final = True
    return result


def _connection_gone(exc: BaseException) -> bool:
    return is_transport_failure(exc) or (isinstance(exc, MCPError) and exc.error.code == CONNECTION_CLOSED)


async def _cancel_task(client: Client, followed: _Followed) -> bool:
    """Send `tasks/cancel`; whether the server confirmed, within `TASK_CANCEL_WAIT`, that the task is cancelled."""
    request = CancelTaskRequest(params=CancelTaskRequestParams(task_id=followed.task.task_id))
    with anyio.move_on_after(TASK_CANCEL_WAIT):
        try:
            answer = await client.session.send_request(request, CancelTaskResult)
        except Exception as exc:
            logger.debug("tasks/cancel failed: %s", exc)
            return False
        followed.task = answer
        return answer.status == "cancelled"
    return False
