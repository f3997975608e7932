"""Attacks on the one human channel (issue 25): re-entrant handlers, cancelled prompts, closes, ordering."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
import trio.testing
from mcp.types import ToolAnnotations

from dispatcher import Answer, ApprovalPolicy, CallStatus, Dispatcher, Question, ToolCall

from .asking_server import asking_server

if TYPE_CHECKING:
    from dispatcher import ApprovalRequest

pytestmark = pytest.mark.anyio

# A read that talks to the open world: asked about under `ApprovalPolicy(open_world=True)`, and reads overlap,
# so the scheduler's own order never makes a nested call wait for the call whose prompt dispatched it.
LOOKUP = ToolAnnotations(read_only_hint=True, open_world_hint=True)
POLICY = ApprovalPolicy(open_world=True)


@pytest.fixture(params=["asyncio", "trio", "trio-mockclock"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Both backends, and trio on a virtual clock that jumps whenever every task is blocked."""
    if request.param == "trio-mockclock":
        return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})
    return request.param


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
