"""The boundary with the MCP SDK: listing a server's tools, calling them, translating failures.

Everything the SDK or the transport can raise while a call runs is turned here into a status and a
readable message. Cancellation is not an exception of this kind and always propagates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from ._calls import CallStatus
from ._catalog import ArgumentError

if TYPE_CHECKING:
    from collections.abc import Callable

    from mcp import Client
    from mcp.types import CallToolResult, Tool

__all__ = [
    "MCPTool",
    "ToolCaller",
    "ToolUnavailableError",
    "check_arguments",
    "describe_failure",
    "is_connection_loss",
    "list_all_tools",
]

# JSON-RPC and SDK error codes.
CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

_MAX_PAGES = 1000

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (Mapping,),
    "null": (type(None),),
}


class ToolUnavailableError(Exception):
    """A call that was not sent: its tool is blocked or removed, or its server cannot be reached."""


class ToolCaller(Protocol):
    """What runs a tool on a server: an entered `mcp.Client`, or a connection the dispatcher owns."""

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult: ...


async def list_all_tools(client: Client, *, refresh: bool = False) -> list[Tool]:
    """Every tool of a server, following pagination; `refresh` bypasses the client's response cache."""
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise RuntimeError(f"the server's tool list did not end after {_MAX_PAGES} pages")


def _matches(expected: str, value: Any) -> bool:
    kinds = _JSON_TYPES.get(expected)
    if kinds is None:
        return True  # a type this check does not know: the server decides
    if isinstance(value, bool) and expected in ("number", "integer"):
        return False
    if expected == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, kinds)


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """Reject arguments that plainly break a tool's input schema, before the call is queued.

    This is a shallow check (required keys, unexpected keys, top-level types, JSON-serialisability);
    the server validates fully. It exists so that obvious mistakes fail fast and never take a turn.

    Raises:
        ArgumentError: What is wrong, in one line.
    """
    problems = [f"argument names must be strings, got {key!r}" for key in arguments if not isinstance(key, str)]
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    if isinstance(required, list):
        missing = [key for key in required if key not in arguments]
        if missing:
            problems.append("missing required " + ", ".join(repr(key) for key in missing))
    if schema.get("additionalProperties") is False:
        unexpected = [key for key in arguments if key not in properties]
        if unexpected:
            problems.append("unexpected " + ", ".join(repr(key) for key in unexpected))
    for key, value in arguments.items():
        declared = properties.get(key)
        if not isinstance(declared, Mapping):
            continue
        expected = declared.get("type")
        types = [expected] if isinstance(expected, str) else expected if isinstance(expected, list) else []
        if types and not any(_matches(str(kind), value) for kind in types):
            problems.append(f"{key!r} must be {' or '.join(map(str, types))}, got {type(value).__name__}")
    if not problems:
        try:
            json.dumps(arguments, allow_nan=False)
        except (TypeError, ValueError) as exc:
            problems.append(f"arguments are not JSON-serialisable: {exc}")
    if problems:
        raise ArgumentError("invalid arguments: " + "; ".join(problems))


class MCPTool:
    """A tool on an MCP server, called through an entered `mcp.Client` or an owned connection.

    `guard`, when given, is asked before each attempt whether the tool may still be called: a call
    queued before its tool was blocked or removed fails instead of reaching the changed tool.
    """

    __slots__ = ("client", "guard", "input_schema", "name")

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

    def prepare(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        check_arguments(self.input_schema, arguments)
        return dict(arguments)

    async def invoke(self, prepared: dict[str, Any]) -> CallToolResult:
        if self.guard is not None:
            reason = self.guard()
            if reason is not None:
                raise ToolUnavailableError(reason)
        return await self.client.call_tool(self.name, prepared)


def is_connection_loss(exc: BaseException) -> bool:
    """Whether an exception from a client means its connection is gone (a fresh client is needed)."""
    if isinstance(exc, MCPError):
        return exc.error.code == CONNECTION_CLOSED
    if isinstance(exc, BaseExceptionGroup):
        return any(is_connection_loss(inner) for inner in exc.exceptions)
    if isinstance(exc, TimeoutError):
        return False  # an OSError, but a slow server is not a lost one
    return isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream | OSError)


def describe_failure(exc: Exception) -> tuple[CallStatus, str]:
    """The status and message for an exception raised while a call ran."""
    if isinstance(exc, ToolUnavailableError):
        return CallStatus.FAILED, str(exc)
    if isinstance(exc, MCPError):
        code = exc.error.code
        if code == REQUEST_TIMEOUT:
            return CallStatus.TIMEOUT, f"the server did not answer in time ({exc.error.message})"
        if code == CONNECTION_CLOSED:
            return CallStatus.FAILED, f"connection to the server lost: {exc.error.message}"
        if code == INVALID_PARAMS:
            return CallStatus.FAILED, f"the server rejected the arguments: {exc.error.message}"
        if code == METHOD_NOT_FOUND:
            return CallStatus.FAILED, f"the server does not support the request: {exc.error.message}"
        return CallStatus.FAILED, f"the server answered with error {code}: {exc.error.message}"
    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream):
        return CallStatus.FAILED, f"connection to the server lost ({type(exc).__name__})"
    if isinstance(exc, ValidationError):
        return CallStatus.FAILED, f"the server's answer is malformed: {exc.error_count()} validation error(s)"
    if isinstance(exc, TimeoutError):
        return CallStatus.TIMEOUT, f"timed out: {exc}" if str(exc) else "timed out"
    if isinstance(exc, OSError | ConnectionError):
        return CallStatus.FAILED, f"connection error: {type(exc).__name__}: {exc}"
    return CallStatus.FAILED, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
