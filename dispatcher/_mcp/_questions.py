"""Questions to the person during a call: MCP elicitation, routed to the user's handler.

A server may stop in the middle of a tool call to ask the person something (`elicitation/create`: a form
to fill in, or a URL to open). The dispatcher advertises elicitation only when the user gave a handler
(`Dispatcher(ask_user=...)`); each question then goes through one channel (`Asker`), which takes its
turns on the dispatcher's one human channel (`_driver._person`) with the approvals: one prompt at a time
for the whole dispatcher, so a person never sees two prompts at once from concurrent calls.

Who asks. A question is attributed to its server exactly: each connection has its own callback, which
knows the name the user registered the server under and whether it is trusted. The call it belongs to is
read from what the dispatcher knows, never from what the server claims: the calls in flight on that
connection (`Flights`). When the SDK runs the callback inside the call (an in-process server, a 2026-07-28
multi-round result), the call is that one; when a task names its task id (`related-task`), the call that
owns the task, if it is one of this connection's; otherwise, every call in flight on the connection (one,
most often). A question that comes when no call of the server is in flight, or that names a task none of
them owns, is not shown to anyone: the server gets ``cancel``.

What the person sees. `Question` carries the server's name and trust, the call or calls it may belong
to, and the server's own words (`message`, `schema`, `url`), which are untrusted: `Question.text()` shows
them escaped and cut short, saying whose words they are. Nothing a question says changes what the
dispatcher does: it approves nothing and schedules nothing.

What the server gets. The handler's `Answer`: ``accept`` with the form's content (the schema's defaults
filled in for what the answer leaves out, as SEP-1034 says; only the fields the form asked for are sent,
each checked against its type), ``decline``, or ``cancel``. A handler that raises, answers something else,
or gives content that does not fit the form sends ``cancel``; so does a question that was not answered
within `QuestionPolicy.timeout`, or whose call ended meanwhile. Nothing is ever accepted for the person.

Its cost. While a question waits for the person (in the queue or on screen), the clock of each call it is
attributed to is paused (`_clock`): the person's time is not a timeout. Bounded, so that a hostile server
cannot hold its calls or the person forever: each call may ask `QuestionPolicy.per_call` questions, and
each server may have `QuestionPolicy.waiting` questions waiting at once; more are sent ``cancel`` unasked.
"""

from __future__ import annotations

import inspect
import logging
import math
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
from mcp.types import ElicitRequestURLParams, ElicitResult

from .._core._errors import ConfigurationError
from .._driver._clock import current_clock
from .._driver._observe import current_attempt
from .._driver._person import Person, held_turn

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mcp.client.session import ClientRequestContext, ElicitationFnT
    from mcp.types import ElicitRequestParams, ErrorData

    from .._core._calls import ToolCall
    from .._driver._clock import CallClock
    from .._driver._observe import CallState, Observer

__all__ = ["Answer", "Asker", "Flight", "Flights", "Question", "QuestionHandler", "QuestionPolicy", "asker_for"]

logger = logging.getLogger("dispatcher")

# The 2025-11-25 `_meta` key by which a request names the task it belongs to.
_RELATED_TASK = "io.modelcontextprotocol/related-task"
# The most of a server's words `Question.text` shows.
_TEXT_LIMIT = 2000


@dataclass(frozen=True, slots=True)
class Answer:
    """The person's answer to a `Question`: build it with `accept`, `decline` or `cancel`.

    Attributes:
        action: ``"accept"`` (the form was filled in, or the URL opened), ``"decline"`` (the person
            said no) or ``"cancel"`` (dismissed without a choice).
        content: For an accepted form, the values by field name; None otherwise.
    """

    action: Literal["accept", "decline", "cancel"]
    content: Mapping[str, str | int | float | bool | list[str] | None] | None = None

    def __post_init__(self) -> None:
        if self.action not in ("accept", "decline", "cancel"):
            raise ConfigurationError(f"action must be 'accept', 'decline' or 'cancel', got {self.action!r}")
        if self.content is not None:
            if self.action != "accept":
                raise ConfigurationError(f"only an accepted answer has content, not a {self.action!r} one")
            if not isinstance(self.content, Mapping):
                raise ConfigurationError(f"content must be a mapping of field names to values, got {self.content!r}")

    @classmethod
    def accept(cls, content: Mapping[str, str | int | float | bool | list[str] | None] | None = None) -> Answer:
        """The person filled in the form with `content` (the form's defaults fill the rest), or opened the URL."""
        return cls("accept", content)

    @classmethod
    def decline(cls) -> Answer:
        """The person said no."""
        return cls("decline")

    @classmethod
    def cancel(cls) -> Answer:
        """The person dismissed the question without choosing."""
        return cls("cancel")


@dataclass(frozen=True, slots=True)
class Question:
    """A server's question to the person, asked during one of its calls.

    `message`, `schema` and `url` are the server's own words: untrusted, like anything it sends. Show
    the person `server` and `trusted` beside them (or `text()`, which does), so that a question is
    never taken for the dispatcher's or the agent's own.

    Attributes:
        server: The name you registered the server under (never the server's own name for itself).
        trusted: Whether you registered that server as trusted.
        calls: The call it was asked during, or, when the transport cannot tell which of the server's
            calls in flight asks, each of them.
        message: What the server asks, in its words.
        mode: ``"form"`` (fill in `schema`) or ``"url"`` (open `url`, out of band).
        schema: The form's restricted JSON schema (flat properties), for a form.
        url: The address to open, for a URL question.
    """

    server: str
    trusted: bool
    calls: tuple[ToolCall, ...]
    message: str
    mode: Literal["form", "url"] = "form"
    schema: Mapping[str, Any] | None = None
    url: str | None = None

    @property
    def call(self) -> ToolCall | None:
        """The call that asks, when it is known to be one; None when it may be any of `calls`."""
        return self.calls[0] if len(self.calls) == 1 else None

    @property
    def defaults(self) -> dict[str, Any]:
        """The form's default values by field name (what an accepted answer gets for the fields it omits)."""
        return _defaults(self.schema)

    def text(self) -> str:
        """The question as a person should see it: who asks, during what, then the server's words, escaped."""
        trust = "trusted" if self.trusted else "untrusted"
        during = ", ".join(f"{call.id!r} ({call.name})" for call in self.calls[:10])
        if len(self.calls) > 10:
            during += f" and {len(self.calls) - 10} more"
        which = "call" if len(self.calls) == 1 else "one of its calls"
        lines = [
            f"Server {self.server!r} ({trust}) asks, during {which} {during}.",
            "The server wrote what follows; it is not from this application:",
            _visible(self.message),
        ]
        if self.url is not None:
            lines.append(f"It asks you to open: {_visible(self.url)}")
        return "\n".join(lines)


QuestionHandler = Callable[[Question], Awaitable[Answer]]
"""An async callable that shows a `Question` to the person and returns their `Answer`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class QuestionPolicy:
    """How long a question may wait for the person, and how many a server may ask.

    Args:
        timeout: Seconds the person has to answer one question (from when it is shown), or None to
            wait as long as it takes. Unanswered by then, the server gets ``cancel``.
        per_call: The most questions one call may ask; later ones get ``cancel`` without being shown.
        waiting: The most questions one server may have waiting for the person at once (shown or
            queued behind another server's); more get ``cancel`` without being shown.
    """

    timeout: float | None = 300.0
    per_call: int = 10
    waiting: int = 4

    def __post_init__(self) -> None:
        timeout = self.timeout
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (0 < timeout < math.inf)
        ):
            raise ConfigurationError(
                f"timeout must be a positive number of seconds, got {timeout!r}; use None to wait without limit"
            )
        for name in ("per_call", "waiting"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(eq=False)
class Flight:
    """One call in flight on a connection: what a question to it needs (its call, its clock, its task)."""

    call: ToolCall | None
    clock: CallClock | None
    task_id: str | None = None
    asked: int = 0
    # The questions open for this call: each is withdrawn once every call it may belong to has ended.
    open: set[_Open] = field(default_factory=set)
    ended: bool = False
    # The observed attempt it runs in (the events of its questions go there), or None.
    observed: tuple[Observer, ToolCall, CallState] | None = None
    # The person's turn its call was dispatched within (a prompt's handler dispatched it), or None.
    within: object = None


@dataclass(eq=False)
class _Open:
    """A question on its way to the person: what withdraws it, and the calls it may belong to."""

    scope: anyio.CancelScope
    owners: list[Flight]


class Flights:
    """The calls in flight on one server's connection (a question can only belong to one of them)."""

    __slots__ = ("_flights",)

    def __init__(self) -> None:
        self._flights: list[Flight] = []

    @contextmanager
    def flying(self) -> Iterator[Flight]:
        """Register the call this task runs for the duration of the block (the send and its answer)."""
        clock = current_clock()
        flight = Flight(
            clock.call if clock is not None else None, clock, observed=current_attempt(), within=held_turn()
        )
        self._flights.append(flight)
        try:
            yield flight
        finally:
            self._flights.remove(flight)
            flight.ended = True
            for question in flight.open:
                if all(owner.ended for owner in question.owners):
                    question.scope.cancel()  # no call it may belong to is left: it is withdrawn

    def __len__(self) -> int:
        return len(self._flights)

    def attribute(self, params: ElicitRequestParams) -> tuple[list[Flight], str | None]:
        """The flights a question may belong to, or ([], why it is refused)."""
        flights = self._flights
        task = _related_task(params)
        if task is not None:
            owned = [flight for flight in flights if flight.task_id == task]
            if not owned:
                return [], f"it names task {task[:100]!r}, which none of the server's calls in flight runs"
            return owned, None
        clock = current_clock()
        if clock is not None:
            # The SDK runs the callback inside the call (in process, a multi-round result): that call.
            mine = [flight for flight in flights if flight.clock is clock]
            if mine:
                return mine, None
        if not flights:
            return [], "none of the server's calls is in flight"
        return list(flights), None


class Asker:
    """The one channel from servers to the person: a question at a time, in the order they came."""

    __slots__ = ("_handler", "_person", "_policy", "_waiting")

    def __init__(self, handler: QuestionHandler, policy: QuestionPolicy, *, person: Person | None = None) -> None:
        self._handler = handler
        self._policy = policy
        # The person's turns are fair: prompts (questions and approvals) are shown in the order they came.
        self._person = person if person is not None else Person()
        self._waiting: dict[str, int] = {}

    def callback(self, server: str, trusted: bool, flights: Flights) -> ElicitationFnT:
        """The SDK elicitation callback of one connection to `server`."""

        async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
            return await self.answer(server, trusted, flights, params)

        return elicit

    async def answer(self, server: str, trusted: bool, flights: Flights, params: ElicitRequestParams) -> ElicitResult:
        """Put a server's question to the person, and turn the answer into what the server gets."""
        ticket = self._person.ticket()  # its place with the person: the order questions came in
        owners, refused = flights.attribute(params)
        policy = self._policy
        if refused is None and any(flight.asked >= policy.per_call for flight in owners):
            refused = f"its call has asked {policy.per_call} questions already (QuestionPolicy.per_call)"
        waiting = self._waiting.get(server, 0)
        if refused is None and waiting >= policy.waiting:
            refused = f"{waiting} of its questions are waiting for the person already (QuestionPolicy.waiting)"
        if refused is not None:
            logger.warning("a question from server %r was not shown: %s; it was sent cancel", server, refused)
            return ElicitResult(action="cancel")
        for flight in owners:
            flight.asked += 1
        url = params.url if isinstance(params, ElicitRequestURLParams) else None
        schema = None if isinstance(params, ElicitRequestURLParams) else params.requested_schema
        question = Question(
            server,
            trusted,
            tuple(flight.call for flight in owners if flight.call is not None),
            params.message,
            "url" if url is not None else "form",
            schema,
            url,
        )
        self._waiting[server] = waiting + 1
        try:
            with ExitStack() as stack:
                for flight in owners:
                    if flight.clock is not None:
                        stack.enter_context(flight.clock.pausing())
                answer = await self._ask(question, owners, ticket)
        finally:
            self._waiting[server] -= 1
            if not self._waiting[server]:
                del self._waiting[server]
        return _reply(question, answer)

    async def _ask(self, question: Question, owners: list[Flight], ticket: int) -> Answer | str:
        """The handler's answer, or why there is none; withdrawn once every call it may belong to has ended."""
        with anyio.CancelScope() as withdrawn:
            opened = _Open(withdrawn, owners)
            for flight in owners:
                flight.open.add(opened)
            try:
                if all(_gone(flight) for flight in owners):
                    return "its call ended before it was asked"
                within = next((flight.within for flight in owners if flight.within is not None), None)
                async with self._person.turn(ticket, within=within):
                    # The prompt before it may have been withdrawn by the same cancellation as its call.
                    if all(_gone(flight) for flight in owners):
                        return "its call ended before it was asked"
                    return await self._observed(question, owners)
            finally:
                for flight in owners:
                    flight.open.discard(opened)
        return "its call ended before the person answered"

    async def _observed(self, question: Question, owners: list[Flight]) -> Answer | str:
        """The handler's answer, with a ``question_asked``/``question_answered`` pair on each observed call."""
        observed = [flight.observed for flight in owners if flight.observed is not None]
        for observer, call, state in observed:
            observer.question_asked(call, state, question.message)
        answer: Answer | str = "its call ended before the person answered"
        try:
            answer = await self._handler_answer(question)
            return answer
        finally:
            error = answer if isinstance(answer, str) else None if answer.action == "accept" else answer.action
            for observer, call, state in observed:
                observer.question_answered(call, state, error)

    async def _handler_answer(self, question: Question) -> Answer | str:
        timeout = self._policy.timeout
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            try:
                answer = self._handler(question)
                if not inspect.isawaitable(answer):
                    return f"ask_user returned {type(answer).__name__} instead of an awaitable (use async def)"
                got = await answer
            except Exception as exc:
                logger.exception("ask_user raised for a question of server %r", question.server)
                return f"ask_user raised {type(exc).__name__}"
            if not isinstance(got, Answer):
                return f"ask_user answered {type(got).__name__} instead of an Answer"
            return got
        return f"no answer within {timeout}s (QuestionPolicy.timeout)"


def _gone(flight: Flight) -> bool:
    """Whether nobody waits for a flight's call any more: it ended, or it is being cancelled."""
    return flight.ended or (flight.clock is not None and flight.clock.cancelled)


def _reply(question: Question, answer: Answer | str) -> ElicitResult:
    """What the server gets for `answer` (a string: why there is no answer, which sends cancel)."""
    if isinstance(answer, str):
        logger.warning("a question from server %r got no answer: %s; it was sent cancel", question.server, answer)
        return ElicitResult(action="cancel")
    if answer.action != "accept":
        return ElicitResult(action=answer.action)
    if question.mode == "url":
        return ElicitResult(action="accept")
    content, problem = _filled(question.schema, answer.content)
    if problem is not None:
        logger.warning(
            "the answer to a question of server %r does not fit its form (%s); it was sent cancel",
            question.server,
            problem,
        )
        return ElicitResult(action="cancel")
    return ElicitResult(action="accept", content=content)


def _properties(schema: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        return {}
    return {name: spec for name, spec in properties.items() if isinstance(name, str) and isinstance(spec, Mapping)}


def _defaults(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        name: spec["default"]
        for name, spec in _properties(schema).items()
        if "default" in spec and _fits(spec, spec["default"])
    }


def _filled(schema: Mapping[str, Any] | None, content: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """The content to send: the answer's fields of the form, defaults for the rest; or why it does not fit."""
    properties = _properties(schema)
    given = dict(content or {})
    filled = {**_defaults(schema), **{name: value for name, value in given.items() if name in properties}}
    for name, value in filled.items():
        if not _fits(properties[name], value):
            return {}, f"field {name[:100]!r} has {type(value).__name__} {str(value)[:50]!r}"
    required = schema.get("required") if isinstance(schema, Mapping) else None
    if isinstance(required, list):
        missing = [name for name in required if isinstance(name, str) and name in properties and name not in filled]
        if missing:
            return {}, f"required fields are missing: {', '.join(repr(name[:100]) for name in missing[:10])}"
    return filled, None


def _fits(spec: Mapping[str, Any], value: Any) -> bool:
    """Whether `value` is of the type a form field's schema names (the primitive types elicitation allows)."""
    kind = spec.get("type")
    if value is None:
        return False
    if kind == "string":
        return isinstance(value, str) and _in_choices(spec, value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "array":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    return True  # a type elicitation does not define: the server checks it


def _in_choices(spec: Mapping[str, Any], value: str) -> bool:
    choices = spec.get("enum")
    if isinstance(choices, list):
        return value in choices
    options = spec.get("oneOf")
    if isinstance(options, list):
        consts = [option.get("const") for option in options if isinstance(option, Mapping)]
        return value in consts
    return True


def _related_task(params: ElicitRequestParams) -> str | None:
    meta = params.meta
    if meta is None:
        return None
    related = meta.get(_RELATED_TASK) if isinstance(meta, Mapping) else getattr(meta, _RELATED_TASK, None)
    if isinstance(related, Mapping):
        task = related.get("taskId")
        if isinstance(task, str):
            return task
    return None


def _visible(text: str) -> str:
    """`text` cut to `_TEXT_LIMIT` characters, its invisible and control characters written out."""
    head = text[:_TEXT_LIMIT]
    if not (head.isascii() and head.isprintable()):
        head = "".join(char if _plain(char) else f"\\u{ord(char):04x}" for char in head)
    if len(text) > _TEXT_LIMIT:
        head += f"... ({len(text):,} characters in all)"
    return head


def _plain(char: str) -> bool:
    if char in "\n\t ":
        return True
    category = unicodedata.category(char)
    return category[0] != "C" and category not in ("Zl", "Zp")


def asker_for(ask_user: QuestionHandler | None, questions: QuestionPolicy | None, person: Person) -> Asker | None:
    """The asker of a dispatcher's `ask_user` and `questions` settings, checked (None: no ``ask_user``)."""
    if ask_user is not None and not callable(ask_user):
        raise ConfigurationError(f"ask_user must be an async callable taking a Question, got {ask_user!r}")
    if questions is not None and not isinstance(questions, QuestionPolicy):
        raise ConfigurationError(f"questions must be a QuestionPolicy or None, got {type(questions).__name__}")
    if ask_user is None:
        return None
    return Asker(ask_user, questions if questions is not None else QuestionPolicy(), person=person)
