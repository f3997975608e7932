"""What went wrong with a call: the one translator from server and transport failures to a status and a message.

Two kinds of failure look alike on the wire and must not be confused:

- an *answer*: the server replied to the request with a JSON-RPC error (any code, including the
  server-defined range -32000..-32099, which the SDK also uses locally for "connection closed"). The
  connection is fine; only this call failed.
- a *connection loss*: the transport failed (a stream closed, end of file, a process that exited, an
  HTTP connection error, no answer to a ping). The call's outcome is unknown and the connection needs
  replacing.

An `MCPError` is always described as an answer. The connection layer, which can check whether its
connection still answers, turns a -32000 it has confirmed as a loss into `ConnectionLost`; transport
exceptions (anyio stream errors, `OSError`) are losses by their type. Cancellation is neither and is
never passed here.
"""

from __future__ import annotations

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, INVALID_PARAMS, METHOD_NOT_FOUND, REQUEST_TIMEOUT
from pydantic import ValidationError

from .._core._calls import CallStatus
from .._core._errors import AuthenticationRequired, ConnectionLost, TaskFailed, ToolUnavailableError

__all__ = [
    "ANSWER_TOO_LARGE",
    "AuthenticationRequired",
    "ConnectionLost",
    "TaskFailed",
    "ToolUnavailableError",
    "describe",
    "explain",
    "innermost",
    "is_transport_failure",
]

_STREAM_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)

# The code of the error answer that replaces a server's answer over `max_answer_bytes` (`_mcp.AnswerLimit`):
# outside the codes the retry rules treat as transient (an answer this size comes back as large), and
# marked in its data as the dispatcher's own.
ANSWER_TOO_LARGE = -32098


def innermost(exc: BaseException) -> BaseException:
    """The one exception inside nested single-exception groups (task groups wrap what they carry)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def is_transport_failure(exc: BaseException) -> bool:
    """Whether an exception is the transport failing (never a server's answer, never a slow server)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(is_transport_failure(inner) for inner in exc.exceptions)
    if isinstance(exc, ConnectionLost):
        return True
    if isinstance(exc, TimeoutError):
        return False  # an OSError, but a slow server is not a lost one
    return isinstance(exc, (*_STREAM_ERRORS, OSError))


def describe(exc: Exception) -> tuple[CallStatus, str]:
    """The status and message for an exception raised while a call ran."""
    if isinstance(exc, ToolUnavailableError):
        return CallStatus.FAILED, str(exc)
    if isinstance(exc, ConnectionLost):
        return CallStatus.FAILED, f"connection to the server lost: {exc}"
    if isinstance(exc, TaskFailed):
        return exc.status, str(exc)
    if isinstance(exc, MCPError):
        code = exc.error.code
        message = exc.error.message
        if code == REQUEST_TIMEOUT:
            return CallStatus.TIMEOUT, f"the server did not answer in time ({message})"
        if code == INVALID_PARAMS:
            return CallStatus.FAILED, f"the server rejected the arguments: {message}"
        if code == METHOD_NOT_FOUND:
            return CallStatus.FAILED, f"the server does not support the request: {message}"
        if code == ANSWER_TOO_LARGE and isinstance(exc.error.data, dict) and "max_answer_bytes" in exc.error.data:
            return CallStatus.FAILED, message
        return CallStatus.FAILED, f"the server answered with error {code}: {message}"
    if isinstance(exc, _STREAM_ERRORS):
        return CallStatus.FAILED, f"connection to the server lost ({type(exc).__name__})"
    if isinstance(exc, ValidationError):
        return CallStatus.FAILED, f"the server's answer is malformed: {exc.error_count()} validation error(s)"
    if isinstance(exc, TimeoutError):
        return CallStatus.TIMEOUT, f"timed out: {exc}" if str(exc) else "timed out"
    if isinstance(exc, OSError):
        return CallStatus.FAILED, f"connection error: {type(exc).__name__}: {exc}"
    return CallStatus.FAILED, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def explain(exc: BaseException) -> str:
    """One line on why connecting to, listing or pinging a server failed (groups unwrapped)."""
    exc = innermost(exc)
    if isinstance(exc, ToolUnavailableError | ConnectionLost):
        return str(exc)
    if isinstance(exc, MCPError):
        code = exc.error.code
        return exc.error.message if code == CONNECTION_CLOSED else f"{exc.error.message} (MCP error {code})"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
