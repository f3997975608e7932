"""Attacks on the one human channel (issue 25): re-entrant handlers, cancelled prompts, closes, ordering."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

from dispatcher import Answer, ApprovalPolicy, CallEvent, CallStatus, Dispatcher, Question, ToolCall

from . import forkserver
from .asking_server import asking_server
from .test_person import Screen as PersonScreen

if TYPE_CHECKING:
    from dispatcher import ApprovalRequest

pytestmark = [pytest.mark.anyio, pytest.mark.backends("asyncio", "trio", "trio-mockclock")]

ROOT = Path(__file__).resolve().parent.parent

# A read that talks to the open world: asked about under `ApprovalPolicy(open_world=True)`, and reads overlap,
# so the scheduler's own order never makes a nested call wait for the call whose prompt dispatched it.
LOOKUP = ToolAnnotations(read_only_hint=True, open_world_hint=True)
POLICY = ApprovalPolicy(open_world=True)


async def test_an_approver_that_dispatches_a_call_needing_approval_does_not_deadlock() -> None:
    """The approver's own dispatch on the same dispatcher is asked inside the prompt, not queued behind it."""
    asked: list[str] = []
    dispatcher = Dispatcher(call_timeout=None)

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(request.call.id)
        if request.call.id == "outer":
            (inner,) = await dispatcher.dispatch([ToolCall("inner", "save", {})])
            return inner.status is CallStatus.OK
        return True

    async def save() -> str:
        return "saved"

    dispatcher = Dispatcher(approve=approve, approval=POLICY, call_timeout=None)
    async with dispatcher:
        dispatcher.add_function(save, annotations=LOOKUP)
        with anyio.fail_after(30):
            (result,) = await dispatcher.dispatch([ToolCall("outer", "save", {})])
    assert result.status is CallStatus.OK, result.error
    assert asked == ["outer", "inner"]


async def test_a_question_handler_that_dispatches_a_call_needing_approval_does_not_deadlock() -> None:
    """ask_user looking something up through the dispatcher (a call needing approval) is not stuck behind itself."""
    asked: list[str] = []
    seen: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(f"approve {request.call.id}")
        return True

    async def lookup() -> str:
        return "Ada"

    async def ask(question: Question) -> Answer:
        asked.append("question")
        (name,) = await dispatcher.dispatch([ToolCall("lookup", "lookup", {})])
        return Answer.accept({"name": "Ada"}) if name.status is CallStatus.OK else Answer.decline()

    dispatcher = Dispatcher(approve=approve, ask_user=ask, approval=POLICY, call_timeout=None)
    async with dispatcher:
        await dispatcher.connect("travel", asking_server(seen), trusted=True, mode="legacy")
        dispatcher.add_function(lookup, annotations=LOOKUP)
        with anyio.fail_after(30):
            (result,) = await dispatcher.dispatch([ToolCall("r", "book", {})])
    assert result.status is CallStatus.OK, result.error
    assert asked == ["question", "approve lookup"]
    assert seen == ["accept [('meal', 'veg'), ('name', 'Ada'), ('seats', 2)]"]


async def test_prompts_of_cancelled_batches_leave_the_queue_and_the_next_prompt_is_shown() -> None:
    """A hung approval on screen and a question queued behind it: cancelling each batch frees the person."""
    shown: list[str] = []
    seen: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        shown.append(f"approve {request.call.id}")
        await anyio.sleep_forever()
        raise AssertionError

    async def ask(question: Question) -> Answer:
        assert question.call is not None
        shown.append(f"question {question.call.id}")
        return Answer.accept({"name": "Ada"})

    async def fetch() -> str:
        return "page"

    dispatcher = Dispatcher(
        approve=approve, ask_user=ask, approval=ApprovalPolicy(open_world=True, timeout=None), call_timeout=None
    )
    async with dispatcher:
        await dispatcher.connect("travel", asking_server(seen), trusted=True, mode="legacy")
        dispatcher.add_function(fetch, annotations=LOOKUP)
        person = dispatcher._person
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                hung, queued = anyio.CancelScope(), anyio.CancelScope()

                async def run(scope: anyio.CancelScope, call: ToolCall) -> None:
                    with scope:
                        await dispatcher.dispatch([call])

                tg.start_soon(run, hung, ToolCall("w", "fetch", {}))
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(run, queued, ToolCall("r", "book", {}))
                await anyio.wait_all_tasks_blocked()
                assert shown == ["approve w"] and person.waiting == 1
                queued.cancel()  # the question's call is gone while the question waits its turn
                await anyio.wait_all_tasks_blocked()
                assert person.waiting == 0
                hung.cancel()  # and the approval on screen is withdrawn with its batch
                await anyio.wait_all_tasks_blocked()
                assert not person.busy
            (result,) = await dispatcher.dispatch([ToolCall("r2", "book", {})])
    assert result.status is CallStatus.OK, result.error
    assert shown == ["approve w", "question r2"]  # never asked about the call that was gone


async def test_closing_the_dispatcher_while_a_prompt_is_on_screen_ends_it() -> None:
    """A close while the approver hangs (no timeout) and a question waits: the close returns, nothing is left."""
    shown: list[str] = []
    results: list[Any] = []

    async def approve(request: ApprovalRequest) -> bool:
        shown.append(f"approve {request.call.id}")
        await anyio.sleep_forever()
        raise AssertionError

    async def ask(question: Question) -> Answer:
        shown.append("question")
        return Answer.accept({"name": "Ada"})

    async def fetch() -> str:
        return "page"

    dispatcher = Dispatcher(
        approve=approve, ask_user=ask, approval=ApprovalPolicy(open_world=True, timeout=None), call_timeout=None
    )
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            async with dispatcher:
                await dispatcher.connect("travel", asking_server(), trusted=True, mode="legacy")
                dispatcher.add_function(fetch, annotations=LOOKUP)

                async def run(call: ToolCall) -> None:
                    results.extend(await dispatcher.dispatch([call]))

                tg.start_soon(run, ToolCall("w", "fetch", {}))
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(run, ToolCall("r", "book", {}))
                await anyio.wait_all_tasks_blocked()
    assert shown == ["approve w"]
    assert [(result.call.id, result.status) for result in results] == [
        ("w", CallStatus.CANCELLED),
        ("r", CallStatus.CANCELLED),
    ]
    assert not dispatcher._person.busy and dispatcher._person.waiting == 0


async def test_a_cancelled_batch_s_question_is_not_shown_when_its_approval_is_withdrawn() -> None:
    """One batch, a hung approval on screen and its read's question queued behind: cancelling it asks nothing."""
    shown: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        shown.append(f"approve {request.call.id}")
        await anyio.sleep_forever()
        raise AssertionError

    async def ask(question: Question) -> Answer:
        shown.append("question")
        return Answer.accept({"name": "Ada"})

    async def fetch() -> str:
        return "page"

    dispatcher = Dispatcher(
        approve=approve, ask_user=ask, approval=ApprovalPolicy(open_world=True, timeout=None), call_timeout=None
    )
    async with dispatcher:
        await dispatcher.connect("travel", asking_server(), trusted=True, mode="legacy")
        dispatcher.add_function(fetch, annotations=LOOKUP)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def run() -> None:
                    with scope:
                        await dispatcher.dispatch([ToolCall("w", "fetch", {}), ToolCall("r", "book", {})])

                tg.start_soon(run)
                await anyio.wait_all_tasks_blocked()
                assert shown == ["approve w"] and dispatcher._person.waiting == 1
                scope.cancel()
            for _ in range(5):
                await anyio.wait_all_tasks_blocked()
                await anyio.sleep(0.01)
    assert shown == ["approve w"]


class Screen(PersonScreen):
    """The person of tests/test_person.py, answering sooner, whose screen also says whether a question's
    server is trusted."""

    def __init__(self, wait: float = 0.01) -> None:
        super().__init__(wait)

    async def ask(self, question: Question) -> Answer:
        assert question.call is not None
        await self._show(f"question {question.call.id} {'trusted' if question.trusted else 'untrusted'}")
        return Answer.accept({"name": "Ada"})


async def test_two_batches_dispatched_together_show_their_approvals_one_at_a_time_each_in_its_order() -> None:
    """Concurrent batches on one dispatcher: never two prompts at once, each batch's approvals in its order."""
    screen = Screen()

    async def fetch() -> str:
        return "page"

    async with Dispatcher(approve=screen.approve, approval=POLICY, call_timeout=None) as dispatcher:
        dispatcher.add_function(fetch, annotations=LOOKUP)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for batch in "ab":
                    calls = [ToolCall(f"{batch}{n}", "fetch", {}) for n in range(4)]
                    tg.start_soon(dispatcher.dispatch, calls)
    assert screen.most_at_once == 1
    assert sorted(screen.shown) == [f"approve {b}{n}" for b in "ab" for n in range(4)]
    first = screen.shown[0].split()[1][0]
    second = "b" if first == "a" else "a"
    assert screen.shown == [f"approve {b}{n}" for b in (first, second) for n in range(4)]


async def test_a_flood_of_questions_from_concurrent_reads_cannot_bury_an_approval() -> None:
    """Eight reads asking at once: at most `waiting` are queued, one shown at a time; the approval gets its turn."""
    # Long enough that no read's question is answered before all have asked, on a loaded machine too.
    screen = Screen(wait=1.0)
    seen: list[str] = []

    async def fetch() -> str:
        return "page"

    dispatcher = Dispatcher(approve=screen.approve, ask_user=screen.ask, approval=POLICY, call_timeout=None)
    async with dispatcher:
        await dispatcher.connect("travel", asking_server(seen), trusted=True, mode="legacy")
        await dispatcher.connect("shady", asking_server(seen), trusted=False, mode="legacy")
        dispatcher.add_function(fetch, annotations=LOOKUP)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for n in range(8):
                    tg.start_soon(dispatcher.dispatch, [ToolCall(f"r{n}", "book", {})])
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(dispatcher.dispatch, [ToolCall("w", "fetch", {})])
            # The untrusted server's question is shown as such (its call needs approval: it counts as destructive).
            (untrusted,) = await dispatcher.dispatch([ToolCall("u", "shady__book", {})])
    assert untrusted.status is CallStatus.OK, untrusted.error
    assert screen.most_at_once == 1
    questions = [what for what in screen.shown if what.startswith("question r")]
    assert all(what.endswith(" trusted") for what in questions)
    assert sum(text.startswith("cancel") for text in seen) == 8 - len(questions)  # the rest was refused
    # Behind the questions already waiting (at most `QuestionPolicy.waiting`, 4), no further.
    assert screen.shown.index("approve w") <= 4
    assert screen.shown[-2:] == ["approve u", "question u untrusted"]


async def test_the_claude_permission_callback_takes_its_turn_with_the_servers_questions() -> None:
    """A Claude CLI permission prompt while a server's question is on screen waits for it: one prompt at a time."""
    pytest.importorskip("claude_agent_sdk")
    from claude_agent_sdk import PermissionResultAllow, ToolPermissionContext

    from dispatcher.integrations.claude_agent_sdk import claude_options

    screen = Screen(wait=1.0)

    async def save() -> str:
        return "saved"

    dispatcher = Dispatcher(approve=screen.approve, ask_user=screen.ask, call_timeout=None)
    async with dispatcher:
        await dispatcher.connect("travel", asking_server(), trusted=True, mode="legacy")
        dispatcher.add_function(save, annotations=ToolAnnotations(read_only_hint=False))
        can_use = claude_options(dispatcher)["can_use_tool"]
        answers: list[Any] = []
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(dispatcher.dispatch, [ToolCall("r", "book", {})])
                await anyio.wait_all_tasks_blocked()
                assert screen.showing == 1

                async def permission() -> None:
                    answers.append(await can_use("mcp__dispatcher__save", {}, ToolPermissionContext(tool_use_id="w")))

                tg.start_soon(permission)
    assert screen.most_at_once == 1
    assert screen.shown == ["question r trusted", "approve w"]
    assert [type(answer) for answer in answers] == [PermissionResultAllow]


async def test_a_question_of_a_call_that_ask_user_dispatched_nests_in_the_question_on_screen() -> None:
    """ask_user running a tool whose server asks its own question: the inner one is shown, not stuck behind."""
    shown: list[str] = []
    seen: list[str] = []

    async def ask(question: Question) -> Answer:
        assert question.call is not None
        shown.append(question.call.id)
        if question.call.id == "outer":
            (inner,) = await dispatcher.dispatch([ToolCall("inner", "book", {})])
            return Answer.accept({"name": "Ada"}) if inner.status is CallStatus.OK else Answer.decline()
        return Answer.accept({"name": "Bob"})

    dispatcher = Dispatcher(ask_user=ask, call_timeout=None)
    async with dispatcher:
        await dispatcher.connect("travel", asking_server(seen), trusted=True, mode="legacy")
        with anyio.fail_after(30):  # QuestionPolicy.timeout (300 s) would end the wait, the outer answer lost
            (result,) = await dispatcher.dispatch([ToolCall("outer", "book", {})])
    assert result.status is CallStatus.OK, result.error
    assert shown == ["outer", "inner"]
    assert [text.split()[0] for text in seen] == ["accept", "accept"] and "Ada" in seen[1] and "Bob" in seen[0]


@pytest.mark.subprocess
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # a subprocess costs seconds: one backend is enough
async def test_over_stdio_a_question_of_a_call_that_ask_user_dispatched_nests_in_the_question_on_screen() -> None:
    """Over stdio the question arrives in the connection's task: it still nests in the question on screen."""
    shown: list[str] = []

    async def ask(question: Question) -> Answer:
        shown.append(",".join(sorted(call.id for call in question.calls)))
        if len(shown) == 1:
            (inner,) = await dispatcher.dispatch([ToolCall("inner", "book", {})])
            return Answer.accept({"name": "Ada"}) if inner.status is CallStatus.OK else Answer.decline()
        return Answer.accept({"name": "Bob"})

    # Forked from tests/forkserver.py's zygote, in ROOT (where `-m tests.asking_server` is found).
    params = forkserver.params(["-m", "tests.asking_server"]).model_copy(update={"cwd": str(ROOT)})
    dispatcher = Dispatcher(ask_user=ask, call_timeout=60)
    async with dispatcher:
        await dispatcher.connect("travel", params, trusted=True, connect_timeout=60, mode="legacy")
        with anyio.fail_after(50):  # stuck behind itself, the outer question would wait for call_timeout
            (result,) = await dispatcher.dispatch([ToolCall("outer", "book", {})])
    assert result.status is CallStatus.OK, result.error
    assert shown == ["outer", "inner,outer"]  # on legacy the inner question may be either call's


def _lying_server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("liar")
    read = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=read)
    async def backwards(ctx: Context, every: float) -> str:
        """One real step, then numbers that never grow: back down, the same huge one again, a bogus token."""
        await anyio.sleep(every)
        await ctx.report_progress(1e308)
        session = ctx.request_context.session
        for value in [1.0, -1.0, 1e308, 0.0] * 20:
            await anyio.sleep(every)
            await ctx.report_progress(value)
            await session.send_progress_notification("not-a-token", value + 1e308, None, "bogus")
        return "done"

    @server.tool(annotations=read)
    async def growing(ctx: Context, steps: int, every: float) -> str:
        """Tiny steps above a huge start: each one grows."""
        for step in range(steps):
            await anyio.sleep(every)
            await ctx.report_progress(1e15 + step)
        return "done"

    return server


async def test_progress_that_never_grows_or_goes_to_an_unknown_token_does_not_keep_a_call_alive(
    virtual_clock: bool,
) -> None:
    """idle_timeout cuts a call whose reports go back, repeat a huge number or name a bogus token; growth keeps one."""
    if not virtual_clock:
        pytest.skip("times are checked on the virtual clock")
    events: list[CallEvent] = []
    async with Dispatcher(call_timeout=60, retry=None, on_event=events.append) as dispatcher:
        await dispatcher.connect("liar", _lying_server(), trusted=True, idle_timeout=1.0)
        started = anyio.current_time()
        cut, kept = await dispatcher.dispatch(
            [ToolCall("cut", "backwards", {"every": 0.5}), ToolCall("kept", "growing", {"steps": 8, "every": 0.5})]
        )
    assert cut.status is CallStatus.TIMEOUT and "idle_timeout" in (cut.error or "")
    assert kept.status is CallStatus.OK, kept.error
    assert anyio.current_time() - started == pytest.approx(4.0, abs=0.01)  # the growing call's 8 steps
    progress = [event.progress for event in events if event.kind == "progress" and event.call.id == "cut"]
    assert progress == [1e308]
