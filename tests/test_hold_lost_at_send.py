"""A fleet hold lost around the send: the call settles once, the batch carries on.

`Lease.confirm()` settles the call (its `on_lost`) and then raises, so the attempt fails after its call
has settled; so does an answer that arrives in the same loop turn as a lease's end (the lifecycle's
`failed_attempt` on a settled call changes nothing: tests/test_lifecycle.py). Every call gets its one
result (FAILED, not sent), nothing reaches the server, and the dispatcher stays usable. A loaded machine
makes the real Redis coordinator do both (a lease within its margin when the request is about to leave).
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest

from dispatcher import CallStatus, Dispatcher, Effect, ToolCall
from dispatcher._driver._coordination import Lease
from dispatcher.examples import Workspace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Hashable

    from dispatcher._driver._retry import RetryBudget

pytestmark = pytest.mark.anyio


class _Expiring:
    """A coordinator whose leases have ended by the time their request would leave, while `expired`."""

    def __init__(self) -> None:
        self.expired = True
        self.granted = 0

    @asynccontextmanager
    async def hold(
        self,
        *,
        server: str,
        exclusive: bool,
        keys: Collection[Hashable] = (),
        on_lost: Callable[[str], None],
    ) -> AsyncIterator[Lease | None]:
        lease = Lease(server, on_lost, margin=0.5)
        lease.token = self.granted = self.granted + 1
        lease.valid_until = -math.inf if self.expired else math.inf
        yield lease

    def retry_budget(self, server: str, capacity: float, refill: float) -> RetryBudget | None:
        return None


async def test_a_hold_lost_at_the_send_settles_each_call_once_and_sends_nothing() -> None:
    workspace = Workspace()
    coordinator = _Expiring()
    calls = [
        ToolCall("r1", "search_notes", {"query": "a"}),
        ToolCall("w1", "set_note", {"name": "a", "text": "late"}),
        ToolCall("r2", "search_notes", {"query": "b"}),
        ToolCall("w2", "set_note", {"name": "b", "text": "late"}),
    ]
    async with Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        results = await dispatcher.dispatch(calls)
        assert [result.call_id for result in results] == ["r1", "w1", "r2", "w2"]
        for result in results:
            assert result.status is CallStatus.FAILED, (result.call_id, result.status, result.error)
            assert result.error is not None and "could have ended before the request was sent" in result.error
            assert result.effect is Effect.NEVER_RAN, result.call_id
        assert not workspace.ledger, "a call whose hold was lost at the send reached the server"
        assert coordinator.granted == len(calls)
        # The dispatcher is still whole: with leases that hold, the same calls run.
        coordinator.expired = False
        again = await dispatcher.dispatch(calls)
        assert [result.status for result in again] == [CallStatus.OK] * len(calls), [r.error for r in again]
        assert [run.tool for run in workspace.ledger].count("set_note") == 2
