"""What a batch does around its calls besides running them: approvals, the session guard, events, spans.

A batch has a `CallHooks` only when something is configured (an approver, a guard, an event hook or a
tracer); otherwise the scheduler's only cost is one ``None`` check at each hook point.

The dispatcher calls `submitted` with its catalogue when a batch is created, so the session guard counts
the definitions of every untrusted server's tools the model has been shown (see `_approval`). The
scheduler calls, for each call of a hooked batch:

- `queued` when the call is submitted (before it is checked, so every call is seen, failed ones too);
- `approval` just before it enters the gate: a request means "submit it held and ask now". All the
  requests of a batch are asked at once, as the calls are submitted, while calls that need none start;
- `recheck` when the call is about to start: the session guard may have tripped since it was submitted
  (an open-world write waits for everything before it, which may include the reads that trip it);
- `attempt_started` / `attempt_finished` around each attempt, in the task that runs it;
- `settled` when the call has its result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._approval import ApprovalPolicy, ApprovalRequest, Approver, SessionGuard, ask, writes_open_world
from ._observe import CallState, Observer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .._core._calls import CallStatus, ToolCall, ToolResult
    from .._core._catalog import ToolEntry

__all__ = ["CallHooks"]


class CallHooks:
    """The hooks of one batch (or of every batch of a dispatcher that has no per-batch settings)."""

    __slots__ = ("approver", "guard", "observer", "policy")

    def __init__(
        self,
        *,
        approver: Approver | None,
        policy: ApprovalPolicy,
        guard: SessionGuard | None,
        observer: Observer | None,
    ) -> None:
        self.approver = approver
        self.policy = policy
        self.guard = guard
        self.observer = observer

    def submitted(self, catalogue: Iterable[ToolEntry]) -> None:
        """A batch is submitted against this catalogue: the model has read its tools' definitions."""
        if self.guard is not None:
            self.guard.note_catalogue(catalogue)

    def queued(self, call: ToolCall, entry: ToolEntry | None, time: float) -> CallState:
        state = CallState(entry)
        if self.observer is not None:
            self.observer.queued(call, state, time)
        return state

    def approval(self, call: ToolCall, entry: ToolEntry, state: CallState) -> ApprovalRequest | None:
        """The approval to ask for before the call may start, if any."""
        reason = self.policy.reason(entry) if self.approver is not None else None
        guard = self.guard
        if guard is not None and writes_open_world(entry):
            if guard.tripped:
                reason = guard.reason(entry)
            else:
                state.recheck = True
        return ApprovalRequest(call, entry, reason) if reason is not None else None

    def recheck(self, call: ToolCall, state: CallState) -> ApprovalRequest | None:
        """The approval the session guard now requires of a call about to start, if any."""
        state.recheck = False
        guard = self.guard
        entry = state.entry
        if guard is None or entry is None or not guard.tripped:
            return None
        return ApprovalRequest(call, entry, guard.reason(entry))

    async def ask(self, request: ApprovalRequest, state: CallState) -> str | None:
        """Ask the approver; None if approved, else the denial for the call's result."""
        if self.observer is not None:
            self.observer.approval_asked(request, state)
        denial = await ask(self.approver, request, self.policy.timeout)
        if self.observer is not None:
            self.observer.approval(state, request, denial)
        return denial

    def attempt_started(self, call: ToolCall, state: CallState, time: float) -> None:
        if self.observer is not None:
            self.observer.attempt_started(call, state, time)
        else:
            state.attempt += 1

    def attempt_finished(self, state: CallState, status: CallStatus, error: str | None) -> None:
        if self.observer is not None:
            self.observer.attempt_finished(state, status, error)

    def settled(self, state: CallState, result: ToolResult) -> None:
        guard = self.guard
        if guard is not None and state.entry is not None:
            guard._observe(state.entry, result)
        if self.observer is not None:
            self.observer.finished(state, result)
