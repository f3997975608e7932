"""Questions to the person during a call (MCP elicitation): routed to `ask_user`, attributed, bounded, paused clocks.

Against the SDK's own server (`tests/asking_server.py`) in process, on both protocol revisions (the legacy
handshake, where the question is a request of the server's; 2026-07-28, where it rides a multi-round
result), and over stdio. Times are checked on trio's virtual clock.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

import anyio
import pytest

from dispatcher import Answer, CallStatus, ConfigurationError, Dispatcher, Question, QuestionPolicy, ToolCall
from dispatcher._driver import _person
from dispatcher._driver._clock import CallClock

from . import forkserver
from .asking_server import INJECTION, asking_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dispatcher import ToolResult

pytestmark = [pytest.mark.anyio, pytest.mark.backends("asyncio", "trio", "trio-mockclock")]

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
MODES = pytest.mark.parametrize("mode", ["legacy", "auto"])


def _text(result: ToolResult) -> str:
    assert result.result is not None, result.error
    return "\n".join(getattr(block, "text", "") for block in result.result.content)


class Person:
    """An `ask_user` that records each question and answers it once `release` is set (at once by default)."""

    def __init__(self, answer: Answer | None = None, *, wait: float = 0.0) -> None:
        self.answer = answer if answer is not None else Answer.accept({"name": "Ada"})
        self.wait = wait
        self.questions: list[Question] = []
        self.showing = 0
        self.most_at_once = 0

    async def __call__(self, question: Question) -> Answer:
        self.questions.append(question)
        self.showing += 1
        self.most_at_once = max(self.most_at_once, self.showing)
        try:
            await anyio.sleep(self.wait)
        finally:
            self.showing -= 1
        return self.answer


@MODES
async def test_a_question_reaches_the_handler_with_its_call_and_server_and_the_answer_gets_defaults(
    mode: Literal["auto", "legacy"],
) -> None:
    """The handler sees server, trust and the exact call; an answer naming one field sends the form's defaults too."""
    seen: list[str] = []
    person = Person(Answer.accept({"name": "Ada", "secret": "not asked for"}))
    async with Dispatcher(ask_user=person) as dispatcher:
        await dispatcher.connect("travel", asking_server(seen), mode=mode)
        [result] = await dispatcher.dispatch([ToolCall("c1", "book_either", {})])
    assert result.status is CallStatus.OK, result.error
    [question] = person.questions
    assert (question.server, question.trusted, question.mode) == ("travel", False, "form")
    assert question.call is not None and question.call.id == "c1"
    assert question.defaults == {"seats": 2, "meal": "veg"}
    # Defaults filled in; a field the form did not ask for never reaches the server.
    assert seen == ["accept [('meal', 'veg'), ('name', 'Ada'), ('seats', 2)]"]


async def test_the_person_answering_stops_the_call_clock(virtual_clock: bool) -> None:
    """A person who takes 100x the call timeout to answer is not a timeout; the clock runs again afterwards."""
    if not virtual_clock:
        pytest.skip("times are checked on the virtual clock")
    person = Person(wait=100.0)
    async with Dispatcher(ask_user=person, call_timeout=1.0) as dispatcher:
        await dispatcher.connect("travel", asking_server(), mode="legacy")
        [result] = await dispatcher.dispatch([ToolCall("c1", "book", {})])
    assert result.status is CallStatus.OK, result.error
    assert result.started_at is not None
    assert result.finished_at - result.started_at == pytest.approx(100.0, abs=0.1)


async def test_the_clock_check_catches_a_clock_that_does_not_stop(
    virtual_clock: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oracle: with the pause switched off, the same call times out while the person answers."""
    if not virtual_clock:
        pytest.skip("times are checked on the virtual clock")
    monkeypatch.setattr(CallClock, "pause", lambda self: None)
    monkeypatch.setattr(CallClock, "resume", lambda self: None)
    async with Dispatcher(ask_user=Person(wait=100.0), call_timeout=1.0) as dispatcher:
        await dispatcher.connect("travel", asking_server(), mode="legacy")
        [result] = await dispatcher.dispatch([ToolCall("c1", "book", {})])
    assert result.status is CallStatus.TIMEOUT


@pytest.mark.parametrize("serial", [True, False])
async def test_concurrent_reads_put_one_question_at_a_time(serial: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three reads asking at once: the person sees one question at a time (False: the oracle without the queue)."""
    if not serial:

        @asynccontextmanager
        async def unqueued(self: Any, ticket: int | None = None, *, within: object = None) -> AsyncIterator[None]:
            await anyio.lowlevel.checkpoint()
            yield

        monkeypatch.setattr(_person.Person, "turn", unqueued)
    person = Person(wait=0.2)
    async with Dispatcher(ask_user=person, call_timeout=None) as dispatcher:
        await dispatcher.connect("travel", asking_server(), trusted=True, mode="legacy")
        results = await dispatcher.dispatch([ToolCall(f"c{n}", "book", {}) for n in range(3)])
    assert [result.status for result in results] == [CallStatus.OK] * 3
    # Each question is attributed to its own call, never to its siblings.
    assert sorted(q.call.id for q in person.questions if q.call is not None) == ["c0", "c1", "c2"]
    assert (person.most_at_once == 1) is serial


async def test_without_a_handler_nothing_is_advertised_and_nothing_is_accepted() -> None:
    """No ask_user: the server learns it cannot ask; its question is refused by the SDK, never answered accept."""
    seen: list[str] = []
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("travel", asking_server(seen), mode="legacy")
        [result] = await dispatcher.dispatch([ToolCall("c1", "book", {})])
    assert result.status is CallStatus.OK, result.error
    [answer] = seen
    assert answer.startswith("error:") and "not supported" in answer.lower()


async def test_a_flood_of_questions_shows_the_person_only_per_call(virtual_clock: bool) -> None:
    """A call that asks 30 times gets 3 shown (per_call=3); the other 27 get cancel without reaching the person."""
    person = Person()
    policy = QuestionPolicy(per_call=3)
    async with Dispatcher(ask_user=person, questions=policy) as dispatcher:
        await dispatcher.connect("travel", asking_server(), mode="legacy")
        [result] = await dispatcher.dispatch([ToolCall("c1", "flood", {"times": 30})])
    assert len(person.questions) == 3
    actions = [line.split()[0] for line in _text(result).splitlines()]
    assert actions == ["accept"] * 3 + ["cancel"] * 27


async def test_a_question_naming_a_task_no_call_runs_is_not_shown() -> None:
    """A question whose related-task names a task none of the server's calls runs gets cancel, unshown."""
    person = Person()
    async with Dispatcher(ask_user=person) as dispatcher:
        await dispatcher.connect("travel", asking_server(), mode="legacy")
        [result] = await dispatcher.dispatch([ToolCall("c1", "foreign_task", {})])
    assert person.questions == []
    assert _text(result).startswith("cancel")


async def test_a_question_after_the_call_ended_is_not_shown(virtual_clock: bool) -> None:
    """A server that asks once none of its calls is in flight gets cancel; the person is not asked."""
    person = Person()
    async with Dispatcher(ask_user=person, call_timeout=None) as dispatcher:
        await dispatcher.connect("travel", asking_server(), mode="legacy")
        [first] = await dispatcher.dispatch([ToolCall("c1", "later_question", {})])
        # The late question arrives while this next call waits (it is in flight then): it reads the verdict.
        person_free_before = len(person.questions)
        [after] = await dispatcher.dispatch([ToolCall("c2", "late_asked", {})])
    assert first.ok
    assert "late " in _text(after)
    # While `late_asked` ran, one call was in flight, so the late question was attributed to it: the call in
    # flight is the only one the server could mean. Shown, it names that call, never the ended one.
    assert all(q.call is not None and q.call.id == "c2" for q in person.questions[person_free_before:])


async def test_an_injected_question_is_shown_escaped_and_as_the_servers_words() -> None:
    """A question text with instructions and control characters: `text()` names the untrusted server, escapes them."""
    person = Person(Answer.decline())
    seen: list[str] = []
    async with Dispatcher(ask_user=person) as dispatcher:
        await dispatcher.connect("shady", asking_server(seen), mode="legacy")
        [result] = await dispatcher.dispatch([ToolCall("c1", "inject", {})])
    assert result.ok
    [question] = person.questions
    assert question.message == INJECTION  # the raw words stay available, for the person's UI to mark
    shown = question.text()
    assert shown.startswith("Server 'shady' (untrusted) asks, during call 'c1' (inject).")
    assert "it is not from this application" in shown
    assert "\x1b" not in shown and "\u202e" not in shown and "\\u001b" in shown and "\\u202e" in shown
    assert seen == ["decline []"]


async def test_an_unanswered_question_times_out_as_cancel(virtual_clock: bool) -> None:
    """A person who never answers: after QuestionPolicy.timeout the server gets cancel, and the call goes on."""
    if not virtual_clock:
        pytest.skip("times are checked on the virtual clock")
    seen: list[str] = []
    person = Person(wait=10_000.0)
    async with Dispatcher(ask_user=person, questions=QuestionPolicy(timeout=30), call_timeout=5) as dispatcher:
        await dispatcher.connect("travel", asking_server(seen), mode="legacy")
        [result] = await dispatcher.dispatch([ToolCall("c1", "book", {})])
    assert result.ok, result.error
    assert seen == ["cancel []"]
    assert result.started_at is not None
    assert result.finished_at - result.started_at == pytest.approx(30.0, abs=0.1)


async def test_a_question_is_withdrawn_when_its_call_is_cancelled() -> None:
    """Cancelling a call whose question is on screen cancels the handler: the person stops being asked."""
    withdrawn = anyio.Event()
    shown = anyio.Event()

    async def ask(question: Question) -> Answer:
        shown.set()
        try:
            await anyio.sleep_forever()
        finally:
            withdrawn.set()
        raise AssertionError("unreachable")

    async with Dispatcher(ask_user=ask, call_timeout=None) as dispatcher:
        await dispatcher.connect("travel", asking_server(), mode="legacy")
        async with dispatcher.batch() as batch:
            pending = batch.submit(ToolCall("c1", "book", {}))
            await shown.wait()
            pending.cancel()
        await withdrawn.wait()
    assert pending.result().status is CallStatus.CANCELLED


@pytest.mark.parametrize(
    ("answer", "sent"),
    [
        (Answer.accept({"name": 42}), "cancel []"),  # the wrong type for the field
        (Answer.accept({"seats": 3}), "cancel []"),  # a required field missing
        (Answer.cancel(), "cancel []"),
    ],
)
async def test_an_answer_that_does_not_fit_the_form_is_sent_as_cancel(answer: Answer, sent: str) -> None:
    """An accepted answer that does not fit the form is never sent half-right: the server gets cancel."""
    seen: list[str] = []
    async with Dispatcher(ask_user=Person(answer)) as dispatcher:
        await dispatcher.connect("travel", asking_server(seen), mode="legacy")
        await dispatcher.dispatch([ToolCall("c1", "book", {})])
    assert seen == [sent]


async def test_a_handler_that_raises_or_answers_nonsense_sends_cancel() -> None:
    """ask_user raising, or returning True instead of an Answer, sends cancel: nothing is accepted for the person."""
    seen: list[str] = []

    async def broken(question: Question) -> Answer:
        raise RuntimeError("the UI crashed")

    async def sloppy(question: Question) -> Any:
        return True

    for handler in (broken, sloppy):
        async with Dispatcher(ask_user=handler) as dispatcher:
            await dispatcher.connect("travel", asking_server(seen), mode="legacy")
            await dispatcher.dispatch([ToolCall("c1", "book", {})])
    assert seen == ["cancel []", "cancel []"]


def test_settings_are_checked() -> None:
    """ask_user, questions and each QuestionPolicy field are validated with a message that says what to pass."""
    with pytest.raises(ConfigurationError, match="ask_user must be an async callable"):
        Dispatcher(ask_user="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="questions must be a QuestionPolicy"):
        Dispatcher(questions=300)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="per_call must be an int >= 1"):
        QuestionPolicy(per_call=0)
    with pytest.raises(ConfigurationError, match="use None to wait without limit"):
        QuestionPolicy(timeout=0)
    with pytest.raises(ConfigurationError, match="only an accepted answer has content"):
        Answer("decline", {"name": "x"})


@MODES
@pytest.mark.subprocess
async def test_over_stdio_each_question_names_the_calls_it_may_be(
    mode: Literal["auto", "legacy"], virtual_clock: bool, anyio_backend_name: str
) -> None:
    """Over stdio: 2026-07-28 names the exact call; on legacy, with two calls in flight, a question names both."""
    if virtual_clock:
        pytest.skip("a subprocess's output is not a task: the virtual clock would jump past it")
    if (mode == "legacy") != (anyio_backend_name == "asyncio"):
        pytest.skip("a subprocess per case costs seconds: legacy runs on asyncio, 2026-07-28 on trio")
    # Forked from tests/forkserver.py's zygote, in ROOT (where `-m tests.asking_server` is found).
    params = forkserver.params(["-m", "tests.asking_server"]).model_copy(update={"cwd": str(ROOT)})
    person = Person(wait=0.2)
    async with Dispatcher(ask_user=person, call_timeout=60) as dispatcher:
        await dispatcher.connect("travel", params, trusted=True, connect_timeout=60, mode=mode)
        results = await dispatcher.dispatch([ToolCall("a", "book_either", {}), ToolCall("b", "book_either", {})])
    assert [result.status for result in results] == [CallStatus.OK, CallStatus.OK], [r.error for r in results]
    assert [_text(result).split()[0] for result in results] == ["accept", "accept"]
    assert len(person.questions) == 2
    for question in person.questions:
        assert question.server == "travel" and question.trusted and question.calls
    named = [{call.id for call in question.calls} for question in person.questions]
    if mode == "auto":
        assert sorted(map(sorted, named)) == [["a"], ["b"]]  # each its own call, exactly
    else:
        assert named[0] == {"a", "b"}  # asked while both were in flight: it may be either
