"""The lifecycle of one call, from its submission to its one result.

Everything that changes a call's phase lives in this file (as h11's `_state.py` holds a connection's): a
`CallRecord` per call and its transitions; the `Phase`s, the one table that turns how a call ended into its
status and error, and the one builder of a `ToolResult` are its data, in `_outcomes` (re-exported here), and
`settle` is the one place that builder is called. It does no I/O and imports no event loop:
the driver (`_execution`) asks it for every change and carries out the waiting, the gate (`_gate`) decides
when a call may start.

The rule
--------
A call is in one phase at a time, and moves only forward along these arrows::

    QUEUED ──admit──> ADMITTED ──start──> RUNNING
      │  ▲               │                  │
    hold release         │                  │
      ▼  │               │                  │
    AWAITING_APPROVAL    │                  │
      │                  │                  │
      └──────────────────┴───── settle ─────┴──> SETTLED

(QUEUED, AWAITING_APPROVAL, ADMITTED and RUNNING all settle; only SETTLED is final.) `settle` is the
only way into SETTLED and the only place a `ToolResult` is built; once a call is SETTLED every
transition is refused (`settle` and `failed_attempt` return False, the others raise `LifecycleError`), so a call settles
exactly once whatever races to end it: a cancellation and an answer, a deadline and a lost fleet hold.
Call sites never check whether a call has ended before ending it: the first ending wins, by structure.

How a call ended is an `Ending` (what happened) read in the phase it happened in (when): before its
tool was sent anything (QUEUED, AWAITING_APPROVAL, ADMITTED), while an attempt ran (RUNNING), or after
its answer (SETTLED: nothing changes). `OUTCOMES` maps each (ending, phase) to the status and error the
call gets; a pair missing from it is a bug of the driver (a call denied while it runs, an answer before
it started) and raises `LifecycleError` instead of giving a result. An answered attempt brings its own
status (OK or TOOL_ERROR from the tool's answer, FAILED or TIMEOUT from how it failed: `_failures`).

Whether the call's effect happened (`Effect`) is read from a second, smaller table, `EFFECTS`, by the
last `Moment` the call reached: nothing sent yet (NEVER_RAN), its request possibly sent (UNKNOWN), the
tool's answer received (RAN). The moment moves forward only: `sent` is called by the boundary with the
tool (`mark_sent`, just before the SDK or the local function is handed the request: `_mcp`,
`_connections`, `_functions`), and an answer is a `CallToolResult` the attempt returned. Nothing a server
sends can move it back: an error instead of a result after the send reads UNKNOWN, and a later attempt
that was not sent leaves an earlier attempt's UNKNOWN as it is. A call that settles before it runs never
left the client (NEVER_RAN) whatever ended it.

When the call settles, its owner (the batch, see `Owner`) is told, once, with the result; the record then
drops what it held for running (the gate's ticket, the tool, the prepared arguments, the owner itself), so
a settled call holds no cycle and is freed by reference counting alone.

Cost: every transition is O(1); `settle` builds one result (its slots set directly, unrolled: see
`build_result`) and cuts an error text longer than `MAX_ERROR` once.
"""

from __future__ import annotations

import bisect
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ._calls import CallStatus, Effect, ToolResult, quoted_id
from ._errors import LifecycleError, ToolUnavailableError
from ._gate import ROOT_KEYS, conflicts
from ._outcomes import EFFECTS as EFFECTS
from ._outcomes import MAX_ERROR as MAX_ERROR
from ._outcomes import OUTCOMES as OUTCOMES
from ._outcomes import Ending as Ending
from ._outcomes import Moment as Moment
from ._outcomes import Phase as Phase
from ._outcomes import build_result as build_result

if TYPE_CHECKING:
    from collections.abc import Callable

    from mcp.types import CallToolResult

    from .._driver._hooks import CallHooks
    from .._driver._observe import CallState
    from ._calls import ToolCall
    from ._catalog import ToolEntry, ToolImpl
    from ._gate import Ticket

__all__ = [
    "EFFECTS",
    "MAX_ERROR",
    "OUTCOMES",
    "CallRecord",
    "Dependency",
    "build_result",
    "Ending",
    "FailFast",
    "Interrupt",
    "LifecycleError",
    "Moment",
    "Owner",
    "Phase",
    "done_sending",
    "mark_sent",
    "request_meta",
]

_sending: ContextVar[CallRecord | None] = ContextVar("dispatcher_sending", default=None)

# The members the transitions compare with and set, read once here: on Python 3.11 each read of an Enum class's
# attribute (`Phase.SETTLED`) goes through the metaclass's `__getattr__` hook, about 45 ns, and a call's
# usual path through its transitions read some twenty of them.
_QUEUED = Phase.QUEUED
_AWAITING_APPROVAL = Phase.AWAITING_APPROVAL
_ADMITTED = Phase.ADMITTED
_RUNNING = Phase.RUNNING
_SETTLED = Phase.SETTLED
_BEFORE_SEND = Moment.BEFORE_SEND
_SENT = Moment.SENT
_GOT_ANSWER = Moment.ANSWERED
_ANSWERED = Ending.ANSWERED
_OK = CallStatus.OK
_TOOL_ERROR = CallStatus.TOOL_ERROR


def mark_sent() -> None:
    """The request of the call this task runs may reach its tool from now on (see `Moment.SENT`).

    Called by each tool implementation at the last point before which nothing can have reached the
    tool: just before it hands the request to the SDK (which may write it at once), or calls the
    local function. Outside a call (a listing, a ping), it does nothing.
    """
    record = _sending.get()
    if record is not None:
        record.sent()


def request_meta() -> dict[str, Any] | None:
    """The `_meta` entries the dispatcher adds to the request of the call this task runs, or None."""
    record = _sending.get()
    return None if record is None else record.meta


def done_sending() -> None:
    """This task runs no call any more: forget it (a settled call must not be kept alive by its task)."""
    _sending.set(None)


class Owner(Protocol):
    """Who is told, once, that a call settled (its batch)."""

    def settled(self, record: CallRecord, result: ToolResult) -> None:
        """`record` has its result `result`."""


class Interrupt(Protocol):
    """What interrupts whatever a call waits for or runs under (the driver's cancel scope)."""

    def cancel(self) -> None:
        """Interrupt it."""


class CallRecord:
    """One call's lifecycle: its phase and what it holds in each.

    The attributes are read by the driver and the batch; only this class's methods change them.

    Args:
        call: The call.
        owner: Told when the call settles.
        hooks: The batch's hooks, or None.
        queued_at: When it was submitted (loop clock).
    """

    __slots__ = (
        "attempts",
        "call",
        "cancel_requested",
        "depends_on",
        "entry",
        "errors",
        "hooks",
        "impl",
        "interrupt",
        "keyed",
        "keys",
        "meta",
        "moment",
        "outcome",
        "owner",
        "phase",
        "position",
        "prepared",
        "queued_at",
        "repeat_check",
        "started_at",
        "state",
        "ticket",
        "untrusted",
    )

    def __init__(self, call: ToolCall, owner: Owner, hooks: CallHooks | None, queued_at: float) -> None:
        self.call = call
        self.phase = _QUEUED
        self.queued_at = queued_at
        self.started_at: float | None = None
        self.owner: Owner | None = owner
        self.hooks = hooks
        # Only calls of a batch with hooks (approvals, a guard, events, tracing) have a state.
        self.state: CallState | None = None
        self.entry: ToolEntry | None = None
        self.impl: ToolImpl | None = None
        self.prepared: Any = None
        self.ticket: Ticket[Any] | None = None
        # Its conflict keys as the gate last had them (kept after it settles, for `FailFast`), and
        # its place in its batch.
        self.keys: tuple[str, ...] = ROOT_KEYS
        self.position = 0
        # The request's `_meta` entries of the dispatcher's own (an idempotency key), or None.
        self.meta: dict[str, Any] | None = None
        # Whether its request carries an idempotency key (in its arguments or `meta`).
        self.keyed = False
        # Asked as a repeated attempt is about to be sent: why it may no longer be repeated, or None.
        self.repeat_check: Callable[[], str | None] | None = None
        self.interrupt: Interrupt | None = None
        # The id of the call of its batch whose failure it depended on, once fail-fast skips it.
        self.depends_on: str | None = None
        self.cancel_requested = False
        self.attempts = 0
        self.moment = _BEFORE_SEND
        self.errors: list[str] | None = None
        # Whether an error quotes text a server wrote, so far (see `ToolResult.untrusted_content`).
        self.untrusted = False
        self.outcome: ToolResult | None = None

    # Before it starts ------------------------------------------------------------------------------

    def observe(self, state: CallState) -> None:
        """Keep the hooks' state of this call."""
        self.state = state

    def resolve(self, entry: ToolEntry, impl: ToolImpl | None = None) -> None:
        """Take the catalogue entry (and tool) the call resolved to, or follow its entry's new definition."""
        if self.phase is not _QUEUED:
            self._expect(Phase.QUEUED, Phase.AWAITING_APPROVAL, what="resolve")
        self.entry = entry
        # Until its own keys are known (its ticket's), a call's keys are its tool's whole domain: a
        # write rejected for its arguments or its key function conflicts with what its domain holds,
        # not with everything (`FailFast`). A tool with no domain has the root key.
        domain = entry.domain
        self.keys = (domain,) if domain is not None else ROOT_KEYS
        if impl is not None:
            self.impl = impl

    def prepare(self, prepared: Any) -> None:
        """Keep the call's arguments, checked and converted for its tool."""
        if self.phase is not _QUEUED:
            self._expect(Phase.QUEUED, what="prepare")
        self.prepared = prepared

    def carry_key(self, *, meta: dict[str, Any] | None = None) -> None:
        """The call carries its idempotency key: in `meta`, or (None) in the arguments it is prepared with."""
        self._expect(Phase.QUEUED, what="carry a key")
        if meta is not None:
            self.meta = meta
        self.keyed = True

    def skip(self, keys: tuple[str, ...], dependency: Dependency, now: float) -> bool:
        """Fail-fast: settle a waiting call as SKIPPED, for the failure `dependency` (`FailFast.blocker`).

        It keeps the conflict keys it has (its ticket's, or those it was found to have as it was
        submitted): a skipped call that may mutate is a failure in turn, and what conflicts with it is
        what its own keys conflict with, not everything.
        """
        if self.phase is not _SETTLED:
            self.keys = keys
            self.depends_on = dependency.call_id
        return self.settle(Ending.SKIPPED, now, dependency.why)

    def enter(self, ticket: Ticket[Any], *, held: bool) -> None:
        """Take the call's place in the gate: waiting its turn, or `held` while its approval is asked."""
        if self.phase is not _QUEUED:
            self._expect(Phase.QUEUED, what="enter")
        self.ticket = ticket
        if held:
            self.phase = _AWAITING_APPROVAL

    def hold(self) -> None:
        """A queued call waits again for an approval (its definition changed while it waited)."""
        self._expect(Phase.QUEUED, Phase.AWAITING_APPROVAL, what="hold")
        self.phase = _AWAITING_APPROVAL

    def release(self) -> None:
        """Its approval was given: the call waits for its turn."""
        self._expect(Phase.AWAITING_APPROVAL, what="release")
        self.phase = _QUEUED

    def admit(self) -> None:
        """The gate let the call start."""
        if self.phase is not _QUEUED:
            self._expect(Phase.QUEUED, what="admit")
        self.phase = _ADMITTED

    def waiting(self, interrupt: Interrupt | None) -> None:
        """What to cancel to interrupt what the call waits for or runs under (None: nothing any more).

        A settled call waits for nothing: given one, it interrupts it at once.
        """
        if self.phase is _SETTLED:
            if interrupt is not None:
                interrupt.cancel()
            return
        self.interrupt = interrupt

    def request_cancel(self) -> None:
        """The caller cancels an admitted or running call: interrupt it; it settles where it was."""
        if self.phase is _SETTLED:
            return
        self.cancel_requested = True
        interrupt = self.interrupt
        if interrupt is not None:
            interrupt.cancel()

    # Running ---------------------------------------------------------------------------------------

    def start(self, now: float) -> bool:
        """The call's first attempt starts at `now`; False if the call settled before (nothing starts).

        An admitted call can settle before it starts, from outside its task: its fleet hold lost.
        """
        if self.phase is _SETTLED:
            return False
        if self.phase is not _ADMITTED:
            self._expect(Phase.ADMITTED, what="start")
        self.phase = _RUNNING
        self.started_at = now
        # The tool's implementation, awaited in this task, marks the send through this (`mark_sent`);
        # the driver clears it when the call's task is done with it (`done_sending`).
        _sending.set(self)
        return True

    def begin(self, interrupt: Interrupt, now: float) -> bool:
        """`waiting(interrupt)`, `start(now)` and `attempted()` in one step, for a call that waits for nothing
        between them: False if the call settled before (its interrupt is cancelled at once, nothing starts)."""
        phase = self.phase
        if phase is _SETTLED:
            interrupt.cancel()
            return False
        if phase is not _ADMITTED:
            self._expect(Phase.ADMITTED, what="start")
        self.interrupt = interrupt
        self.phase = _RUNNING
        self.started_at = now
        self.attempts += 1
        _sending.set(self)  # see `start`
        return True

    def attempted(self) -> None:
        """An attempt starts (the first one with `start`)."""
        if self.phase is not _RUNNING:
            self._expect(Phase.RUNNING, what="attempt")
        self.attempts += 1

    def sent(self) -> None:
        """The running attempt's request may reach the tool from now on (`mark_sent`).

        A repeated attempt is sent only if the call may still be repeated (`repeat_check`), read once
        nothing can change before the send: a reconnect on the way to it may have brought a new
        definition of its tool (one that no longer takes the key, or is no longer idempotent).

        Raises:
            ToolUnavailableError: The attempt is a repeat the call may no longer make; nothing was sent.
        """
        if self.phase is _RUNNING:
            check = self.repeat_check
            if check is not None and self.attempts > 1:
                why = check()
                if why is not None:
                    raise ToolUnavailableError(f"not repeated: {why}, so repeating it could apply it twice")
            self.moment = _SENT

    def failed_attempt(self, error: str) -> bool:
        """An attempt ended without success, for `error`; False (nothing changes) once the call settled.

        A call can settle while its attempt's failure is on its way back (its fleet hold was lost and the
        failure came back before the cancellation landed, or `Lease.confirm` settled it right before the
        send, then raised): like a late answer, it changes nothing.
        """
        if self.phase is _SETTLED:
            return False
        self._expect(Phase.RUNNING, what="fail an attempt")
        if self.errors is None:
            self.errors = [error]
        else:
            self.errors.append(error)
        return True

    # Ending ----------------------------------------------------------------------------------------

    def answered(self, result: CallToolResult, error: str | None, now: float) -> bool:
        """The call's only (or last) attempt got the tool's answer: OK, or TOOL_ERROR with `error`."""
        status = _OK if error is None else _TOOL_ERROR
        return self._settle(_ANSWERED, status, error, result, now)

    def ended(
        self,
        status: CallStatus,
        error: str | None,
        now: float,
        *,
        result: CallToolResult | None = None,
        untrusted: bool = False,
    ) -> bool:
        """The call's last attempt ended with this status (see `Ending.ANSWERED`); `untrusted`: its error
        quotes a server."""
        if untrusted and self.phase is not _SETTLED:
            self.untrusted = True
        return self._settle(_ANSWERED, status, error, result, now)

    def finished(
        self, status: CallStatus, error: str | None, now: float, result: CallToolResult | None, untrusted: bool
    ) -> bool:
        """`waiting(None)` and `ended` in one step: the call waits for nothing any more, its last attempt ended."""
        phase = self.phase
        if phase is _SETTLED:
            return False
        if phase is not _RUNNING:  # refused before anything changes: the interrupt is still cancelled later
            raise LifecycleError(f"call {self.call.id!r} cannot be answered while {phase.name}")
        self.interrupt = None
        if untrusted:
            self.untrusted = True
        return self._settle(_ANSWERED, status, error, result, now)

    def settle(self, ending: Ending, now: float, detail: object = "", *, untrusted: bool = False) -> bool:
        """End the call as `ending`, read in its current phase (`OUTCOMES`).

        Returns:
            Whether this settled it: False if it had settled already (nothing changes).

        Raises:
            LifecycleError: `ending` cannot happen in the call's phase.
        """
        if self.phase is _SETTLED:
            return False
        found = OUTCOMES.get((ending, self.phase))
        if found is None:
            raise LifecycleError(f"call {self.call.id!r} cannot end as {ending.value} while {self.phase.name}")
        if ending is Ending.HOLD_LOST and self.moment is Moment.BEFORE_SEND:
            found = OUTCOMES[ending, Phase.ADMITTED]  # nothing of the call was sent: it cannot be running
        status, template = found
        if untrusted:
            self.untrusted = True
        return self._settle(ending, status, template.format(detail), None, now)

    def _settle(
        self, ending: Ending, status: CallStatus, error: str | None, result: CallToolResult | None, now: float
    ) -> bool:
        phase = self.phase
        if phase is _SETTLED:
            return False
        if ending is _ANSWERED and phase is not _RUNNING:
            raise LifecycleError(f"call {self.call.id!r} cannot be answered while {phase.name}")
        errors = self.errors
        if errors is None:
            earlier: tuple[str, ...] = ()
        elif ending is _ANSWERED and error is not None:
            earlier = tuple(errors[:-1])  # the last attempt's error is the call's
        else:
            earlier = tuple(errors)
        if error is not None and len(error) > MAX_ERROR:
            # A tool or server can put anything in its error text; the full text stays in `result`.
            error = f"{error[:MAX_ERROR]}... ({len(error):,} characters in all)"
        entry = self.entry
        untrusted = self.untrusted or (
            # Anything an open-world tool sent back, errors included, may carry instructions.
            self.attempts > 0 and entry is not None and bool(entry.annotations.open_world_hint)
        )
        if result is not None and phase is _RUNNING:
            self.moment = _GOT_ANSWER
        self.phase = _SETTLED
        self.outcome = outcome = build_result(
            self.call,
            status,
            result,
            error,
            self.attempts,
            entry.name if entry is not None else None,
            entry.server if entry is not None else None,
            self.queued_at,
            self.started_at,
            now,
            earlier,
            untrusted,
            EFFECTS[self.moment],
            entry is None or not entry.annotations.read_only_hint,
            self.depends_on,
        )
        # A settled call waits for nothing: an approval still being asked, a fleet hold being waited for.
        interrupt = self.interrupt
        if interrupt is not None:
            self.interrupt = None
            interrupt.cancel()
        # Drop what running needed; the owner last, after telling it (a settled call holds no cycle).
        self.prepared = None
        self.repeat_check = None
        ticket = self.ticket
        if ticket is not None:
            self.keys = ticket.keys
            self.ticket = None
        self.errors = None
        owner = self.owner
        self.owner = None
        assert owner is not None
        owner.settled(self, outcome)
        return True

    def _expect(self, *phases: Phase, what: str) -> None:
        # The hot transitions test their usual phase inline and call this only when it is not that one.
        if self.phase not in phases:
            raise LifecycleError(f"call {self.call.id!r} cannot {what} while {self.phase.name}")

    def __repr__(self) -> str:
        return f"<CallRecord {self.call.id!r} {self.phase.name}>"


def _at(failure: tuple[int, tuple[str, ...], Dependency]) -> int:
    return failure[0]


class Dependency(NamedTuple):
    """The failed call a skipped call depended on: its id (`ToolResult.depends_on`), and why (its error)."""

    call_id: str
    why: str


class FailFast:
    """The failed calls of one batch that later calls conflicting with them depend on (opt-in, sans I/O).

    A call that may mutate (`ToolResult.mutating`) and did not end OK (failed, a tool error, timed out,
    denied, of unknown effect, skipped itself) is a failure, except a call cancelled before it ran (the
    caller gave up on it, as on the rest of a cancelled batch) and a call that resolved to no tool (an
    unknown tool: it changed nothing, and nothing is known of it, neither its effect class, which is
    only the safe default, nor its keys, so it would hold the root key and stop every later call of the
    batch, the independent ones too, for a name the model got wrong). A later call of the batch (a higher
    `CallRecord.position`) whose keys conflict with a failure's (`_gate.conflicts`: the same key, a key
    under it, or the root key, which every call without declared keys has) is not run: the driver settles
    it as `Ending.SKIPPED` (`CallRecord.skip`) with the earliest such failure, by position, as the
    `Dependency` its result names (`ToolResult.depends_on`). A call that conflicts with none runs as usual.

    Cost: noting a failure is an insertion in position order (an append when failures end in order);
    `blocker` scans the failures in that order and stops at the first that conflicts.
    """

    __slots__ = ("_failed",)

    def __init__(self) -> None:
        self._failed: list[tuple[int, tuple[str, ...], Dependency]] = []

    def failed(self, record: CallRecord, result: ToolResult) -> bool:
        """Note a settled call of the batch; True if it is a failure later calls may depend on."""
        if result.status is CallStatus.OK or not result.mutating:
            return False
        if result.status is CallStatus.CANCELLED and result.effect is Effect.NEVER_RAN:
            return False
        if result.tool is None:  # an unknown tool: nothing ran, and it has no keys to depend on
            return False
        if result.effect is Effect.UNKNOWN:
            how = f"ended with an unknown outcome ({result.status.value}: it may or may not have happened)"
        elif result.effect is Effect.NEVER_RAN:
            how = f"was not run ({result.status.value})"
        else:
            how = f"failed ({result.status.value})"
        tool = result.tool or result.call.name
        why = f"it depends on call {quoted_id(result.call.id)} ({tool}), which {how}"
        # Kept in position order (failures mostly settle in it, so this is an append), so that a call
        # depending on several is told of the earliest, whatever order they ended in.
        bisect.insort(self._failed, (record.position, record.keys, Dependency(result.call.id, why)), key=_at)
        return True

    def blocker(self, position: int, keys: tuple[str, ...]) -> Dependency | None:
        """The earliest failure a call at `position` with `keys` conflicts with (it must not run), or None."""
        for at, failed_keys, dependency in self._failed:
            if at < position and conflicts(failed_keys, keys):
                return dependency
        return None

    def __bool__(self) -> bool:
        return bool(self._failed)
