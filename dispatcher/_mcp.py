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
from typing import TYPE_CHECKING, Any, Protocol, Self

import anyio
import pydantic_core
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED, ErrorData, JSONRPCError, JSONRPCNotification, JSONRPCRequest

from ._catalog import ArgumentError
from ._failures import ANSWER_TOO_LARGE, ConnectionLost, ToolUnavailableError, is_transport_failure
from ._lifecycle import mark_sent, request_meta

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import TracebackType

    from mcp.client import Transport
    from mcp.types import CallToolResult, Tool

__all__ = [
    "ANSWER_TOO_LARGE",
    "DEFAULT_MAX_ANSWER_BYTES",
    "MAX_TOOLS",
    "AnswerLimit",
    "MCPTool",
    "ToolCaller",
    "answers",
    "capped_transport",
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

# The default cap on one message from a server: room for a few large images or documents in one answer.
DEFAULT_MAX_ANSWER_BYTES = 16 * 2**20
# Room above the cap for the SDK's own bound on one SSE event (the event's framing around the message).
_SSE_SLACK = 64 * 1024

logger = logging.getLogger("dispatcher")


def capped_transport(target: StdioServerParameters | str, limit: int | None, server: str) -> Transport:
    """The transport to a stdio command or a streamable HTTP URL, its messages capped at `limit` bytes (None: not).

    The SDK bounds the buffer of one SSE event by itself (1 MiB unless told otherwise, which would cap
    every HTTP answer sent as an event there): it is set just above `limit`, so that the cap is the one
    limit, and what the SDK refuses beyond it reads as an answer over the cap too.
    """
    if isinstance(target, StdioServerParameters):
        transport: Transport = stdio_client(target)
    else:
        transport = streamable_http_client(target, max_sse_event_size=None if limit is None else limit + _SSE_SLACK)
    return transport if limit is None else AnswerLimit(transport, limit, server)


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
        self, name: str, arguments: dict[str, Any] | None = None, *, meta: Any = None
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

    __slots__ = ("_required", "client", "guard", "input_schema", "name")

    def __init__(
        self,
        client: ToolCaller,
        name: str,
        input_schema: Mapping[str, Any],
        *,
        guard: Callable[[], str | None] | None = None,
    ) -> None:
        self.client = client
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

    async def invoke(self, prepared: dict[str, Any]) -> CallToolResult:
        if self.guard is not None:
            reason = self.guard()
            if reason is not None:
                raise ToolUnavailableError(reason)
        client = self.client
        if not getattr(client, "marks_sent", False):
            # Past this point the SDK may write the request: the call's effect is unknown until it answers.
            # (A connection the dispatcher owns marks it itself, once it has a client to send on.)
            mark_sent()
        meta = request_meta()  # an idempotency key, for a server that takes it in `_meta`
        try:
            if meta is not None:
                return await client.call_tool(self.name, prepared, meta=meta)
            return await client.call_tool(self.name, prepared)
        except MCPError as exc:
            # A connection the dispatcher owns has checked this already; a user's client is checked here.
            if (
                exc.error.code == CONNECTION_CLOSED
                and isinstance(client, Client)
                and not await answers(client, _USER_CLIENT_PING_TIMEOUT)
            ):
                raise ConnectionLost(exc.error.message) from exc
            raise
