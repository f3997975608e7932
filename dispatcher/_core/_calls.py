"""Tool calls in, results out: `ToolCall`, `ToolResult`, `CallStatus` and `Effect`."""

from __future__ import annotations

import enum
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mcp.types import CallToolResult

__all__ = ["CallStatus", "Effect", "ToolCall", "ToolResult", "quoted_id"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model asked for.

    Args:
        id: The call's identifier, unique within a batch (the model's tool-use id).
        name: The tool to call: a catalogue name from `Dispatcher.tools()`, or a server's own tool
            name when that is unambiguous or `server` is given.
        arguments: The call's arguments, a JSON object. Anything that is not a mapping gives the call a
            FAILED result rather than an exception.
        server: Restrict the lookup to the server registered under this name.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] | None = None
    _: KW_ONLY
    server: str | None = None


class CallStatus(enum.Enum):
    """How a call ended.

    The statuses are today's; whether the call's effect happened is a separate reading, `Effect`
    (`ToolResult.effect`): a TIMEOUT, FAILED or CANCELLED call may have never run or be of unknown
    effect, depending on whether its request had been sent. OK and TOOL_ERROR always ran; DENIED never did.
    """

    OK = "ok"
    """The tool ran and returned a result."""
    TOOL_ERROR = "tool_error"
    """The tool ran and reported an error (`CallToolResult.is_error`); the model should see it."""
    FAILED = "failed"
    """The call never ran or failed outright: unknown tool, bad arguments, a dead server."""
    TIMEOUT = "timeout"
    """The call ran out of time; the tool may or may not have done its work."""
    CANCELLED = "cancelled"
    """The caller gave up on the call before it ended."""
    DENIED = "denied"
    """The call needed approval and did not get it (refused, failed or timed out); it never ran."""


class Effect(enum.Enum):
    """Whether a call's effect happened, read from *when* it ended, never from what a server sent.

    The dispatcher knows three moments of a call: before its request was sent (nothing can have
    reached the tool), after it was sent (it may have), and after the tool's answer came back. A call
    that ended in the first is NEVER_RAN, in the second UNKNOWN, in the third RAN. Once a request may
    have reached the server nothing makes the call read NEVER_RAN again: not a later attempt that was
    not sent, not an error the server (or the SDK, for a lost transport) answered with.
    """

    RAN = "ran"
    """The tool answered (OK or TOOL_ERROR): its effect, whatever it was, happened."""
    NEVER_RAN = "never_ran"
    """Nothing was sent to the tool: an unknown tool, bad arguments, a denial, a cancellation or
    timeout before the request left, no fleet hold. Repeating the call cannot do the work twice."""
    UNKNOWN = "unknown"
    """The request was sent and no answer came (a timeout, a lost connection, a cancellation in
    flight, an error instead of the tool's result): it may or may not have happened. A call that may
    mutate should be checked before it is repeated."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one `ToolCall`.

    Times are readings of the event loop's clock (`anyio.current_time()`), comparable with each other.

    Attributes:
        call: The call this result answers.
        status: How the call ended.
        result: The tool's `CallToolResult` when the tool answered (OK or TOOL_ERROR), else None.
        error: A readable explanation for any status other than OK, else None; at most about 1,000
            characters (the tool's full error text stays in `result`).
        attempts: How many attempts reached the tool (0 when it never ran).
        tool: The catalogue name the call resolved to, or None when it resolved to nothing.
        server: The server of that tool (None for local functions or unresolved calls).
        queued_at: When the call was submitted.
        started_at: When its first attempt started, or None if it never started.
        finished_at: When its result was settled.
        attempt_errors: Why each earlier attempt failed, oldest first, when the call was retried.
        effect: Whether the call's effect happened: `Effect.RAN`, `Effect.NEVER_RAN` or
            `Effect.UNKNOWN` (see `Effect`). Set by the dispatcher from when the call ended; a result
            built by hand is UNKNOWN unless it says otherwise.
        mutating: Whether the call's tool may change something (its effective readOnlyHint is not
            true; an unknown tool counts as mutating): with an UNKNOWN effect, the model is told to check
            before it repeats the call (`dispatcher.formats`).
        depends_on: For a call that fail-fast did not run (``fail_fast=True``): the id of the earlier
            call of its batch whose failure or unknown outcome it depended on (a write it conflicts
            with, or a call skipped in turn); None for every other call. Its ``effect`` is NEVER_RAN.
        untrusted_content: Whether what the tool sent back came from an open world: the tool's
            effective openWorldHint is true and it ran (an untrusted server's tools always count as
            open-world), or the error quotes text a server wrote (the changed definition of a blocked
            tool, the name of a removed one). Such content may carry a prompt injection: show it to the
            model as data (`dispatcher.formats` wraps it), never as instructions.
    """

    call: ToolCall
    status: CallStatus
    _: KW_ONLY
    result: CallToolResult | None = None
    error: str | None = None
    attempts: int = 0
    tool: str | None = None
    server: str | None = None
    queued_at: float = 0.0
    started_at: float | None = None
    finished_at: float = 0.0
    attempt_errors: tuple[str, ...] = ()
    untrusted_content: bool = False
    effect: Effect = Effect.UNKNOWN
    mutating: bool = True
    depends_on: str | None = None

    @property
    def call_id(self) -> str:
        """The id of the call this result answers."""
        return self.call.id

    @property
    def ok(self) -> bool:
        """Whether the tool ran and returned a non-error result."""
        return self.status is CallStatus.OK

    @property
    def queue_time(self) -> float:
        """Seconds between submission and start (or the end, for a call that never started)."""
        return (self.started_at if self.started_at is not None else self.finished_at) - self.queued_at

    @property
    def run_time(self) -> float:
        """Seconds between start and end, 0.0 for a call that never started."""
        return 0.0 if self.started_at is None else self.finished_at - self.started_at


# The most characters of a call id that the dispatcher's own messages quote. The id is the model's: one of
# megabytes, quoted in the error and the note of every call that depended on it, would be multiplied
# into the model's next prompt.
_QUOTED_ID = 100


def quoted_id(call_id: str) -> str:
    """A call id as the dispatcher's messages quote it: as Python quotes it (no character of it can start a
    new line), cut at 100 characters."""
    if len(call_id) <= _QUOTED_ID:
        return repr(call_id)
    return f"{call_id[:_QUOTED_ID]!r}... ({len(call_id)} characters)"
