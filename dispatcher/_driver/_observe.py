"""Observability: a plain event hook and OpenTelemetry spans for every call and every attempt.

Both are off unless configured, and cost nothing then: the scheduler checks one attribute per call.

- The event hook is a plain callable that receives a `CallEvent` when a call is queued, waits for an
  approval and gets the answer, starts, is retried and finishes. It runs synchronously inside the
  scheduler, so it should be quick (append to a list, put on a queue, log a line); an exception it
  raises is logged and otherwise ignored.
- Tracing uses only the ``opentelemetry-api`` package (``pip install mcp-dispatcher[otel]``), imported when
  a dispatcher opens. With no API installed, or no SDK configured (the global tracer provider is still
  the API's proxy or no-op provider), nothing is traced. Each call gets a span from its submission to
  its result, a child of the span that was current where the call was submitted; each attempt gets a
  child span, current while the tool runs, so the MCP SDK's client span (and, through the trace
  context it sends in ``_meta``, the server's span) nest under it.

Span names and attributes follow the OpenTelemetry GenAI conventions where they exist
(``execute_tool {tool}``, ``gen_ai.operation.name``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
``error.type``) and use a ``dispatcher.`` prefix for the rest: server, trust, scheduling class, the four
effective hints, attempt, status, effect (`ToolResult.effect`), attempts, queue and run time.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar, Token
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

    from mcp.shared.dispatcher import ProgressFnT
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from .._core._calls import CallStatus, Effect, ToolCall, ToolResult
    from .._core._catalog import ToolEntry
    from ._approval import ApprovalRequest

__all__ = ["CallEvent", "CallState", "EventKind", "Observer", "current_attempt", "progress_reporter", "resolve_tracer"]

logger = logging.getLogger("dispatcher")

EventKind = Literal[
    "queued",
    "approval_asked",
    "approval_answered",
    "started",
    "retried",
    "progress",
    "question_asked",
    "question_answered",
    "finished",
]


@dataclass(frozen=True, slots=True)
class CallEvent:
    """Something that happened to a call, for the `Dispatcher(on_event=...)` hook.

    Attributes:
        kind: ``"queued"`` (submitted), ``"approval_asked"`` (the approver was asked about it: it waits
            for the answer), ``"approval_answered"`` (the answer came: `error` is the denial, None when
            approved), ``"started"`` (its first attempt began), ``"retried"`` (another attempt began
            after a transient failure), ``"progress"`` (the server reported progress on it, an MCP
            progress notification), ``"question_asked"`` (its server's question is shown to the person,
            `message` its words; the call's clock is paused), ``"question_answered"`` (the question
            ended: `error` is None when the person accepted, else ``"decline"``, ``"cancel"`` or why
            the server was sent cancel) or ``"finished"`` (it has its result). A call whose tool
            changed while its approval was asked is asked again: a second pair of approval events.
        call: The call.
        time: When it happened, on the event loop's clock (`anyio.current_time()`), like the times of
            `ToolResult`.
        tool: The catalogue entry the call resolved to, or None if it resolved to nothing.
        attempt: The attempt that started (``started``: 1, ``retried``: 2 or more); for ``finished``, the
            number of attempts made; 0 for ``queued``.
        error: For ``retried``, why the previous attempt failed; for ``finished``, the result's error;
            for ``approval_answered``, why the call was refused (None: approved); for
            ``question_answered``, what the server got unless it was an accepted answer.
        result: For ``finished``, the result; else None.
        keys: The call's conflict keys (see docs/conflicts.md; ``("",)`` is the root key, which
            conflicts with every call); empty for ``queued`` and for a call that never got keys.
        effect: For ``finished``, whether the call's effect happened (`ToolResult.effect`); else None.
        progress: For ``progress``, how far the server says it is (its number, which only grows), and
            `total` its total if it gave one; `message` its message, cut to 500 characters (for
            ``question_asked``, the question's message, cut likewise). The server's own words: untrusted.
        limit: For ``started``, ``retried`` and ``finished`` events of a call whose server has an
            adaptive limit (`AdaptiveLimit`), the server's limit at that moment; else None. Collected
            over a run, these events show the limit as it moves.
        limit_scope: Whose that limit is: ``"server"`` (this dispatcher's own) or ``"fleet"`` (one
            level shared by a fleet's processes, see docs/fleet.md); None without a `limit`.
    """

    kind: EventKind
    call: ToolCall
    time: float
    _: KW_ONLY
    tool: ToolEntry | None = None
    attempt: int = 0
    error: str | None = None
    result: ToolResult | None = None
    keys: tuple[str, ...] = ()
    effect: Effect | None = None
    progress: float | None = None
    total: float | None = None
    message: str | None = None
    limit: int | None = None
    limit_scope: Literal["server", "fleet"] | None = None


# The most of a server's progress message that reaches an event or a span.
_PROGRESS_TEXT = 500

# The attempt running in this task, while one runs under a hooked batch: what progress is reported to.
_attempt: ContextVar[tuple[Observer, ToolCall, CallState] | None] = ContextVar("dispatcher_attempt", default=None)


def current_attempt() -> tuple[Observer, ToolCall, CallState] | None:
    """The observed attempt running in this task, if any (what a question asked during it reports to)."""
    return _attempt.get()


def progress_reporter() -> ProgressFnT | None:
    """The progress callback for the attempt running in this task (None when nobody observes it)."""
    current = _attempt.get()
    if current is None:
        return None
    observer, call, state = current

    async def report(progress: float, total: float | None, message: str | None) -> None:
        observer.progress(call, state, progress, total, message)

    return report


class CallState:
    """What the hooks keep for one call between its events (only for calls of a hooked batch)."""

    __slots__ = (
        "attempt",
        "attempt_span",
        "current",
        "entry",
        "keys",
        "previous_error",
        "prompt",
        "recheck",
        "span",
        "token",
    )

    def __init__(self, entry: ToolEntry | None) -> None:
        self.entry = entry
        self.span: Span | None = None
        self.attempt_span: Span | None = None
        self.token: object = None
        # The token of `_attempt` set for the attempt that runs (progress reports reach this call).
        self.current: Token[tuple[Observer, ToolCall, CallState] | None] | None = None
        self.attempt = 0
        self.previous_error: str | None = None
        # The session guard must look again when the call is about to start (see `_hooks`).
        self.recheck = False
        # Its approval's place in the queue of prompts to the person (`_person`), once one is asked for.
        self.prompt: int | None = None
        # Its conflict keys, once it is queued in the gate.
        self.keys: tuple[str, ...] = ()


def resolve_tracer(provider: TracerProvider | None) -> Tracer | None:
    """A tracer from the given provider or the global one, or None when tracing would be a no-op."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    if provider is None:
        provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    from .._version import __version__

    return provider.get_tracer("dispatcher", __version__)


class Observer:
    """Sends a dispatcher's call events to its hook and its spans to its tracer."""

    __slots__ = ("_limits", "_on_event", "_tracer")

    def __init__(
        self,
        on_event: Callable[[CallEvent], object] | None,
        tracer: Tracer | None,
        *,
        limits: Callable[[str | None], tuple[int, Literal["server", "fleet"]] | None] | None = None,
    ) -> None:
        self._on_event = on_event
        self._tracer = tracer
        # A server's adaptive limit now and whose it is (None for a server without one).
        self._limits = limits

    def _limit(self, entry: ToolEntry | None) -> tuple[int, Literal["server", "fleet"]] | tuple[None, None]:
        limits = self._limits
        shown = limits(entry.server) if limits is not None and entry is not None else None
        return shown if shown is not None else (None, None)

    def queued(self, call: ToolCall, state: CallState, time: float) -> None:
        entry = state.entry
        if self._tracer is not None:
            state.span = self._tracer.start_span(
                f"execute_tool {entry.name if entry is not None else call.name}",
                attributes=_call_attributes(call, entry),
            )
        self._emit(CallEvent("queued", call, time, tool=entry))

    def approval_asked(self, request: ApprovalRequest, state: CallState) -> None:
        """The approver is being asked about a call (its answer comes as `approval`)."""
        self._emit_now("approval_asked", request.call, state)

    def approval(self, state: CallState, request: ApprovalRequest, denial: str | None) -> None:
        self._emit_now("approval_answered", request.call, state, error=denial)
        span = state.span
        if span is not None:
            if denial is None:
                span.add_event("dispatcher.approval.granted", {"dispatcher.approval.reason": request.reason})
            else:
                span.add_event(
                    "dispatcher.approval.denied",
                    {"dispatcher.approval.reason": request.reason, "dispatcher.approval.denial": denial},
                )

    def attempt_started(self, call: ToolCall, state: CallState, time: float) -> None:
        """An attempt begins: runs in the task that runs it, which the span is made current in."""
        state.attempt += 1
        attempt = state.attempt
        state.current = _attempt.set((self, call, state))
        limit, scope = self._limit(state.entry)
        tracer = self._tracer
        if tracer is not None and state.span is not None:
            from opentelemetry import context, trace

            entry = state.entry
            attributes: dict[str, Any] = {
                "gen_ai.tool.name": entry.name if entry is not None else call.name,
                "gen_ai.tool.call.id": call.id,
                "dispatcher.attempt": attempt,
            }
            if limit is not None:
                attributes["dispatcher.server.limit"] = limit
                attributes["dispatcher.server.limit.scope"] = scope
            span = tracer.start_span(
                f"attempt {entry.name if entry is not None else call.name}",
                context=trace.set_span_in_context(state.span),
                attributes=attributes,
            )
            state.attempt_span = span
            state.token = context.attach(trace.set_span_in_context(span))
        self._emit(
            CallEvent(
                "started" if attempt == 1 else "retried",
                call,
                time,
                tool=state.entry,
                attempt=attempt,
                error=state.previous_error if attempt > 1 else None,
                keys=state.keys,
                limit=limit,
                limit_scope=scope,
            )
        )

    def attempt_finished(self, state: CallState, status: CallStatus, error: str | None) -> None:
        """An attempt ended (in the task that ran it)."""
        state.previous_error = error
        current, state.current = state.current, None
        if current is not None:
            try:
                _attempt.reset(current)
            except ValueError:
                pass  # ended from another task (a finished call's cleanup): that task's context is not this one
        span = state.attempt_span
        if span is None:
            return
        state.attempt_span = None
        _end(span, status, error, {"dispatcher.outcome": status.value})
        token, state.token = state.token, None
        if token is not None:
            from opentelemetry import context

            context.detach(token)  # type: ignore[arg-type]

    def progress(
        self, call: ToolCall, state: CallState, progress: float, total: float | None, message: str | None
    ) -> None:
        """The server reported progress on the attempt that runs."""
        if message is not None:
            message = message[:_PROGRESS_TEXT]
        span = state.attempt_span
        if span is not None:
            attributes: dict[str, Any] = {"dispatcher.progress": progress}
            if total is not None:
                attributes["dispatcher.progress.total"] = total
            if message is not None:
                attributes["dispatcher.progress.message"] = message
            span.add_event("dispatcher.progress", attributes)
        self._emit_now("progress", call, state, progress=progress, total=total, message=message)

    def question_asked(self, call: ToolCall, state: CallState, message: str) -> None:
        """A server's question asked during the call is shown to the person (the call's clock is paused)."""
        message = message[:_PROGRESS_TEXT]
        if state.attempt_span is not None:
            state.attempt_span.add_event("dispatcher.question.asked", {"dispatcher.question.message": message})
        self._emit_now("question_asked", call, state, message=message)

    def question_answered(self, call: ToolCall, state: CallState, error: str | None) -> None:
        """The question ended: None when the person accepted, else what the server got instead, and why."""
        if state.attempt_span is not None:
            attributes = {} if error is None else {"dispatcher.question.error": error}
            state.attempt_span.add_event("dispatcher.question.answered", attributes)
        self._emit_now("question_answered", call, state, error=error)

    def finished(self, state: CallState, result: ToolResult) -> None:
        if state.attempt_span is not None:
            self.attempt_finished(state, result.status, result.error)
        limit, scope = self._limit(state.entry)
        span = state.span
        if span is not None:
            state.span = None
            _end(
                span,
                result.status,
                result.error,
                {
                    "dispatcher.status": result.status.value,
                    "dispatcher.effect": result.effect.value,
                    "dispatcher.attempts": result.attempts,
                    "dispatcher.queue_time_s": result.queue_time,
                    "dispatcher.run_time_s": result.run_time,
                    "dispatcher.untrusted_content": result.untrusted_content,
                    # Only declared keys: the root key ("") is every call's default.
                    **({"dispatcher.keys": list(state.keys)} if state.keys not in ((), ("",)) else {}),
                    **(
                        {"dispatcher.server.limit": limit, "dispatcher.server.limit.scope": scope}
                        if limit is not None
                        else {}
                    ),
                    **({"dispatcher.depends_on": result.depends_on} if result.depends_on is not None else {}),
                },
            )
        self._emit(
            CallEvent(
                "finished",
                result.call,
                result.finished_at,
                tool=state.entry,
                attempt=result.attempts,
                error=result.error,
                result=result,
                keys=state.keys,
                effect=result.effect,
                limit=limit,
                limit_scope=scope,
            )
        )

    def _emit_now(
        self,
        kind: EventKind,
        call: ToolCall,
        state: CallState,
        *,
        error: str | None = None,
        progress: float | None = None,
        total: float | None = None,
        message: str | None = None,
    ) -> None:
        """Emit an event that happens now, with the attempts the call has begun so far (0 before its first)."""
        self._emit(
            CallEvent(
                kind,
                call,
                anyio.current_time(),
                tool=state.entry,
                attempt=state.attempt,
                keys=state.keys,
                error=error,
                progress=progress,
                total=total,
                message=message,
            )
        )

    def _emit(self, event: CallEvent) -> None:
        hook = self._on_event
        if hook is None:
            return
        try:
            hook(event)
        except Exception:
            # The hook is the user's code, run inside the scheduler: it must not break a call.
            logger.exception("the on_event hook raised on a %r event for call %r", event.kind, event.call.id)


def _call_attributes(call: ToolCall, entry: ToolEntry | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": entry.name if entry is not None else call.name,
        "gen_ai.tool.call.id": call.id,
    }
    if entry is not None:
        hints = entry.annotations
        if entry.server is not None:
            attributes["dispatcher.server"] = entry.server
        attributes["dispatcher.tool"] = entry.tool
        attributes["dispatcher.trusted"] = entry.trusted
        attributes["dispatcher.scheduling"] = "exclusive" if entry.exclusive else "concurrent"
        attributes["dispatcher.read_only"] = bool(hints.read_only_hint)
        attributes["dispatcher.destructive"] = bool(hints.destructive_hint)
        attributes["dispatcher.idempotent"] = bool(hints.idempotent_hint)
        attributes["dispatcher.open_world"] = bool(hints.open_world_hint)
    return attributes


def _end(span: Span, status: CallStatus, error: str | None, attributes: dict[str, Any]) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attributes(attributes)
    if status.value != "ok":
        span.set_attribute("error.type", status.value)
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()
