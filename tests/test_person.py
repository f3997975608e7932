"""One human channel: approvals and servers' questions reach the person one prompt at a time, in a stable order."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations

from dispatcher import Answer, ApprovalPolicy, CallEvent, CallStatus, Dispatcher, Question, ToolCall
from dispatcher._driver import _person
from dispatcher._driver._person import Person

from .asking_server import asking_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dispatcher import ApprovalRequest

pytestmark = [pytest.mark.anyio, pytest.mark.backends("asyncio", "trio", "trio-mockclock")]


class Screen:
    """The person: an approver and an `ask_user` that record what is on screen, and answer after `wait` s."""

    def __init__(self, wait: float = 0.05) -> None:
        self.wait = wait
        self.shown: list[str] = []
        self.showing = 0
        self.most_at_once = 0

    async def _show(self, what: str) -> None:
        self.shown.append(what)
        self.showing += 1
        self.most_at_once = max(self.most_at_once, self.showing)
        try:
            await anyio.sleep(self.wait)
        finally:
            self.showing -= 1

    async def approve(self, request: ApprovalRequest) -> bool:
        await self._show(f"approve {request.call.id}")
        return True

    async def ask(self, question: Question) -> Answer:
        assert question.call is not None
        await self._show(f"question {question.call.id}")
        return Answer.accept({"name": "Ada"})


def _unqueued(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle's broken channel: every prompt is shown at once."""

    @asynccontextmanager
    async def turn(self: Person, ticket: int | None = None, *, within: object = None) -> AsyncIterator[None]:
        await anyio.lowlevel.checkpoint()
        yield

    monkeypatch.setattr(_person.Person, "turn", turn)


@pytest.mark.parametrize("queued", [True, False])
async def test_questions_of_concurrent_reads_and_a_write_s_approval_are_shown_one_at_a_time(
    queued: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reads asking questions and a write waiting for approval: one prompt at a time (False: the oracle)."""
    if not queued:
        _unqueued(monkeypatch)
    screen = Screen()
    events: list[CallEvent] = []
    saved: list[str] = []

    async def save(text: str) -> str:
        saved.append(text)
        return "saved"

    async with Dispatcher(
        approve=screen.approve,
        ask_user=screen.ask,
        approval=ApprovalPolicy(mutating=True),
        on_event=events.append,
        call_timeout=None,
    ) as dispatcher:
        await dispatcher.connect("travel", asking_server(), trusted=True, mode="legacy")
        dispatcher.add_function(save, annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
        calls = [ToolCall("r1", "book", {}), ToolCall("r2", "book", {}), ToolCall("w", "save", {"text": "x"})]
        results = await dispatcher.dispatch(calls)
    assert [result.status for result in results] == [CallStatus.OK] * 3, [r.error for r in results]
    assert saved == ["x"]
    assert sorted(screen.shown) == ["approve w", "question r1", "question r2"]
    assert (screen.most_at_once == 1) is queued
    if not queued:
        return
    # The write's approval was asked for as the batch was submitted, before any read asked: it comes first.
    assert screen.shown[0] == "approve w"
    # The events say the same: each prompt's pair of events closes before the next prompt opens.
    prompts = [
        (event.kind, event.call.id)
        for event in events
        if event.kind in ("approval_asked", "approval_answered", "question_asked", "question_answered")
    ]
    assert len(prompts) == 6
    for opened, closed in zip(prompts[::2], prompts[1::2], strict=True):
        assert opened[0].endswith("_asked") and closed[0].endswith("_answered") and opened[1] == closed[1]
    asked = [event for event in events if event.kind == "question_asked"]
    assert [event.message for event in asked] == ["Who travels, and how many seats?"] * 2
    answered = [event for event in events if event.kind == "question_answered"]
    assert [event.error for event in answered] == [None, None]


async def test_prompts_asked_at_the_same_moment_are_shown_in_ticket_order() -> None:
    """Tasks started together show their prompts in the order their tickets were taken, whatever the loop does."""
    person = Person()
    shown: list[int] = []

    async def prompt(ticket: int) -> None:
        async with person.turn(ticket):
            shown.append(ticket)
            await anyio.lowlevel.checkpoint()

    tickets = [person.ticket() for _ in range(8)]
    async with anyio.create_task_group() as tg:
        for ticket in reversed(tickets):  # started in the reverse order of their tickets
            tg.start_soon(prompt, ticket)
    assert shown == tickets
    assert person.shown == 8 and person.waiting == 0 and not person.busy


async def test_a_withdrawn_prompt_frees_its_place_and_the_next_one_is_shown() -> None:
    """Cancelling a waiting prompt removes it; cancelling the shown one lets the next one be shown."""
    person = Person()
    shown: list[str] = []
    release = anyio.Event()

    async def prompt(name: str, scope: anyio.CancelScope | None = None) -> None:
        with scope if scope is not None else anyio.CancelScope():
            async with person.turn():
                shown.append(name)
                await release.wait()

    first, second = anyio.CancelScope(), anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(prompt, "first", first)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(prompt, "second", second)
        tg.start_soon(prompt, "third")
        await anyio.wait_all_tasks_blocked()
        assert shown == ["first"] and person.waiting == 2
        second.cancel()  # withdrawn while it waits
        await anyio.wait_all_tasks_blocked()
        assert person.waiting == 1
        first.cancel()  # withdrawn while shown: the next one waiting is shown
        await anyio.wait_all_tasks_blocked()
        assert shown == ["first", "third"]
        release.set()
    assert not person.busy and person.waiting == 0


async def test_an_approval_s_timeout_counts_from_when_it_is_shown(virtual_clock: bool) -> None:
    """An approval that waits its turn behind a long question is not timed out by the wait."""
    if not virtual_clock:
        pytest.skip("times are checked on the virtual clock")
    shown: list[tuple[str, float]] = []
    asking = anyio.Event()

    async def ask(question: Question) -> Answer:
        shown.append(("question", anyio.current_time()))
        asking.set()
        await anyio.sleep(50)  # longer than the approval's own timeout
        return Answer.accept({"name": "Ada"})

    async def approve(request: ApprovalRequest) -> bool:
        shown.append(("approve", anyio.current_time()))
        return True

    async def save() -> str:
        return "saved"

    results: list[Any] = []
    async with Dispatcher(
        approve=approve, ask_user=ask, approval=ApprovalPolicy(mutating=True, timeout=10), call_timeout=None
    ) as dispatcher:
        await dispatcher.connect("travel", asking_server(), trusted=True, mode="legacy")
        dispatcher.add_function(save, annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
        async with anyio.create_task_group() as tg:

            async def run(call: ToolCall) -> None:
                results.extend(await dispatcher.dispatch([call]))

            tg.start_soon(run, ToolCall("r", "book", {}))
            await asking.wait()
            tg.start_soon(run, ToolCall("w", "save", {}))
    assert [result.status for result in results] == [CallStatus.OK, CallStatus.OK], [r.error for r in results]
    assert [what for what, _ in shown] == ["question", "approve"]
    assert shown[1][1] - shown[0][1] == pytest.approx(50)
