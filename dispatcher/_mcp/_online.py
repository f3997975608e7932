"""The wiring of an adaptive per-server limit (`AdaptiveLimit`): each call's send and answer, fed to its controller.

The controller (`_core._adaptive.Controller`) decides; this module only tells it what happened and applies
what it decides. `OnlineLimit` is one server's: `LimitedTool` wraps each of the server's tools, so that
every attempt waits out a Retry-After, is counted from the moment it is sent until it ends, and reports
how it ended; the limit the controller then holds is put into the gate (the place every per-server
limit is enforced) through `apply`. The executor needs no change: every call that ends is followed by
the gate admitting what it now allows.

Whose words count
-----------------
What a server says about its own load (an error code, a 429, "rate limit exceeded", a Retry-After) is
the server's word, and an untrusted server's words never decide how calls are scheduled: for it only
what the dispatcher observes counts, the latency of its answers and the calls that got no answer in
time. A trusted server's words count too:

- an `MCPError` in the server-defined range -32000..-32099 (not the dispatcher's own -32098 for an
  answer over `max_answer_bytes`), a code 429, or an error whose message says it is overloaded or
  rate limited (`says_overloaded`) is an overload;
- so is a tool's error result (``isError``) whose text says so: many servers report a rate limit
  inside an ordinary result;
- a Retry-After in the error's data (``{"retryAfter": 2}``) or its text holds back the server's next
  calls, up to `AdaptiveLimit.max_wait`.

Timeouts count for every server: the call's own timeout (`call_timeout`), its idle timeout and the
SDK's read timeout (-32001; from an untrusted server only the SDK's own, not an error it answered with
that code). Cancellation by the caller and failures that say nothing about load (a bad request, a lost
connection, a blocked tool) count for nothing. Only calls of read-only tools move the
limit (writes run alone whatever it is); calls that run as MCP tasks are not latency samples (their
time is the task's, not the server's queue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import REQUEST_TIMEOUT

from .._core._adaptive import Controller, Signal, retry_after, says_overloaded
from ._failures import ANSWER_TOO_LARGE

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from mcp.types import CallToolResult

    from .._core._adaptive import AdaptiveLimit
    from .._core._catalog import ToolImpl
    from .._driver._coordination import Lease

__all__ = ["LimitedTool", "OnlineLimit", "classify_error", "classify_result"]

# The server-defined error codes of JSON-RPC: a server's own way of saying it failed.
_SERVER_ERRORS = range(-32099, -32000 + 1)
# Codes some servers borrow from HTTP for "too many requests" and "unavailable".
_HTTP_OVERLOAD = (429, 503)


class OnlineLimit:
    """One server's adaptive limit: its controller, and how its limit reaches the gate.

    Args:
        server: Your name for the server.
        setting: The floor, ceiling and factors.
        trusted: Whether the server's own words about its load count (see the module docstring).
        apply: Called with the new limit whenever it changes.
        waiting: Whether calls of the server wait for room under its limit now.
        call_timeout: The dispatcher's `call_timeout`: a call cancelled once it has run that long
            timed out.
    """

    __slots__ = ("_apply", "applied", "call_timeout", "controller", "server", "trusted", "waiting")

    def __init__(
        self,
        server: str,
        setting: AdaptiveLimit,
        *,
        trusted: bool,
        apply: Callable[[int], object],
        waiting: Callable[[], bool],
        call_timeout: float | None,
    ) -> None:
        self.waiting = waiting
        self.server = server
        self.controller = Controller(setting)
        self.trusted = trusted
        self._apply = apply
        self.call_timeout = call_timeout
        self.applied = self.controller.limit
        """The limit last put into the gate."""
        apply(self.applied)

    @property
    def limit(self) -> int:
        """The server's limit now."""
        return self.controller.limit

    def sync(self) -> None:
        """Put the controller's limit into the gate if it moved."""
        limit = self.controller.limit
        if limit != self.applied:
            self.applied = limit
            self._apply(limit)


class LimitedTool:
    """A tool of a server with an adaptive limit: each attempt is reported to the server's controller.

    Args:
        inner: The tool as it would run without the limit.
        online: The server's adaptive limit.
        tool: The tool's name on its server (its latency baseline is its own).
        read: Whether the tool is read-only (only those calls move the limit).
    """

    __slots__ = ("inner", "online", "read", "tool")

    def __init__(self, inner: ToolImpl, online: OnlineLimit, tool: str, *, read: bool) -> None:
        self.inner = inner
        self.online = online
        self.tool = tool
        # A task's time is the task's, not the server's queue: not a latency sample.
        self.read = read and getattr(inner, "task", None) is None

    def prepare(self, arguments: Mapping[str, Any]) -> Any:
        return self.inner.prepare(arguments)

    async def invoke(self, prepared: Any, lease: Lease | None = None) -> CallToolResult:
        online = self.online
        controller = online.controller
        entered = anyio.current_time()
        wait = controller.wait(entered)
        if wait > 0:
            # The server asked for a pause: this call keeps its place under the limit and waits it out.
            await anyio.sleep(wait)
        flight = controller.start(anyio.current_time())
        online.sync()
        signal, pause = Signal.OTHER, None
        try:
            result = await self.inner.invoke(prepared, lease)
        except Exception as exc:
            signal, pause = classify_error(exc, online.trusted)
            raise
        except BaseException:
            timeout = online.call_timeout
            if timeout is not None and anyio.current_time() >= entered + timeout:
                signal = Signal.TIMEOUT  # cut off at the call's timeout (a cancellation by the caller is not)
            raise
        else:
            signal, pause = classify_result(result, online.trusted)
            return result
        finally:
            controller.finish(
                flight,
                anyio.current_time(),
                signal,
                tool=self.tool,
                read=self.read,
                retry_after=pause,
                waiting=online.waiting(),
            )
            online.sync()


def classify_result(result: CallToolResult, trusted: bool) -> tuple[Signal, float | None]:
    """What a tool's result says about its server's load: an answer, or (trusted only) an overload."""
    if not result.is_error or not trusted:
        return Signal.ANSWER, None
    text = " ".join(getattr(block, "text", "") for block in result.content[:8])
    if says_overloaded(text):
        return Signal.OVERLOAD, retry_after(text)
    return Signal.ANSWER, None


def classify_error(exc: Exception, trusted: bool) -> tuple[Signal, float | None]:
    """What a failed attempt says about its server's load (see the module docstring)."""
    if isinstance(exc, TimeoutError):
        return Signal.TIMEOUT, None  # the idle timeout: no progress in time
    if not isinstance(exc, MCPError):
        return Signal.OTHER, None
    code = exc.error.code
    if code == REQUEST_TIMEOUT and (trusted or _timed_out_here(exc)):
        return Signal.TIMEOUT, None
    if not trusted or code == ANSWER_TOO_LARGE:
        return Signal.OTHER, None
    message = exc.error.message if isinstance(exc.error.message, str) else ""
    if code in _SERVER_ERRORS or code in _HTTP_OVERLOAD or says_overloaded(message):
        return Signal.OVERLOAD, retry_after(message, exc.error.data)
    return Signal.OTHER, None


def _timed_out_here(exc: MCPError) -> bool:
    """Whether a -32001 is the SDK's own read timeout, not an error the server answered with that code.

    The SDK raises its timeout ``from None``; a server's error answer is raised as it came. An untrusted
    server could otherwise cut its own limit by answering -32001 at once, which is its word, not a
    timeout the dispatcher observed.
    """
    return exc.__suppress_context__ and exc.__cause__ is None
