"""Coordination: the fleet-wide hold a call takes after its own dispatcher admitted it.

A `Dispatcher` orders and limits the calls of one process (`_gate.Gate`). Several processes sharing a
server need one more step: once the local gate admits a call, the worker asks the dispatcher's
`Coordinator` for a *hold* on the call's server, runs the call inside it, and releases it when the call
has settled::

    async with coordinator.hold(server="notes", exclusive=True, keys=(), on_lost=lost) as lease:
        ...  # run the call

The default is no coordinator: nothing is asked, the worker runs `Dispatcher._run` directly and a single
process pays nothing. `LocalCoordinator` is the explicit form of the same no-op. `RedisCoordinator`
(`dispatcher.fleet`) shares limits, shared-state exclusion and retry budgets across processes.

A coordinator reports failure in two ways, both values for the call rather than exceptions for the caller:

- `hold` raises `CoordinationError` when it cannot grant the hold (the coordination service is
  unreachable, or the wait was too long): the call settles FAILED with that reason and never runs;
- `on_lost(reason)` is called when a hold is lost while the call runs (its lease expired): the call is
  interrupted and settles with the reason, FAILED if its request had not left (`Ending.HOLD_LOST`, never
  ran), else TIMEOUT of unknown effect (`Ending.HOLD_LOST_IN_FLIGHT`: cancelled here, possibly still
  running on the server).

The hold hands the call a `Lease` (or None): `admitted_runner` puts it on the call record for the hold's
length, and the MCP invocation calls `Lease.confirm()` right before each request leaves (no await
between the check and the send) and sends the hold's fencing token where the server reads it
(`Lease.stamp`). A confirm that fails loses the hold there (the call settles HOLD_LOST, not sent). When
the call has settled, `Lease.abandoned` says whether it ended of unknown effect (sent, no answer), so the
coordinator can keep a write's turn while the server may still run it.

The retry budget is shared the same way: `retry_budget(server, capacity, refill)` returns the budget the
call's retries spend from, or None for the dispatcher's own local one.
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio

from .._core._calls import Effect
from .._core._errors import ConfigurationError, CoordinationError
from .._core._lifecycle import Ending, Moment
from ._retry import Budget

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Hashable
    from contextlib import AbstractAsyncContextManager

    from ._batch import PendingCall
    from ._retry import RetryBudget

__all__ = ["CoordinationError", "Coordinator", "Lease", "LocalCoordinator", "admitted_runner", "budget_factory"]


class Lease:
    """A fleet hold in force, as a coordinator keeps it: lost at most once, with the reason said once.

    The one record of a hold's loss: however many ways a coordinator notices it (a renewal refused, a
    lease about to end, the coordinator closing, the check before a send), the call's `on_lost` hears of
    it once.

    It is also what the hold hands to the call it covers (`hold` yields it): the call's invocation
    calls `confirm()` right before each request leaves and sends `token` where the server reads it
    (`stamp`), so a server can refuse the requests of a holder whose turn was handed on.

    Args:
        server: The server the hold is on.
        on_lost: What `hold` was given: told the reason when the hold is lost.
        margin: Seconds before `valid_until` from which a request is no longer sent.
        fence_argument: The argument that carries `token`, if the server reads it there.
        fence_meta: The request's `_meta` entry that carries `token`, if the server reads it there.
    """

    __slots__ = (
        "_on_lost",
        "abandoned",
        "fence_argument",
        "fence_meta",
        "held",
        "margin",
        "reason",
        "sent",
        "server",
        "token",
        "valid_until",
    )

    def __init__(
        self,
        server: str,
        on_lost: Callable[[str], None],
        *,
        margin: float = 0.0,
        fence_argument: str | None = None,
        fence_meta: str | None = None,
    ) -> None:
        self.server = server
        self._on_lost = on_lost
        self.reason: str | None = None
        """Why the hold was lost, or None while it holds."""
        self.token: int | None = None
        """The hold's fencing token: larger than that of every hold granted before it on the server."""
        self.valid_until = math.inf
        """Until when (loop clock) the holder is sure the coordinator keeps the hold."""
        self.held: int | None = None
        """How many holds the server had across the fleet once this one was granted (itself included),
        when the coordinator says; what an adaptive limit shared by the fleet counts as calls in flight."""
        self.margin = margin
        self.fence_argument = fence_argument
        self.fence_meta = fence_meta
        self.sent = False
        """Whether a request the hold covers was confirmed (and so sent): it may run on the server."""
        self.abandoned = False
        """Whether the call it covered ended after its request was sent and before its answer (effect
        unknown): the server may still be running it when the hold is given back."""

    def confirm(self) -> None:
        """Check, right before a request the hold covers is sent, that the hold cannot have ended.

        Synchronous, so nothing runs between the check and the send that follows it. The lease's end is
        measured from before the request that granted or renewed it was sent, so it is never later than
        the end the coordinator keeps.

        Raises:
            CoordinationError: The hold was lost, or its lease may end within `margin` (it is lost now).
        """
        if self.reason is None and anyio.current_time() >= self.valid_until - self.margin:
            self.lose("its lease could have ended before the request was sent (the process was late, or frozen)")
        if self.reason is not None:
            raise CoordinationError(self.reason)
        self.sent = True

    def stamp(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The arguments and the `_meta` to send: the fencing token added where the server reads it."""
        token = self.token
        if token is None:
            return arguments, None
        if self.fence_argument is not None:
            return {**arguments, self.fence_argument: token}, None
        if self.fence_meta is not None:
            return arguments, {self.fence_meta: token}
        return arguments, None

    @property
    def lost(self) -> bool:
        """Whether the hold was lost."""
        return self.reason is not None

    def lose(self, why: str) -> bool:
        """Mark the hold lost and tell its call, the first time; returns whether this call lost it."""
        if self.reason is not None:
            return False
        self.reason = reason = f"lost its fleet hold on server {self.server!r}: {why}"
        self._on_lost(reason)
        return True


@runtime_checkable
class Coordinator(Protocol):
    """What a dispatcher asks before it runs an admitted call: a hold on the call's server.

    Implementations must be safe to call from many tasks of one event loop at once.
    """

    def hold(
        self,
        *,
        server: str,
        exclusive: bool,
        keys: Collection[Hashable] = (),
        on_lost: Callable[[str], None],
    ) -> AbstractAsyncContextManager[Lease | None]:
        """Wait for the right to run one call on `server`; keep it for the length of the block.

        The block gets the hold as a `Lease` (its fencing token, the check before each send), or None
        when the hold has neither.

        Args:
            server: The dispatcher's name for the call's server (the same in every process of a fleet).
            exclusive: Whether the call may mutate (it then needs the server to itself where the
                server's state is shared).
            keys: The conflict keys of the call, when its dispatcher knows them; an implementation may
                treat the whole server as one key.
            on_lost: Called (from the event loop, at most once) with the reason if the hold is lost
                before the block ends.

        Raises:
            CoordinationError: The hold cannot be granted; the block does not run.
        """
        ...

    def retry_budget(self, server: str, capacity: float, refill: float) -> RetryBudget | None:
        """The retry budget shared by `server`'s calls, or None to use the dispatcher's local one."""
        ...


class LocalCoordinator:
    """One process on its own: every hold is granted at once and the retry budgets stay local.

    This is what a dispatcher does without a coordinator; passing it changes nothing (the dispatcher
    recognises it and skips the hook altogether).
    """

    __slots__ = ()

    @asynccontextmanager
    async def hold(
        self,
        *,
        server: str,
        exclusive: bool,
        keys: Collection[Hashable] = (),
        on_lost: Callable[[str], None],
    ) -> AsyncIterator[Lease | None]:
        """Grant the hold at once."""
        yield None

    def retry_budget(self, server: str, capacity: float, refill: float) -> RetryBudget | None:
        """None: the dispatcher keeps its own budget per server."""
        return None

    def __repr__(self) -> str:
        return "LocalCoordinator()"


def _check(coordinator: object) -> Coordinator | None:
    if coordinator is None or isinstance(coordinator, LocalCoordinator):
        return None
    if not isinstance(coordinator, Coordinator):
        raise ConfigurationError(
            f"coordinator must provide hold() and retry_budget() (a Coordinator such as "
            f"dispatcher.fleet.RedisCoordinator), got {type(coordinator).__name__}"
        )
    return coordinator


def admitted_runner(
    coordinator: object,
    run: Callable[[PendingCall], Awaitable[None]],
    call_timeout: float | None = None,
) -> Callable[[PendingCall], Awaitable[None]]:
    """What a worker calls to run an admitted call: `run` itself, or `run` inside a fleet-wide hold.

    Without a coordinator (or with `LocalCoordinator`) this is `run` unchanged, so a single process pays
    nothing for the hook.

    The wait for a fleet hold is bounded by `call_timeout` (besides the coordinator's own bound): a call
    that gets no hold in that time settles FAILED, never having run. Once held, the call's attempts get
    their own `call_timeout` each, as without a fleet: a run shortened by the wait would turn congestion
    into timed-out writes whose outcome is unknown, where a call that never ran is safe to ask again.

    Raises:
        ConfigurationError: `coordinator` is not a `Coordinator`.
    """
    checked = _check(coordinator)
    if checked is None:
        return run

    async def run_held(work: PendingCall) -> None:
        entry = work.entry
        if entry is None or entry.server is None or work.cancel_requested:
            await run(work)  # local functions are the process's own business
            return
        # The call's outer scope: cancelled by a lost lease, and by cancelling the call while it waits.
        # The call's keys are those its ticket holds in the local gate (set at submit, and changed there
        # when its tool is reclassified), so the fleet excludes what this process's gate excludes.
        ticket = work.ticket
        keys = ticket.keys if ticket is not None else ()
        with anyio.CancelScope() as scope:
            if call_timeout is not None:
                scope.deadline = anyio.current_time() + call_timeout  # lifted once the hold is granted
            await _held(work, entry.server, entry.exclusive, keys, scope)
        # Only the wait's deadline ends the block without a result (a cancel or a lost hold settles).
        work.settle(
            Ending.NO_HOLD,
            anyio.current_time(),
            f"no fleet hold on server {entry.server!r} within call_timeout={call_timeout}s; the call did not run",
        )

    async def _held(
        work: PendingCall, server: str, exclusive: bool, keys: tuple[str, ...], scope: anyio.CancelScope
    ) -> None:

        def lost(reason: str) -> None:
            # Settling interrupts the call where it is; the lease's own scope ends the block. A call whose
            # request may have left is abandoned with an unknown outcome, one whose request never left failed.
            ending = Ending.HOLD_LOST_IN_FLIGHT if work.moment is Moment.SENT else Ending.HOLD_LOST
            work.settle(ending, anyio.current_time(), reason)
            scope.cancel()

        # While it waits, cancelling the call (or closing the dispatcher) interrupts the wait.
        work.waiting(scope)
        acquired = False
        try:
            async with checked.hold(server=server, exclusive=exclusive, keys=keys, on_lost=lost) as lease:
                acquired = True
                scope.deadline = math.inf
                work.waiting(None)
                # Handed to the invocation, which confirms it and sends its token with each attempt.
                work.lease = lease
                try:
                    await run(work)
                finally:
                    work.lease = None
                    outcome = work.outcome
                    if lease is not None and outcome is not None and outcome.effect is Effect.UNKNOWN:
                        # Timed out, cancelled or cut off after its request left: it may still run there.
                        lease.abandoned = True
        except CoordinationError as exc:
            work.waiting(None)
            work.settle(Ending.NO_HOLD, anyio.current_time(), exc)
            if acquired:
                raise  # not raised by a well-behaved coordinator after the grant; do not hide it
        except BaseException:
            if not acquired:
                work.waiting(None)
                now = anyio.current_time()
                timed_out = not work.cancel_requested and now >= scope.deadline
                if not timed_out:
                    if work.cancel_requested:
                        work.settle(Ending.CANCELLED, now, "while waiting for its fleet hold")
                    else:
                        work.settle(Ending.CLOSED, now)
            raise

    return run_held


def budget_factory(coordinator: object) -> Callable[[str | None, float, float], RetryBudget]:
    """How a dispatcher makes the retry budget of a server: shared by the coordinator, or its own."""
    checked = _check(coordinator)

    def local(server: str | None, capacity: float, refill: float) -> RetryBudget:
        return Budget(capacity, refill)

    if checked is None:
        return local

    def shared(server: str | None, capacity: float, refill: float) -> RetryBudget:
        budget = checked.retry_budget(server, capacity, refill) if server is not None else None
        return budget if budget is not None else Budget(capacity, refill)

    return shared
