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

from typing import TYPE_CHECKING, Literal

from .._core import _checks as checks
from .._core._errors import ConfigurationError
from ._approval import ApprovalPolicy, ApprovalRequest, Approver, SessionGuard, ask, writes_open_world
from ._batch import Batch
from ._observe import CallState, Observer, resolve_tracer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from opentelemetry.trace import TracerProvider

    from .._core._calls import CallStatus, ToolCall, ToolResult
    from .._core._catalog import Catalog, ToolEntry
    from ._execution import Executor
    from ._observe import CallEvent
    from ._person import Person

__all__ = ["BatchDefaults", "CallHooks", "check_approvals"]


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


def check_approvals(approve: object, approval: object, guard: object) -> None:
    """Raise `ConfigurationError` unless each of a dispatcher's or a batch's approval settings is of its kind."""
    if approve is not None and not callable(approve):
        raise ConfigurationError(
            f"approve must be an async callable taking an ApprovalRequest and returning a bool, got {approve!r}"
        )
    if approval is not None and not isinstance(approval, ApprovalPolicy):
        raise ConfigurationError(f"approval must be an ApprovalPolicy, got {type(approval).__name__}")
    if guard is not None and not isinstance(guard, SessionGuard):
        raise ConfigurationError(f"guard must be a SessionGuard, got {type(guard).__name__}")


class BatchDefaults:
    """A dispatcher's own approval settings, event hook, tracer and ``fail_fast``, and each batch built from them."""

    __slots__ = (
        "_on_event",
        "_tracer_provider",
        "approval",
        "approve",
        "fail_fast",
        "guard",
        "hooks",
        "observer",
        "person",
    )

    def __init__(
        self,
        *,
        approve: Approver | None,
        approval: ApprovalPolicy | None,
        guard: SessionGuard | None,
        on_event: Callable[[CallEvent], object] | None,
        tracer_provider: TracerProvider | None,
        fail_fast: object,
        person: Person,
    ) -> None:
        check_approvals(approve, approval, guard)
        if on_event is not None and not callable(on_event):
            raise ConfigurationError(f"on_event must be a callable taking a CallEvent, got {on_event!r}")
        self._on_event = on_event
        self._tracer_provider = tracer_provider
        self.approve = approve
        self.approval = approval if approval is not None else ApprovalPolicy()
        self.guard = guard
        self.fail_fast = checks.flag("fail_fast", fail_fast)
        self.person = person
        self.observer: Observer | None = None
        # The hooks of batches that set none of their own; None when nothing is configured.
        self.hooks: CallHooks | None = None

    def start(self, limits: Callable[[str | None], tuple[int, Literal["server", "fleet"]] | None]) -> None:
        """The dispatcher is entered: build its observer, reading servers' adaptive limits from `limits`."""
        # Resolved on entry, so a tracer provider configured after construction is still found.
        tracer = resolve_tracer(self._tracer_provider)
        observer = self.observer = None
        if tracer is not None or self._on_event is not None:
            observer = self.observer = Observer(self._on_event, tracer, limits=limits)
        if observer is not None or self.approve is not None or self.guard is not None:
            self.hooks = CallHooks(
                approver=self.approve, policy=self.approval, guard=self.guard, observer=observer, person=self.person
            )

    def batch(
        self,
        executor: Executor,
        catalog: Catalog,
        approve: Approver | None,
        approval: ApprovalPolicy | None,
        guard: SessionGuard | None,
        fail_fast: object,
    ) -> Batch:
        """A new batch on `executor` with these settings (None: the dispatcher's)."""
        fail = self.fail_fast if fail_fast is None else checks.flag("fail_fast", fail_fast)
        return Batch(executor, self.for_batch(catalog, approve, approval, guard), fail_fast=fail)

    async def ask(
        self, approver: Approver | None, request: ApprovalRequest, approval: ApprovalPolicy | None
    ) -> str | None:
        """What `Dispatcher.ask_approval` does: ask in turn with the person's other prompts."""
        policy = approval if approval is not None else self.approval
        async with self.person.turn():
            return await policy.ask(approver, request)

    def for_batch(
        self, catalog: Catalog, approve: Approver | None, approval: ApprovalPolicy | None, guard: SessionGuard | None
    ) -> CallHooks | None:
        """The hooks of a batch with these settings (None: the dispatcher's), told of the catalogue it is shown."""
        (approval if isinstance(approval, ApprovalPolicy) else self.approval).check(catalog)
        hooks = self.hooks
        if approve is not None or approval is not None or guard is not None:
            check_approvals(approve, approval, guard)
            hooks = CallHooks(
                approver=approve if approve is not None else self.approve,
                policy=approval if approval is not None else self.approval,
                guard=guard if guard is not None else self.guard,
                observer=self.observer,
                person=self.person,
            )
        if hooks is not None and hooks.guard is not None:
            hooks.submitted(catalog.shown())
        return hooks
