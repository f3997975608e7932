"""What a batch does around its calls besides running them: approvals, the session guard, events, spans.

A batch has a `CallHooks` only when something is configured (an approver, a guard, an event hook or a
tracer); otherwise the scheduler's only cost is one ``None`` check at each hook point.

The dispatcher calls `submitted` with its catalogue when a batch is created, so the session guard counts
the definitions of every untrusted server's tools the model has been shown (see `_approval`). The
scheduler calls, for each call of a hooked batch:

- `queued` when the call is submitted (before it is checked, so every call is seen, failed ones too);
- `approval` just before it enters the gate: a request means "submit it held and ask now". All the
  requests of a batch are asked as the calls are submitted, while calls that need none start; they reach
  the person one at a time, in turn with servers' questions (`_person`);
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
    from ._person import Person

__all__ = ["CallHooks"]


class CallHooks:
    """The hooks of one batch (or of every batch of a dispatcher that has no per-batch settings)."""

    __slots__ = ("approver", "guard", "observer", "person", "policy")

    def __init__(
        self,
        *,
        approver: Approver | None,
        policy: ApprovalPolicy,
        guard: SessionGuard | None,
        observer: Observer | None,
        person: Person | None = None,
    ) -> None:
        self.approver = approver
        # The one human channel the approver's prompts take turns on (None: each is asked at once).
        self.person = person
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
        if reason is None:
            return None
        self._take_turn(state)
        return ApprovalRequest(call, entry, reason)

    def recheck(self, call: ToolCall, state: CallState) -> ApprovalRequest | None:
        """The approval the session guard now requires of a call about to start, if any."""
        state.recheck = False
        guard = self.guard
        entry = state.entry
        if guard is None or entry is None or not guard.tripped:
            return None
        self._take_turn(state)
        return ApprovalRequest(call, entry, guard.reason(entry))

    def _take_turn(self, state: CallState) -> None:
        # The request's place with the person, taken now: a batch's approvals are shown in its order.
        if self.person is not None:
            state.prompt = self.person.ticket()

    async def ask(self, request: ApprovalRequest, state: CallState) -> str | None:
        """Ask the approver, once the person is free; None if approved, else the denial for the call's result.

        The policy's timeout counts from when the approver is asked, not while the request waits its turn.
        """
        if self.approver is None or self.person is None:
            return await self._ask(request, state)
        async with self.person.turn(state.prompt):
            return await self._ask(request, state)

    async def _ask(self, request: ApprovalRequest, state: CallState) -> str | None:
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
