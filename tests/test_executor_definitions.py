"""A tool that changes while its call is under way, through a real in-process MCP server that re-lists it.

- An approval binds to the definition the person was shown: a call whose tool changes while its
  approval is being asked is asked again about the new definition (and the session guard looks again);
  the first answer authorises nothing.
- Retry eligibility holds at every attempt: before each retry the tool's effective annotations are read
  again from the catalogue, so a tool whose idempotentHint was withdrawn during the backoff is not tried
  again, and its result says why.

Each guarantee is checked with its safety switched off too, to show that the check sees the difference.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp.types import ToolAnnotations

from dispatcher import ApprovalRequest, CallStatus, Dispatcher, RetryPolicy, ToolCall
from dispatcher._driver._execution import Executor
from dispatcher.examples import FaultConfig, Workspace

pytestmark = pytest.mark.anyio

# set_note as the workspace declares it (destructive, idempotent), and the same without idempotence.
IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)
NOT_IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)
OPEN_WORLD = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True)

SET = ToolCall("s", "set_note", {"name": "todo", "text": "ship it"})


class Reviewer:
    """`on_definition_change`: says whether to accept, and lets a test wait until a change has arrived."""

    def __init__(self, accept: bool) -> None:
        self.accept = accept
        self.arrived = anyio.Event()

    def __call__(self, change: object) -> bool:
        self.arrived.set()
        return self.accept


async def _relist(workspace: Workspace, reviewer: Reviewer, annotations: ToolAnnotations) -> None:
    """Change set_note's annotations on the server, tell the client, and wait until the dispatcher took it."""
    reviewer.arrived = anyio.Event()
    workspace.set_annotations("set_note", annotations)
    await workspace.notify_tools_changed()
    with anyio.fail_after(10):
        await reviewer.arrived.wait()
    await anyio.wait_all_tasks_blocked()  # accepted (or left blocked) and applied to the catalogue


def _executions(workspace: Workspace) -> int:
    assert workspace.faults is not None
    return sum(1 for run in workspace.faults.ledger if run.tool == "set_note" and run.body_ran)


@pytest.mark.parametrize("safety", [True, False], ids=["bound", "safety-off"])
@pytest.mark.parametrize("second", [True, False], ids=["approved-again", "denied-again"])
async def test_a_call_whose_tool_changes_while_it_is_approved_is_asked_again(
    monkeypatch: pytest.MonkeyPatch, safety: bool, second: bool
) -> None:
    """The server makes set_note open-world while its approval is on screen: the approval given for the old
    definition does not let it run; the person is asked again with the new one, whose answer decides."""
    if not safety:
        monkeypatch.setattr(Executor, "_shown", staticmethod(lambda request, entry: True))
    workspace = Workspace(faults=FaultConfig(rate=0.0))
    reviewer = Reviewer(accept=True)
    asked: list[ToolAnnotations] = []

    async with Dispatcher() as d:

        async def approve(request: ApprovalRequest) -> bool:
            asked.append(request.tool.annotations)
            if len(asked) == 1:
                await _relist(workspace, reviewer, OPEN_WORLD)  # the definition changes while this is asked
                assert next(e for e in d.tools() if e.tool == "set_note").annotations == OPEN_WORLD
                return True
            return second

        await d.connect("ws", workspace.server, trusted=True, on_definition_change=reviewer)
        (result,) = await d.dispatch([SET], approve=approve)
    if not safety:
        # The old behaviour the check must catch: one approval, of a definition that is not the one run.
        assert asked == [IDEMPOTENT] and result.ok and _executions(workspace) == 1
        return
    assert asked == [IDEMPOTENT, OPEN_WORLD], "not asked again with the new definition"
    if second:
        assert result.ok and _executions(workspace) == 1
    else:
        assert result.status is CallStatus.DENIED and _executions(workspace) == 0


async def test_a_change_left_unaccepted_while_approved_never_runs_the_new_definition() -> None:
    """A change not accepted leaves the changed tool blocked: approving the old definition runs nothing."""
    workspace = Workspace(faults=FaultConfig(rate=0.0))
    reviewer = Reviewer(accept=False)
    asked: list[ToolAnnotations] = []

    async with Dispatcher() as d:

        async def approve(request: ApprovalRequest) -> bool:
            asked.append(request.tool.annotations)
            await _relist(workspace, reviewer, OPEN_WORLD)
            assert d.pending_changes()
            return True

        await d.connect("ws", workspace.server, trusted=True, on_definition_change=reviewer)
        (result,) = await d.dispatch([SET], approve=approve)
    assert asked == [IDEMPOTENT]
    assert result.status is CallStatus.FAILED and "blocked" in (result.error or ""), result
    assert _executions(workspace) == 0


@pytest.mark.parametrize("safety", [True, False], ids=["rechecked", "safety-off"])
async def test_a_retry_is_not_made_once_idempotence_is_withdrawn_during_the_backoff(
    monkeypatch: pytest.MonkeyPatch, safety: bool
) -> None:
    """set_note fails transiently; while the retry waits, the server withdraws its idempotentHint: the call
    is not tried again, its result says why, and the server ran it once."""
    if not safety:
        monkeypatch.setattr(Executor, "_still_eligible", lambda self, policy, entry, keyed=False: None)
    workspace = Workspace(faults=FaultConfig(rate=0.0))
    assert workspace.faults is not None
    workspace.faults.fail_next("set_note", "error")
    # The relisting below must land within the backoff: 4 s is a generous band on a loaded machine.
    retry = RetryPolicy(attempts=3, wait_initial=4.0, wait_max=4.0, jitter=False, timeout=None)

    reviewer = Reviewer(accept=True)
    async with Dispatcher(retry=retry) as d:
        await d.connect("ws", workspace.server, trusted=True, on_definition_change=reviewer)
        results: list[Any] = []

        async def call() -> None:
            results.extend(await d.dispatch([SET]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(10):
                # The fault injector's ledger has no event to wait on.
                while not any(run.outcome == "error" for run in workspace.faults.ledger):  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            await _relist(workspace, reviewer, NOT_IDEMPOTENT)  # within the 4 s backoff
            assert next(e for e in d.tools() if e.tool == "set_note").annotations == NOT_IDEMPOTENT
    (result,) = results
    if not safety:
        assert result.ok and result.attempts == 2  # retried under a withdrawn idempotentHint
        return
    assert result.status is CallStatus.FAILED and result.attempts == 1, result
    assert "not retried: tool 'set_note' is no longer declared idempotent" in (result.error or ""), result.error
    assert sum(1 for run in workspace.faults.ledger if run.tool == "set_note") == 1
