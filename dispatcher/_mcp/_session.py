"""The boundary with the MCP SDK: listing a server's tools, checking arguments, calling tools.

What the SDK or the transport raises while a call runs is described by `_failures`; here a -32000 from
a user's client is checked (a ping) before it is taken for a lost connection.

`AnswerLimit` caps the size of each message a server sends on a transport the dispatcher builds (stdio
and streamable HTTP): an answer over the cap is replaced, before the SDK's session sees it, by an
error answer to the same request, so that one call fails and the connection goes on. The SDK reads a
message whole before it hands it on (a stdio line, an HTTP body or SSE event), so the cap bounds what
reaches the session, the catalogue and the model, not the transport's own buffer for that message.
"""

from __future__ import annotations

import json
import logging
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, Self, cast

import anyio
import anyio.lowlevel
import httpx2
import pydantic_core
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import (
    CONNECTION_CLOSED,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    CancelTaskResult,
    CreateTaskResult,
    ErrorData,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    TaskMetadata,
)

from .._core._calls import CallStatus
from .._core._errors import ArgumentError, CoordinationError
from .._core._lifecycle import mark_sent, request_meta
from .._driver._clock import current_clock
from .._driver._observe import progress_reporter
from ._failures import (
    ANSWER_TOO_LARGE,
    AuthenticationRequired,
    ConnectionLost,
    TaskFailed,
    ToolUnavailableError,
    explain,
    is_transport_failure,
)
from ._progress import metered

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping
    from types import TracebackType

    from mcp.client import Transport
    from mcp.shared.dispatcher import CallOptions, ProgressFnT
    from mcp.types import RequestParamsMeta, Task, Tool

    from .._driver._clock import CallClock
    from .._driver._coordination import Lease
    from ._questions import Flight, Flights

__all__ = [
    "ANSWER_TOO_LARGE",
    "DEFAULT_MAX_ANSWER_BYTES",
    "MAX_TOOLS",
    "AnswerLimit",
    "AuthRefusals",
    "TASK_CANCEL_WAIT",
    "MCPTool",
    "TaskBound",
    "TaskCaller",
    "ToolCaller",
    "answers",
    "call_as_task",
    "capped_transport",
    "check_arguments",
    "encode_arguments",
    "list_all_tools",
    "required_arguments",
    "serves_tasks",
    "wants_task",
]

_MAX_PAGES = 1000
# The most tools one server may list.
MAX_TOOLS = 10_000

# The wait for a ping that checks a user-owned client after a -32000 (`ReconnectPolicy.ping_timeout`'s default).
_USER_CLIENT_PING_TIMEOUT = 10.0

# The default cap on one message from a server: room for a few large images or documents in one answer.
DEFAULT_MAX_ANSWER_BYTES = 16 * 2**20
# Room above the cap for the SDK's own bound on one SSE event (the event's framing around the message).
_SSE_SLACK = 64 * 1024

logger = logging.getLogger("dispatcher")


def capped_transport(
    target: StdioServerParameters | str, limit: int | None, server: str, refusals: AuthRefusals | None = None
) -> Transport:
    """The transport to a stdio command or a streamable HTTP URL, its messages capped at `limit` bytes (None: not).

    The SDK bounds the buffer of one SSE event by itself (1 MiB unless told otherwise, which would cap
    every HTTP answer sent as an event there): it is set just above `limit`, so that the cap is the one
    limit, and what the SDK refuses beyond it reads as an answer over the cap too. An HTTP transport
    notes in `refusals` each 401 or 403 its server answers.
    """
    if isinstance(target, StdioServerParameters):
        transport: Transport = stdio_client(target)
    else:
        transport = _http_transport(target, None if limit is None else limit + _SSE_SLACK, refusals)
    return transport if limit is None else AnswerLimit(transport, limit, server)


# The most of a server's WWW-Authenticate header that goes into an error.
_CHALLENGE_TEXT = 500


class AuthRefusals:
    """The last 401 or 403 a streamable HTTP server answered (the SDK reports those as a bare -32603)."""

    __slots__ = ("challenge", "status")

    def __init__(self) -> None:
        self.status: int | None = None
        self.challenge: str | None = None

    def clear(self) -> None:
        self.status = self.challenge = None

    async def on_response(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            self.status = response.status_code
            self.challenge = response.headers.get("www-authenticate")

    def error(self, server: str) -> AuthenticationRequired | None:
        """What to tell the user when the last refusal is why connecting failed (None: there was none)."""
        if self.status is None:
            return None
        what = "401 Unauthorized" if self.status == 401 else "403 Forbidden"
        if self.challenge:
            # The server's own text: shown escaped and cut short, since it is untrusted.
            asked = f"; it asked for WWW-Authenticate: {self.challenge[:_CHALLENGE_TEXT]!r}"
        else:
            asked = "; it sent no WWW-Authenticate challenge"
        return AuthenticationRequired(
            f"server {server!r} requires authentication: it answered HTTP {what}{asked}. Pass credentials "
            "with a client factory (headers or the SDK's OAuthClientProvider; see docs/mcp.md)"
        )


@asynccontextmanager
async def _http_transport(url: str, max_sse: int | None, refusals: AuthRefusals | None) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport over an HTTP client of its defaults that reports refusals."""
    hooks = {"response": [refusals.on_response]} if refusals is not None else None
    # The SDK's default HTTP client (`create_mcp_http_client`, in a private module): 30 s to connect,
    # write and wait for a connection, 300 s to read, since a server may hold a response stream open.
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0), event_hooks=hooks)
    async with http, streamable_http_client(url, http_client=http, max_sse_event_size=max_sse) as streams:
        yield streams


class AnswerLimit:
    """A transport whose incoming messages are capped at `limit` bytes of JSON (see the module docstring).

    An answer (result or error) over the cap becomes the error answer `ANSWER_TOO_LARGE` to the same
    request; a notification or a request from the server over the cap is dropped (and logged), since
    nothing waits for it.
    """

    def __init__(self, transport: Transport, limit: int, server: str) -> None:
        self._transport = transport
        self._limit = limit
        self._server = server

    # The SDK's stream protocols live in private modules: the streams are typed loosely here.
    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self._transport.__aenter__()
        return _CappedReadStream(read, self._limit, self._server), write

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._transport.__aexit__(exc_type, exc, tb)


class _CappedReadStream:
    """The transport's read stream with messages over the cap replaced or dropped; `last_context` passes through."""

    __slots__ = ("_inner", "_limit", "_server")

    def __init__(self, inner: Any, limit: int, server: str) -> None:
        self._inner = inner
        self._limit = limit
        self._server = server

    @property
    def last_context(self) -> Any:
        # The SDK's dispatcher runs each message in the context its transport captured with it.
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item: SessionMessage | Exception | None = self._check(await self._inner.receive())
            if item is not None:
                return item

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        while True:
            item: SessionMessage | Exception | None = self._check(await self._inner.__anext__())
            if item is not None:
                return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        suppressed: bool | None = await self._inner.__aexit__(exc_type, exc, tb)
        return suppressed

    def _check(self, item: SessionMessage | Exception) -> SessionMessage | Exception | None:
        if not isinstance(item, SessionMessage):
            return item
        message = item.message
        if isinstance(message, JSONRPCError) and _sse_too_large(message.error):
            # The SDK's HTTP client refused an SSE event over its bound (see `capped_transport`) with
            # -32000, which reads as a lost connection and is retried: it is this answer, too large.
            return self._too_large(item, message.id, None)
        size = len(pydantic_core.to_json(message, by_alias=True, exclude_none=True))
        if size <= self._limit:
            return item
        if isinstance(message, JSONRPCNotification | JSONRPCRequest):
            logger.warning(
                "dropped a %s message of %d bytes from server %r: over max_answer_bytes (%d)",
                message.method[:100],
                size,
                self._server,
                self._limit,
            )
            return None
        return self._too_large(item, message.id, size)

    def _too_large(self, item: SessionMessage, request: Any, size: int | None) -> SessionMessage:
        """The error answer to `request` that replaces an answer of `size` bytes (None: unknown) over the cap."""
        what = f"is {size:,} bytes" if size is not None else "is larger than that"
        error = ErrorData(
            code=ANSWER_TOO_LARGE,
            message=(
                f"the server's answer {what}, over the limit of {self._limit:,} bytes "
                "(Dispatcher.connect(max_answer_bytes=...)); it was discarded"
            ),
            data={"max_answer_bytes": self._limit, "size": size},
        )
        return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request, error=error), metadata=item.metadata)


def _sse_too_large(error: ErrorData) -> bool:
    """Whether an error is the SDK's HTTP client refusing one SSE event over its size bound."""
    text = error.message
    return error.code == CONNECTION_CLOSED and text.startswith("SSE stream failed") and "byte limit" in text


class ToolCaller(Protocol):
    """What runs a tool on a server: an entered `mcp.Client`, or a connection the dispatcher owns.

    A caller whose class sets ``marks_sent = True`` calls `_lifecycle.mark_sent` itself, at the point it
    hands the request to the SDK; for any other, `MCPTool` marks the send before calling it.
    """

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        progress_callback: ProgressFnT | None = None,
        meta: Any = None,
    ) -> CallToolResult: ...


class _ConfirmingCaller(Protocol):
    """A connection the dispatcher owns: it may wait (a reconnect) before it sends, so it confirms last."""

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        progress_callback: ProgressFnT | None = None,
        meta: dict[str, Any] | None = None,
        confirm: Callable[[], None] | None = None,
    ) -> CallToolResult: ...


async def list_all_tools(client: Client, *, refresh: bool = False) -> list[Tool]:
    """Every tool of a server, following pagination; `refresh` bypasses the client's response cache.

    Raises:
        RuntimeError: The list does not end within `_MAX_PAGES` pages, or holds more than `MAX_TOOLS`
            tools: each listing is checked against pins and rebuilds the catalogue on the event loop,
            so a server cannot make that work as large as it likes.
    """
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
        tools.extend(page.tools)
        if len(tools) > MAX_TOOLS:
            raise RuntimeError(f"the server lists more than {MAX_TOOLS:,} tools; no more are accepted from one server")
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise RuntimeError(f"the server's tool list did not end after {_MAX_PAGES} pages")


def encode_arguments(arguments: Mapping[str, Any]) -> bytes:
    """The arguments as the transports put them on the wire (UTF-8 JSON, the SDK's pydantic encoder).

    Raises:
        ArgumentError: The arguments cannot be sent: a value JSON cannot hold (NaN, infinity, an
            object of another type) or a string UTF-8 cannot encode (a lone UTF-16 surrogate, which
            is what `json.loads` makes of a model's ``"\\ud800"``).
    """
    try:
        data = pydantic_core.to_json(arguments)
    except (pydantic_core.PydanticSerializationError, ValueError, TypeError) as exc:
        raise ArgumentError(f"invalid arguments: they cannot be encoded as JSON: {exc}") from None
    # pydantic writes NaN and infinities as bare constants, which are not JSON and which servers in
    # other languages cannot parse; the strings themselves are rare enough to confirm the slow way.
    if data.find(b"NaN") >= 0 or data.find(b"Infinity") >= 0:
        try:
            json.dumps(arguments, allow_nan=False)
        except ValueError as exc:
            raise ArgumentError(f"invalid arguments: they cannot be encoded as JSON: {exc}") from None
    return data


def required_arguments(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The names a tool's input schema lists as required (its ``required`` array; only the strings count)."""
    required = schema.get("required")
    if not isinstance(required, list):
        return ()
    return tuple(key for key in required if isinstance(key, str))


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """Reject arguments that certainly cannot succeed, before the call is queued.

    The server is the authority on its own schema, and servers are lenient in ways a schema does not
    show (pydantic's lax mode takes ``"2"`` for an integer; a zod object drops keys it does not know
    although its schema says ``additionalProperties: false``). So only what no server can accept is
    rejected here: argument names that are not strings, a missing required argument, and arguments
    the transport cannot encode (see `encode_arguments`). Types, formats and extra keys are left to the
    server, whose answer the model reads.

    Raises:
        ArgumentError: What is wrong, in one line.
    """
    _check(required_arguments(schema), arguments)


def _check(required: tuple[str, ...], arguments: Mapping[str, Any]) -> None:
    """`check_arguments` with the schema's required names read beforehand (once per tool)."""
    # Plain loops: this runs for every call, and the generator expressions cost more than the checks.
    for key in arguments:
        if not isinstance(key, str):
            break
    else:
        for key in required:
            if key not in arguments:
                break
        else:
            if not _plain(arguments):
                encode_arguments(arguments)
            return
    problems = [f"argument names must be strings, got {key!r}" for key in arguments if not isinstance(key, str)]
    missing = [key for key in required if key not in arguments]
    if missing:
        problems.append("missing required " + ", ".join(repr(key) for key in missing))
    raise ArgumentError("invalid arguments: " + "; ".join(problems))


_INT_MIN = -(2**63)
_INT_MAX = 2**64


def _plain(arguments: Mapping[str, Any]) -> bool:
    """Whether any JSON encoder certainly encodes `arguments`, without encoding them.

    True for the common case only: ASCII names, and values that are ASCII strings, bools, None, 64-bit
    integers or finite floats, of exactly those types. Anything else (a nested value, a non-ASCII string
    that may hold a lone surrogate, a subclass) is left to `encode_arguments`.
    """
    for key, value in arguments.items():
        if type(key) is not str or not key.isascii():
            return False
        kind = type(value)
        if kind is str:
            if not value.isascii():
                return False
        elif kind is bool or value is None:
            continue
        elif kind is int:
            if not _INT_MIN <= value < _INT_MAX:
                return False
        elif kind is float:
            if value - value != 0.0:  # NaN or an infinity
                return False
        else:
            return False
    return True


async def answers(client: Client, wait: float) -> bool:
    """Whether a client's connection still carries an answer from its server (a ping, within `wait` seconds).

    Any answer counts, an error included (2026-07-28 servers do not serve ping), except -32000, which
    is also what the SDK raises at once, without sending anything, once its connection has closed.
    """
    try:
        session = client.session
    except RuntimeError:
        return False  # the client has exited
    with anyio.move_on_after(wait):
        try:
            await session.send_ping()
        except MCPError as exc:
            return exc.error.code != CONNECTION_CLOSED
        except Exception as exc:
            return not is_transport_failure(exc)
        return True
    return False


class MCPTool:
    """A tool on an MCP server, called through an entered `mcp.Client` or an owned connection.

    `guard`, when given, is asked before each attempt whether the tool may still be called: a call
    queued before its tool was blocked or removed fails instead of reaching the changed tool.
    """

    __slots__ = ("_required", "client", "flights", "guard", "idle_timeout", "input_schema", "name", "task")

    def __init__(
        self,
        client: ToolCaller,
        name: str,
        input_schema: Mapping[str, Any],
        *,
        guard: Callable[[], str | None] | None = None,
        task: TaskBound | None = None,
        idle_timeout: float | None = None,
        flights: Flights | None = None,
    ) -> None:
        self.client = client
        # The calls in flight on the tool's server, which its questions to the person are attributed to.
        self.flights = flights
        # Seconds without progress after which a call is cut off (`Dispatcher.connect(idle_timeout=...)`).
        self.idle_timeout = idle_timeout
        # Set when the tool's calls run as tasks on its server (`call_as_task`).
        self.task = task
        self.name = name
        self.input_schema = input_schema
        self.guard = guard
        # Read once: a listed tool's schema does not change (a changed definition is a new MCPTool).
        self._required = required_arguments(input_schema)

    def prepare(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        # The copy is checked: what is sent is what was checked, whatever the caller's mapping does next.
        prepared = dict(arguments)
        _check(self._required, prepared)
        return prepared

    async def _invoke_task(
        self, prepared: dict[str, Any], bound: TaskBound, lease: Lease | None, flight: Flight | None
    ) -> CallToolResult:
        # Polling stays inside this invocation, so the call keeps its turn (and its place under its
        # server's limit) until the task ends, with no help from the executor. An idempotency key and a
        # fleet hold's fencing token taken in `_meta` go on the request that creates the task, which is
        # what the server deduplicates and fences (polls and the result read only follow it).
        client = self.client
        keyed = request_meta()
        if lease is not None:
            prepared, fenced = lease.stamp(prepared)
            keyed = {**(keyed or {}), **(fenced or {})} or None
        if isinstance(client, Client):
            if lease is not None:
                lease.confirm()  # nothing awaits between this and the send
            mark_sent()
            return await call_as_task(client, self.name, prepared, bound, flight, meta=keyed)
        caller: TaskCaller = client  # type: ignore[assignment]  # connections the dispatcher owns
        return await caller.call_task(
            self.name, prepared, bound, confirm=lease.confirm if lease else None, flight=flight, meta=keyed
        )

    async def invoke(self, prepared: dict[str, Any], lease: Lease | None = None) -> CallToolResult:
        if self.guard is not None:
            reason = self.guard()
            if reason is not None:
                raise ToolUnavailableError(reason)
        flights = self.flights
        if flights is None:
            return await self._invoke(prepared, lease, None)
        # The call is in flight on its connection from here: a question from its server may be about it.
        with flights.flying() as flight:
            return await self._invoke(prepared, lease, flight)

    async def _invoke(self, prepared: dict[str, Any], lease: Lease | None, flight: Flight | None) -> CallToolResult:
        if self.task is not None:
            return await self._invoke_task(prepared, self.task, lease, flight)
        # Only an observed call asks for progress: a callback makes the SDK put a token on the request.
        progress = progress_reporter()
        if self.idle_timeout is not None:
            return await self._invoke_idle(prepared, self.idle_timeout, progress, lease)
        return await self._send(prepared, metered(progress), lease)

    async def _invoke_idle(
        self, prepared: dict[str, Any], idle: float, report: ProgressFnT | None, lease: Lease | None
    ) -> CallToolResult:
        """Call the tool, cut off when `idle` seconds pass with no progress from the server.

        Each report that counts sets the wait again (`_progress`: its progress grew, with a total or not).
        The wait stops while the person answers a question of the server's (`_clock`).
        """
        clock = current_clock()
        with anyio.CancelScope(deadline=anyio.current_time() + idle) as scope:
            if clock is not None:
                clock.bound(scope)

            def touch() -> None:
                if clock is not None:
                    clock.reset(scope, idle)
                else:
                    scope.deadline = anyio.current_time() + idle

            return await self._send(prepared, metered(report, touch), lease)
        raise TimeoutError(f"no progress from the server within idle_timeout={idle}s")

    async def _send(
        self, prepared: dict[str, Any], progress: ProgressFnT | None, lease: Lease | None
    ) -> CallToolResult:
        client = self.client
        # Past `mark_sent` the SDK may write the request: the call's effect is unknown until it answers. A
        # connection the dispatcher owns marks it itself (once it has a client to send on and its fleet
        # hold is confirmed); any other caller is marked here, right before the call and after the check
        # of its hold, so that a hold lost before the send leaves the call NEVER_RAN.
        owned = getattr(client, "marks_sent", False)
        keyed = request_meta()  # an idempotency key, for a server that takes it in `_meta`
        try:
            if lease is None:
                options: dict[str, Any] = {}
                if progress is not None:
                    options["progress_callback"] = progress
                if keyed is not None:
                    options["meta"] = keyed
                if not owned:
                    mark_sent()
                return await client.call_tool(self.name, prepared, **options)
            prepared, fenced = lease.stamp(prepared)
            meta = {**(keyed or {}), **(fenced or {})} or None
            try:
                if not owned:
                    lease.confirm()  # the fleet hold still holds: nothing awaits between this and the send
                    mark_sent()
                    return await client.call_tool(
                        self.name, prepared, progress_callback=progress, meta=cast("RequestParamsMeta | None", meta)
                    )
                confirming = cast("_ConfirmingCaller", client)
                return await confirming.call_tool(
                    self.name, prepared, progress_callback=progress, meta=meta, confirm=lease.confirm
                )
            except CoordinationError:
                # Not sent. Losing the hold settled the call and cancelled it: let that land here.
                await anyio.lowlevel.checkpoint()
                raise
        except MCPError as exc:
            # A connection the dispatcher owns has checked this already; a user's client is checked here.
            if (
                exc.error.code == CONNECTION_CLOSED
                and isinstance(client, Client)
                and not await answers(client, _USER_CLIENT_PING_TIMEOUT)
            ):
                raise ConnectionLost(exc.error.message) from exc
            raise


# Task-augmented calls ----------------------------------------------------------------------------
#
# The 2025-11-25 revision lets a client make `tools/call` a task: the server answers at once with a
# `CreateTaskResult`, the client polls `tasks/get` at the interval the server asks for and reads the
# outcome with `tasks/result`; `tasks/cancel` cancels it. The SDK (2.3) carries the types but leaves
# `tasks/*` out of its 2025-11-25 result surface on purpose and checks every `tools/call` answer as a
# `CallToolResult`, so the request that creates a task goes through the session's raw request path
# (`_send_raw`); `tasks/get`, `tasks/result` and `tasks/cancel` go through its public `send_request`.

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
    """Send a request through the session without the SDK's check of its answer (see the section comment)."""
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
