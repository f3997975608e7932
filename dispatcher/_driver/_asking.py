"""Asking and changes: the executor's handling of held calls' approvals and of tools that change under queued calls.

`Approvals` is the part of the executor (`_execution.Executor` derives from it) that waits on a person:
a held call's approval is asked in a task of its own (`_ask`, `_approve`) while the call keeps its
place in the gate, and the session guard's last check is asked as a call starts (`_approve_at_start`).
When a server's tools are listed again, the calls of theirs not started follow their current
definition (`accepted`): reclassified in the gate, asked again when the approval policy now selects them,
and an approval given about a definition the call no longer has authorises nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from .._core._errors import KeyRuleError
from .._core._gate import TicketState
from .._core._keys import call_keys
from .._core._lifecycle import Ending, Phase

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskGroup

    from .._core._catalog import Catalog, ToolEntry
    from .._core._gate import Gate, Ticket
    from ._approval import ApprovalRequest
    from ._batch import Batch, PendingCall

__all__ = ["WAITING", "Approvals"]

WAITING = (TicketState.PENDING, TicketState.HELD)
"""The states of a ticket whose call waits for its turn (queued, or held for an approval)."""


class Approvals:
    """The executor's approvals and changed definitions (see the module's description)."""

    gate: Gate[PendingCall]
    live: set[Batch]
    _catalog: Catalog
    _tg: TaskGroup | None
    _open: bool
    _now: Callable[[], float]

    def _pump(self) -> None:
        """Start a task for each call the gate admits now (the executor's)."""
        raise NotImplementedError

    def accepted(self, server: str, tools: list[str]) -> None:
        """A server's tools reached the catalogue: calls of theirs not started follow their current entry.

        A changed definition is approved (accepted, or by imported pins) while calls queued under the
        old one wait: a call queued while its tool was read-only, whose tool is now mutating, waits for
        an exclusive turn at its place in the order, and is put to the approver if the policy now
        selects it; a call whose approval is being asked is asked again with the new definition once
        the answer comes (see `_approve`). Costs one pass over the unfinished calls, at each listing of
        a server's tools.
        """
        if not self.live:
            return
        listed = set(tools)
        changed = False
        for batch in list(self.live):
            for work in batch._works:
                entry = work.entry
                ticket = work.ticket
                if ticket is None or entry is None or ticket.state not in WAITING:
                    continue
                if entry.server != server or entry.tool not in listed:
                    continue
                new = self._catalog.get(server, entry.tool)
                if new is None or new == entry:
                    continue
                self._reclassify(work, ticket, new)
                changed = True
        if changed and self._open:
            self._pump()

    def _reclassify(self, work: PendingCall, ticket: Ticket[PendingCall], entry: ToolEntry) -> None:
        arguments = work.call.arguments if work.call.arguments is not None else {}
        try:
            keys = call_keys(entry, arguments)
        except KeyRuleError as exc:
            self.gate.withdraw(ticket)
            work.settle(Ending.REJECTED, self._now(), f"invalid conflict keys: {exc}")
            return
        work.resolve(entry)
        hooks = work.hooks
        state = work.state
        request = None
        if hooks is not None and state is not None:
            state.entry = entry
            state.keys = keys
            if work.phase is Phase.QUEUED:
                # A held call is asked again once its current answer comes (`_approve`); a queued one
                # may need asking now.
                request = hooks.approval(work.call, entry, state)
        self.gate.reclassify(ticket, exclusive=entry.exclusive, keys=keys, held=True if request is not None else None)
        if request is not None:
            work.hold()
            self._ask(work, request)

    def _ask(self, work: PendingCall, request: ApprovalRequest) -> None:
        tg = self._tg
        assert tg is not None
        tg.start_soon(self._approve, work, request)

    async def _approve(self, work: PendingCall, request: ApprovalRequest) -> None:
        """Ask for a held call's approval, then release it to take its turn, or deny it.

        An approval binds to the definition the person was shown: if the call's tool changed while it
        was asked (`accepted`), the call is asked again about the definition it has now, the session
        guard included, and an answer about the old one authorises nothing.
        """
        hooks = work.hooks
        state = work.state
        assert hooks is not None and state is not None
        while True:
            # Cancelling the call (see `cancel`) or settling it cancels this scope: the approver stops being asked.
            with anyio.CancelScope() as scope:
                work.waiting(scope)
                denial = await hooks.ask(request, state)
            ticket = work.ticket
            if work.phase is not Phase.AWAITING_APPROVAL or ticket is None:
                return  # settled meanwhile (cancelled, or its new definition cannot be queued)
            work.waiting(None)
            if denial is not None:
                self.gate.withdraw(ticket)
                work.settle(Ending.DENIED, self._now(), denial)
                break
            entry = work.entry
            assert entry is not None
            if self._shown(request, entry):
                self.gate.release(ticket)
                work.release()
                break
            # Approved, but for a definition the call no longer has.
            again = hooks.approval(work.call, entry, state)
            if again is None:
                self.gate.release(ticket)
                work.release()
                break
            request = again
        if self._open:
            self._pump()

    @staticmethod
    def _shown(request: ApprovalRequest, entry: ToolEntry) -> bool:
        """Whether an approval was asked about the definition the call has now."""
        return request.tool is entry

    async def _approve_at_start(self, work: PendingCall) -> bool:
        """Ask the approval the session guard may now require of a call about to start.

        Returns:
            Whether the call was denied (and settled).
        """
        hooks = work.hooks
        state = work.state
        assert hooks is not None and state is not None
        request = hooks.recheck(work.call, state)
        if request is None:
            return False
        denial = await hooks.ask(request, state)
        entry = work.entry
        assert entry is not None
        if denial is None and self._catalog.get(entry.server, entry.tool) not in (entry, None):
            # Its definition changed while it was asked: what was approved is not what would run.
            denial = (
                f"not run: the definition of tool {entry.name!r} changed while its approval was asked; "
                "submit the call again to be asked about the new one"
            )
        if denial is None:
            return False
        work.settle(Ending.DENIED, self._now(), denial)
        return True
