"""The boundary with the MCP SDK: listing a server's tools, checking arguments, calling tools.

What the SDK or the transport raises while a call runs is described by `_failures`; here a -32000 from
a user's client is checked (a ping) before it is taken for a lost connection. The transports the
dispatcher builds are `_transport`'s; calls run as tasks on their server are `_tasks`'.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio
import anyio.lowlevel
import pydantic_core
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, CallToolResult

from .._core._errors import ArgumentError, CoordinationError
from .._core._lifecycle import mark_sent, request_meta
from .._driver._clock import current_clock
from .._driver._observe import progress_reporter
from ._failures import ConnectionLost, ToolUnavailableError, is_transport_failure
from ._progress import metered
from ._tasks import TaskBound, TaskCaller, call_as_task

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from mcp.shared.dispatcher import ProgressFnT
    from mcp.types import RequestParamsMeta, Tool

    from .._driver._coordination import Lease
    from ._questions import Flight, Flights

__all__ = [
    "MAX_TOOLS",
    "MCPTool",
    "ToolCaller",
    "answers",
    "check_arguments",
    "encode_arguments",
    "list_all_tools",
    "required_arguments",
]

_MAX_PAGES = 1000
# The most tools one server may list.
MAX_TOOLS = 10_000

# The wait for a ping that checks a user-owned client after a -32000 (`ReconnectPolicy.ping_timeout`'s default).
_USER_CLIENT_PING_TIMEOUT = 10.0


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
