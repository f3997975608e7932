"""Execution: how a submitted call is admitted, run and settled.

`Executor` carries out the gate's decisions (`_gate.Gate`: a fair readers-writer discipline with limits)
with runner tasks in the dispatcher's task group: a runner that finishes a call takes the next admitted
one itself and parks when there is none, and a new runner starts only when no parked one is left (a
measured choice: starting a task per call costs more, see docs/benchmarks.md). A runner runs a call's attempts
as the retry policy decides (a call that may not be retried has a policy of one attempt), each attempt
under a cancel scope whose deadline is the call timeout, and settles the call. Cancelling a call cancels
the scope around its attempts.

Every call settles exactly once into a `ToolResult`. Failures are results, never exceptions that could
cancel siblings. Cancelling a waiting caller cancels that caller's calls, waits until they have ended,
and then lets the cancellation propagate.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ._batch import Batch, PendingCall
from ._calls import CallStatus, settled_result
from ._catalog import ArgumentError
from ._coordination import admitted_runner, budget_factory
from ._errors import DispatcherClosedError
from ._failures import ToolUnavailableError
from ._failures import describe as describe_failure
from ._gate import Gate, Ticket, TicketState
from ._keys import KeyRuleError, call_keys
from ._loop import (
    Wakeup,
    absorb_own_cancellation,
    loop_clock,
    own_cancellation_pending,
    own_cancellations,
    wakeups,
    withdraw_cancellation,
)
from ._retry import Attempt, Retrier, RetryBudget, RetryPolicy, eligible, is_transient

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from anyio.abc import TaskGroup
    from mcp.types import CallToolResult

    from ._approval import ApprovalRequest
    from ._calls import ToolCall
    from ._catalog import Catalog, Resolution, ToolEntry
    from ._hooks import CallHooks
    from ._observe import CallState

__all__ = ["Executor", "settle"]

_WAITING = (TicketState.PENDING, TicketState.HELD)

# The longest `ToolResult.error` kept; a longer explanation is cut, saying how long it was.
_MAX_ERROR = 1000

# Seconds of submitting calls after which `submit_yielding` lets the loop run, and how many calls it
# submits between two readings of the clock.
_SLICE = 0.002
_SLICE_CHECK = 32

# The policy of a call that may not be retried: one attempt, bounded by the call timeout alone.
_ONE_ATTEMPT = RetryPolicy(attempts=1, timeout=None, jitter=False, budget=None)

# How much later than its call timeout a call may be cut off (the larger of these), so that a run of
# short calls seldom moves the deadline of the runner's cancel scope (each move reschedules a timer).
_DEADLINE_SLACK = 0.002
_DEADLINE_SLACK_SHARE = 0.001

# The most runners woken or started at once for calls the gate may admit (see `Executor._pump`).
_FANOUT = 64


def settle(
    work: PendingCall,
    status: CallStatus,
    *,
    result: CallToolResult | None = None,
    error: str | None = None,
    attempts: int = 0,
    attempt_errors: tuple[str, ...] = (),
    untrusted: bool = False,
    now: float | None = None,
) -> None:
    """Give a call its one result, tell its hooks and waiters, and count it done in its batch.

    `now` is the loop clock's reading, if the caller has it at hand.
    """
    entry = work._entry
    if error is not None and len(error) > _MAX_ERROR:
        # A tool or server can put anything in its error text; the full text stays in `result`.
        error = f"{error[:_MAX_ERROR]}... ({len(error):,} characters in all)"
    work._result = settled = settled_result(
        work.call,
        status,
        result,
        error,
        attempts,
        entry.name if entry is not None else None,
        entry.server if entry is not None else None,
        work.queued_at,
        work.started_at,
        anyio.current_time() if now is None else now,
        attempt_errors,
        # Anything an open-world tool sent back, errors included, may carry instructions.
        untrusted or (attempts > 0 and entry is not None and bool(entry.annotations.open_world_hint)),
    )
    work._prepared = None
    # Drop the references that make cycles (call <-> batch, call <-> ticket): a finished batch is
    # then freed by reference counting instead of waiting for the garbage collector.
    work._ticket = None
    batch = work._batch
    work._batch = None
    if work._state is not None:
        hooks = work._hooks
        assert hooks is not None
        hooks.settled(work._state, settled)
    waiters = work._waiters
    if waiters is not None:
        work._waiters = None
        for wakeup in waiters:
            wakeup.set()
    assert batch is not None, "a call settles once"
    batch._settled()


class Executor:
    """Admits, runs and settles the calls of every batch of one dispatcher.

    Args:
        catalog: Where call names resolve to tools.
        max_concurrency: The most calls running at once, or None for no limit.
        call_timeout: Seconds each attempt may take, or None.
        retry: The retry policy, or None to never retry.
    """

    def __init__(
        self,
        catalog: Catalog,
        *,
        max_concurrency: int | None,
        call_timeout: float | None,
        retry: RetryPolicy | None,
        coordinator: object = None,
    ) -> None:
        self._catalog = catalog
        self._call_timeout = call_timeout
        self._slack = max(_DEADLINE_SLACK, call_timeout * _DEADLINE_SLACK_SHARE) if call_timeout is not None else 0.0
        self._retry = retry
        self._budgets: dict[str | None, RetryBudget] = {}
        # A fleet coordinator wraps each admitted call in its fleet-wide hold; without one, nothing is added.
        self._run_admitted = admitted_runner(coordinator, self._execute, call_timeout)
        # Without a coordinator, a call of one attempt runs directly on its runner (`_run_one`).
        self._direct = self._run_admitted == self._execute
        self._new_budget = budget_factory(coordinator)
        self._rng = random.Random(retry.seed if retry is not None else None)
        self.gate: Gate[PendingCall] = Gate(max_concurrency)
        self.live: set[Batch] = set()
        """The batches that have calls without a result."""
        self._tg: TaskGroup | None = None
        self._open = False
        self._clock = anyio.current_time
        # Parked runners, each waiting on its event; `_spare`: whether a runner is on its way.
        self._idle: list[Wakeup] = []
        self.wakeup: Callable[[], Wakeup] = anyio.Event
        """Makes one-shot wake-ups for tasks of the dispatcher's event loop."""
        self._spare = 0
        # How many runners are inside a call, and how many let the loop run between two calls.
        self._busy = 0
        self._yielding = 0
        # Parked runners kept for reuse: as many as may run at once, or 64 without a limit.
        self._idle_cap = max_concurrency if max_concurrency is not None else 64
        self._runners = 0
        # When the runners' current time slice ends (loop clock).
        self._yield_at = 0.0

    @property
    def idle(self) -> bool:
        """Whether no call is queued or running and no batch waits for a result."""
        return self.gate.idle and not self.live

    @property
    def running(self) -> int:
        """How many calls are running."""
        return self.gate.running

    def start(self, tg: TaskGroup) -> None:
        """Run calls in `tg` from now on."""
        self._tg = tg
        self._open = True
        self._clock = loop_clock()
        self.wakeup = wakeups()

    def close(self) -> None:
        """Take no more calls; the outstanding ones end as CANCELLED."""
        self._open = False
        # Waiters get their results instead of hanging.
        for batch in list(self.live):
            batch.cancel()
        for wakeup in self._idle:
            wakeup.set()
        self._idle.clear()

    def check_open(self) -> None:
        """Raise `DispatcherClosedError` unless calls can be submitted."""
        if not self._open:
            raise DispatcherClosedError("the Dispatcher is not open: use it inside `async with Dispatcher() as d:`")

    # Submission ------------------------------------------------------------------------------------

    def submit_all(self, batch: Batch, calls: list[ToolCall]) -> list[PendingCall]:
        """Queue checked calls of `batch` in order."""
        queue = self._queue
        clock = self._clock
        names: dict[object, Resolution] = {}
        works = []
        now = clock()
        for position, call in enumerate(calls, start=1):
            works.append(queue(batch, call, names, now))
            if not position % _SLICE_CHECK:
                now = clock()
        self._pump()
        return works

    async def submit_yielding(self, batch: Batch, calls: list[ToolCall]) -> None:
        """Queue checked calls of `batch` in order, letting the event loop run every few milliseconds.

        Checking a call's arguments takes microseconds, so a batch of thousands would otherwise hold
        the loop for as long (and, with no concurrency limit, start all of its calls in one go). If the
        caller is cancelled meanwhile, the calls already queued are cancelled and awaited.
        """
        queue = self._queue
        clock = self._clock
        now = clock()
        until = now + _SLICE
        names: dict[object, Resolution] = {}
        # Runners are brought for the batch as `submit_all` would bring them for all of it at once,
        # however the loop's speed cuts it into slices: each a runner of its own when it is small enough
        # to start together, else one runner on its way until a call waits (see `_pump`).
        big = len(calls) > _FANOUT
        for position, call in enumerate(calls, start=1):
            queue(batch, call, names, now)
            if position % _SLICE_CHECK:
                continue
            now = clock()
            if now >= until:
                self._pump(arrived=big)
                try:
                    await anyio.lowlevel.checkpoint()
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        batch.cancel()
                        await batch.wait()
                    raise
                now = clock()
                until = now + _SLICE
                names.clear()  # the catalogue may have changed while the loop ran
        self._pump(arrived=big)

    def submit(self, batch: Batch, call: ToolCall) -> PendingCall:
        """Queue one checked call of `batch`; a call that cannot run settles at once as FAILED."""
        work = self._queue(batch, call)
        self._pump()
        return work

    def _queue(
        self, batch: Batch, call: ToolCall, names: dict[object, Resolution] | None = None, now: float | None = None
    ) -> PendingCall:
        """Queue one checked call of `batch` without bringing a runner; see `submit`.

        `names` keeps the resolutions of the names seen so far in one synchronous run of submissions,
        during which the catalogue cannot change; `now`, a recent reading of the loop clock (one per
        few dozen calls of a run), is taken as the time the call was queued.
        """
        self.check_open()
        work = PendingCall(call, batch, self._clock() if now is None else now)
        batch._works.append(work)
        batch._added()
        name = call.name
        resolution = None
        if names is not None and type(name) is str and call.server is None:
            resolution = names.get(name)
            if resolution is None:
                resolution = names[name] = self._catalog.resolve(name)
        else:
            resolution = self._catalog.resolve(name, call.server)
        hooks = batch._hooks
        if hooks is not None:
            work._state = hooks.queued(call, resolution.entry, work.queued_at)
        if resolution.entry is None or resolution.impl is None:
            settle(work, CallStatus.FAILED, error=resolution.error, untrusted=resolution.untrusted)
            return work
        work._entry = entry = resolution.entry
        work._impl = impl = resolution.impl
        arguments = call.arguments if call.arguments is not None else {}
        if type(arguments) is not dict and not isinstance(arguments, Mapping):
            settle(work, CallStatus.FAILED, error=_invalid_arguments(arguments))
            return work
        # Checking arguments against an untrusted server's schema can quote it (a required argument's
        # name is whatever the server wrote): every result of an untrusted server's tool is marked.
        quotes_server = not entry.trusted
        try:
            work._prepared = impl.prepare(arguments)
        except ArgumentError as exc:
            settle(work, CallStatus.FAILED, error=str(exc), untrusted=quotes_server)
            return work
        except Exception as exc:
            error = f"invalid arguments: {type(exc).__name__}: {exc}"
            settle(work, CallStatus.FAILED, error=error, untrusted=quotes_server)
            return work
        try:
            keys = call_keys(entry, arguments)
        except KeyRuleError as exc:
            settle(work, CallStatus.FAILED, error=f"invalid conflict keys: {exc}")
            return work
        if hooks is None:
            work._ticket = self.gate.submit(work, exclusive=entry.exclusive, server=entry.server, keys=keys)
        else:
            self._submit_hooked(work, entry, hooks, keys)
        return work

    def _submit_hooked(self, work: PendingCall, entry: ToolEntry, hooks: CallHooks, keys: tuple[str, ...]) -> None:
        """Queue a call of a batch with hooks: held at its place while its approval is asked for."""
        state = work._state
        assert state is not None
        state.keys = keys
        request = hooks.approval(work.call, entry, state)
        work._ticket = self.gate.submit(
            work, exclusive=entry.exclusive, server=entry.server, held=request is not None, keys=keys
        )
        if request is not None:
            assert self._tg is not None
            self._tg.start_soon(self._approve_held, work, request, hooks, state)

    def accepted(self, server: str, tools: list[str]) -> None:
        """A server's tools reached the catalogue: calls of theirs not started follow their current entry.

        A changed definition is approved (accepted, or by imported pins) while calls queued under the
        old one wait: a call queued while its tool was read-only, whose tool is now mutating, waits for
        an exclusive turn at its place in the order, and is put to the approver if the policy now
        selects it. Costs one pass over the unfinished calls, at each listing of a server's tools.
        """
        if not self.live:
            return
        listed = set(tools)
        changed = False
        for batch in list(self.live):
            for work in batch._works:
                entry = work._entry
                ticket = work._ticket
                if work._result is not None or ticket is None or entry is None:
                    continue
                if entry.server != server or entry.tool not in listed or ticket.state not in _WAITING:
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
            settle(work, CallStatus.FAILED, error=f"invalid conflict keys: {exc}")
            if work._scope is not None:
                work._scope.cancel()  # its approval may still be being asked for
            return
        work._entry = entry
        hooks = work._hooks
        state = work._state
        request = None
        if hooks is not None and state is not None:
            state.entry = entry
            state.keys = keys
            if ticket.state is TicketState.PENDING:
                # A held call is being asked about already; a pending one may need asking now.
                request = hooks.approval(work.call, entry, state)
        self.gate.reclassify(ticket, exclusive=entry.exclusive, keys=keys, held=True if request is not None else None)
        if request is not None:
            assert hooks is not None and state is not None and self._tg is not None
            self._tg.start_soon(self._approve_held, work, request, hooks, state)

    async def _approve_held(
        self, work: PendingCall, request: ApprovalRequest, hooks: CallHooks, state: CallState
    ) -> None:
        """Ask for a held call's approval, then release it to take its turn, or deny it."""
        # Cancelling the call (see `cancel`) cancels this scope: the approver stops being asked.
        with anyio.CancelScope() as scope:
            work._scope = scope
            denial = await hooks.ask(request, state)
        work._scope = None
        ticket = work._ticket
        if scope.cancelled_caught or work._result is not None or ticket is None:
            return
        if denial is None:
            self.gate.release(ticket)
        else:
            self.gate.withdraw(ticket)
            settle(work, CallStatus.DENIED, error=denial)
        if self._open:
            self._pump()

    async def _approve_at_start(self, work: PendingCall, state: CallState) -> bool:
        """Ask the approval the session guard may now require of a call about to start.

        Returns:
            Whether the call was denied (and settled).
        """
        hooks = work._hooks
        assert hooks is not None
        request = hooks.recheck(work.call, state)
        if request is None:
            return False
        try:
            denial = await hooks.ask(request, state)
        except BaseException:
            if work._result is None:
                why = "cancelled while waiting for approval" if work._cancel_requested else "the dispatcher closed"
                settle(work, CallStatus.CANCELLED, error=why)
            raise
        if denial is None:
            return False
        settle(work, CallStatus.DENIED, error=denial)
        return True

    def cancel(self, works: Iterable[PendingCall]) -> None:
        """Cancel calls that have not ended: queued ones settle now, running ones are interrupted."""
        withdrew = False
        for work in works:
            if work._result is not None:
                continue
            ticket = work._ticket
            if ticket is not None and self.gate.withdraw(ticket):
                withdrew = True
                settle(work, CallStatus.CANCELLED, error="cancelled before it started")
                if work._scope is not None:
                    work._scope.cancel()  # its approval is still being asked for
            else:
                work._cancel_requested = True
                if work._scope is not None:
                    work._scope.cancel()
        if withdrew and self._open:
            self._pump()

    # Running ---------------------------------------------------------------------------------------

    def _pump(self, arrived: bool = False) -> None:
        """Have runners on their way for the calls the gate may admit now: wake parked ones, or start new ones.

        Calls admitted together start together: a runner is brought for each call the gate may admit,
        up to `_FANOUT` runners on their way or running at once. While no runner is inside a call that
        waits (`_busy` counts the runners inside a call; when this runs, each of them is waiting in it),
        one runner on its way is enough for a runner that just `arrived` and took a call (or a slice of
        a batch too big to start together), and for more than `_FANOUT` admissible calls: calls that
        never wait (cached reads, local functions) are then carried out back to back by few runners,
        without a task switch per call. A runner that takes a call pumps again, so while calls may be
        admitted one runner is always on its way, and once one of them waits in its call, the next
        runner to arrive brings the others.
        """
        gate = self.gate
        may = gate.may_take
        if not may:
            return
        # A runner letting the loop run at the end of a time slice holds no call and comes back for one:
        # it is on its way, like the spares.
        on_its_way = self._spare + self._yielding
        if not self._busy and (arrived or may > _FANOUT):
            # No call waits: the runners on duty keep up, and more would only take turns.
            want = 1 - on_its_way
        else:
            want = min(may, max(_FANOUT - gate.running, 1)) - on_its_way
        if want <= 0:
            return
        self._spare += want
        idle = self._idle
        while want and idle:
            idle.pop().set()
            want -= 1
        if want:
            tg = self._tg
            assert tg is not None
            self._runners += want
            for _ in range(want):
                tg.start_soon(self._runner)

    def _take(self) -> Ticket[PendingCall] | None:
        """The next call the gate admits, for a runner that just arrived; runners come for the calls after it."""
        ticket = self.gate.take()
        if ticket is not None:
            self._pump(arrived=True)
        return ticket

    async def _runner(self) -> None:
        """Run admitted calls one after another; park when there is none, and end when too many are parked.

        A runner is started or woken as the spare (`_pump`): it takes the next admitted call, if any.
        All runners share one time slice: once it has passed, each lets the event loop run before its
        next call, so a long run of short calls never holds the loop for more than a few milliseconds.
        """
        try:
            while True:
                self._spare -= 1
                if not self._open:
                    return
                await self._run_from()
                if not self._open or len(self._idle) >= self._idle_cap:
                    return
                await self._park()
        finally:
            self._runners -= 1

    async def _park(self) -> None:
        """Wait among the parked runners until `_pump` or `close` wakes this one."""
        idle = self._idle
        while self._open:
            wakeup = self.wakeup()
            idle.append(wakeup)
            try:
                await wakeup.wait()
            except anyio.get_cancelled_exc_class():
                # On asyncio, a tool may cancel its own task and return: the cancellation, withdrawn
                # after its call (see `_run_from`) unless it came too late for that, lands here.
                parked = wakeup in idle
                if parked:
                    idle.remove(wakeup)
                if not await absorb_own_cancellation():
                    raise
                if parked:
                    continue
            return  # woken: `_pump` counted it as on its way

    async def _run_from(self) -> None:
        """Run the next admitted call and every call admitted after it, until the gate admits none.

        Calls of one attempt run directly under one cancel scope of the runner, whose deadline moves
        with each call (by a slack of 0.1% of the call timeout, at least 2 ms, so that a run of short
        calls seldom moves it):
        cancelling the call or reaching its deadline cancels that scope, which ends that call alone;
        the next call gets a new scope. Other calls (retried, fleet-held, rechecked by the session
        guard) run through `_run_admitted`, with a scope of their own.
        """
        gate = self.gate
        clock = self._clock
        cancellations = own_cancellations()
        # Only `current` refers to a call: a runner letting the loop run, or parked, holds no finished one.
        current = self._take()
        while current is not None:
            if not self._open:
                self._drop(current)
                return
            try:
                with anyio.CancelScope() as scope:
                    while True:
                        self._busy += 1
                        try:
                            ended = await self._run_one(current.item, scope)
                        finally:
                            self._busy -= 1
                        # The tool cancelled its own task and returned: that must not land on the
                        # next call, nor end the runner (withdrawn once the call is let go of).
                        stray = cancellations is not None and cancellations() and not scope.cancel_called
                        readied = gate.readied
                        gate.finish(current)
                        current = None
                        if gate.readied != readied:
                            self._pump()  # its end let other calls start
                        if stray:
                            await absorb_own_cancellation()
                        if scope.cancel_called or not self._open:
                            break  # cancelled as it ended: the next call gets a fresh scope
                        now = ended if ended is not None else clock()
                        if now < self._yield_at or not gate.may_take:
                            current = gate.take()
                        elif await self._end_slice(now):
                            if scope.cancel_called or not self._open:
                                break  # the scope's deadline (the last call's) may have passed meanwhile
                            current = self._take()  # back like a runner that just arrived
                        else:
                            return  # another runner carries the calls on: this one parks
                        if current is None:
                            break
            except BaseException:
                if current is not None:
                    self._drop(current)
                raise
            if current is None:
                # The scope ended after a call (cancelled as it returned), or the gate had nothing.
                current = self._take() if self._open else None  # runners come for the calls after it
            elif current.item.started_at is not None:
                # Its scope was cancelled while it ran: by `cancel`, or at its deadline.
                work = current.item
                work._scope = None
                if work._result is None:
                    if work._cancel_requested:
                        status, error = CallStatus.CANCELLED, "cancelled while running"
                    else:
                        status, error = CallStatus.TIMEOUT, f"no result within call_timeout={self._call_timeout}s"
                    settle(work, status, error=error, attempts=1)
                gate.finish(current)
                self._pump()
                current = gate.take()

    async def _end_slice(self, since: float) -> bool:
        """Let the event loop run, the time slice having passed at `since`; whether to go on taking calls.

        The first runner back after the slice passed starts the next one and goes on. A runner back
        after another has started it goes on while it lasts; once it has passed too, that runner is
        one more than the calls need while another is on its way back, and it parks: otherwise every
        runner that holds a call would run one more in each turn of the loop, however many there are.
        """
        self._yielding += 1
        try:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        except anyio.get_cancelled_exc_class():
            # No cancel scope reaches a shielded wait: a tool cancelled its own task (as in `_park`).
            if not await absorb_own_cancellation():
                raise  # pragma: no cover - a shielded wait
        finally:
            self._yielding -= 1
        ends = self._yield_at
        if ends <= since:
            self._yield_at = self._clock() + _SLICE
            return True
        return not self._yielding or self._clock() < ends

    async def _run_one(self, work: PendingCall, scope: anyio.CancelScope) -> float | None:
        """Run one admitted call to its result; a call of one attempt runs under the runner's `scope`.

        Returns:
            When it ended (the loop clock), if it was read.
        """
        entry = work._entry
        assert entry is not None
        retry = self._retry
        state = work._state
        if not self._direct or (retry is not None and eligible(retry, entry)) or (state is not None and state.recheck):
            if scope.deadline != math.inf:
                scope.deadline = math.inf
            await self._run_admitted(work)
            return None
        if work._cancel_requested:
            settle(work, CallStatus.CANCELLED, error="cancelled before it started")
            return None
        clock = self._clock
        work.started_at = started = clock()
        timeout = self._call_timeout
        if timeout is not None:
            deadline = scope.deadline
            if deadline < started + timeout or deadline == math.inf:
                scope.deadline = started + timeout + self._slack
        elif scope.deadline != math.inf:
            scope.deadline = math.inf
        work._scope = scope
        if state is None:
            impl = work._impl
            assert impl is not None
            try:
                result = await impl.invoke(work._prepared)
            except Exception as exc:
                outcome = _failed(exc)
            except BaseException as exc:
                if not _tool_failure(exc):
                    raise
                outcome = _failed_base(exc)
            else:
                work._scope = None
                now = clock()
                if result.is_error:
                    error = _error_text(result)
                    settle(work, CallStatus.TOOL_ERROR, result=result, error=error, attempts=1, now=now)
                else:
                    settle(work, CallStatus.OK, result=result, attempts=1, now=now)
                return now
        else:
            outcome = await self._attempt(work, False, started, math.inf)
        work._scope = None
        now = clock()
        settle(
            work,
            outcome.status,
            result=outcome.result,
            error=outcome.error,
            attempts=1,
            untrusted=outcome.untrusted,
            now=now,
        )
        return now

    def _drop(self, ticket: Ticket[PendingCall]) -> None:
        """End a taken call the dispatcher is closing under, and free its place."""
        work = ticket.item
        work._scope = None
        if work._result is None:
            attempts = 0 if work.started_at is None else 1
            settle(work, CallStatus.CANCELLED, error="the dispatcher closed", attempts=attempts)
        self.gate.finish(ticket)

    async def _execute(self, work: PendingCall) -> None:
        """Run a call's attempts as its retry policy allows, and settle it.

        The call keeps its place in the gate through every attempt and every wait, so an exclusive
        call keeps its exclusive turn and nothing overtakes it. `cancel` cancels the call's scope; the
        dispatcher closing cancels the task group. Either way the call settles as CANCELLED with the
        attempts made so far, and the cancellation is never retried.

        Each attempt ends at its deadline (the call timeout, or the retry policy's deadline). A call
        that gets one attempt only carries that deadline on its own scope; an attempt that may be
        followed by another needs a scope of its own, since a timed-out attempt must leave the call
        running.
        """
        if work._cancel_requested:
            settle(work, CallStatus.CANCELLED, error="cancelled before it started")
            return
        entry = work._entry
        assert entry is not None
        retry = self._retry
        policy = retry if retry is not None and eligible(retry, entry) else _ONE_ATTEMPT
        retrier = Retrier(policy, self._budget(policy, entry.server), self._rng, entry.server)
        call_timeout = self._call_timeout
        single = policy.attempts == 1
        try:
            with anyio.CancelScope() as scope:
                work._scope = scope
                state = work._state
                if state is not None and state.recheck and await self._approve_at_start(work, state):
                    return
                work.started_at = started = self._clock()
                if single and call_timeout is not None:
                    scope.deadline = started + call_timeout
                last = await retrier.run(functools.partial(self._attempt, work, not single), started)
                work._scope = None
                errors = retrier.errors if last.error is None else retrier.errors[:-1]
                settle(
                    work,
                    last.status,
                    result=last.result,
                    error=last.error,
                    attempts=retrier.attempts,
                    attempt_errors=tuple(errors) if errors else (),
                    untrusted=last.untrusted,
                )
                return
        except BaseException as exc:
            # On asyncio, a tool may leave a cancellation on its task (cancelled, or scheduled to be, as
            # it returned) that lands between attempts, while no cancel scope around the runner is
            # cancelled: the call ends, the runner goes on.
            stray = isinstance(exc, anyio.get_cancelled_exc_class()) and await absorb_own_cancellation()
            if work._result is None:
                settle(
                    work,
                    CallStatus.CANCELLED,
                    error="the tool's task was cancelled by itself" if stray else "the dispatcher closed",
                    attempts=retrier.attempts,
                    attempt_errors=tuple(retrier.errors),
                )
            if not stray:
                raise
        finally:
            work._scope = None
        # The call's scope was cancelled: by `cancel`, or at the deadline of its only attempt.
        if work._result is None:
            if work._cancel_requested:
                status, error = CallStatus.CANCELLED, "cancelled while running"
            else:
                status, error = CallStatus.TIMEOUT, f"no result within call_timeout={call_timeout}s"
            settle(work, status, error=error, attempts=retrier.attempts, attempt_errors=tuple(retrier.errors))

    def _budget(self, policy: RetryPolicy, server: str | None) -> RetryBudget | None:
        """The retry budget of a server under a policy that has one."""
        if policy.budget is None:
            return None
        budget = self._budgets.get(server)
        if budget is None:
            budget = self._budgets[server] = self._new_budget(server, policy.budget, policy.budget_refill)
        return budget

    async def _attempt(self, work: PendingCall, scoped: bool, start: float, limit: float) -> Attempt:
        """One attempt of a call, reported to its hooks; `scoped`: under a deadline scope of its own."""
        state = work._state
        if state is None:
            outcome = await (self._attempt_scoped(work, start, limit) if scoped else self._invoke(work))
        else:
            hooks = work._hooks
            assert hooks is not None
            hooks.attempt_started(work.call, state, start)
            outcome = await (self._attempt_scoped(work, start, limit) if scoped else self._invoke(work))
            hooks.attempt_finished(state, outcome.status, outcome.error)
        if own_cancellation_pending():
            # The tool cancelled its own task and returned: not into the wait before the next attempt.
            await absorb_own_cancellation()
        return outcome

    @staticmethod
    async def _invoke(work: PendingCall) -> Attempt:
        """Invoke the tool once and describe how that ended."""
        impl = work._impl
        assert impl is not None
        try:
            result = await impl.invoke(work._prepared)
        except Exception as exc:
            return _failed(exc)
        except BaseException as exc:
            if not _tool_failure(exc):
                raise
            return _failed_base(exc)
        if result.is_error:
            return Attempt(CallStatus.TOOL_ERROR, result, _error_text(result))
        return Attempt(CallStatus.OK, result)

    async def _attempt_scoped(self, work: PendingCall, start: float, limit: float) -> Attempt:
        """Invoke the tool once, cut off at the call timeout or at `limit` (the retry deadline)."""
        call_timeout = self._call_timeout
        deadline = limit if call_timeout is None else min(limit, start + call_timeout)
        with anyio.CancelScope(deadline=deadline):
            return await self._invoke(work)
        # Only the attempt's own deadline is absorbed by its scope; a cancellation of the call
        # (or of the dispatcher) is still pending and is raised here.
        await anyio.lowlevel.checkpoint_if_cancelled()
        if call_timeout is None or deadline == limit:
            assert self._retry is not None  # a finite limit comes from the retry policy's deadline
            return Attempt(
                CallStatus.TIMEOUT,
                error=f"no result before the retry deadline (RetryPolicy.timeout={self._retry.timeout}s)",
                transient=True,
            )
        return Attempt(CallStatus.TIMEOUT, error=f"no result within call_timeout={call_timeout}s", transient=True)


def _tool_failure(exc: BaseException) -> bool:
    """Whether `exc`, which is no `Exception`, is the tool's failure rather than a request to stop.

    KeyboardInterrupt and SystemExit stop the program, and a cancellation raised because a scope
    (the call's, the dispatcher's) was cancelled ends the call as cancelled: those propagate. Any
    other (GeneratorExit, a BaseException subclass of the tool's own, the cancellation exception
    raised while nothing was cancelled) ends that call alone, so a hostile tool cannot end the batch.
    """
    cancelled = anyio.get_cancelled_exc_class()
    if isinstance(exc, BaseExceptionGroup):
        if exc.split((KeyboardInterrupt, SystemExit))[0] is not None:
            return False
        if exc.split(cancelled)[0] is None:
            return True
    elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return False
    elif not isinstance(exc, cancelled):
        return True
    # No enclosing scope was cancelled: the tool raised the exception itself, or cancelled its own
    # task. On asyncio that task's cancellation request is withdrawn, so the runner carries on.
    if anyio.current_effective_deadline() <= anyio.current_time():  # -inf once a scope is cancelled
        return False
    withdraw_cancellation()
    return True


def _failed_base(exc: BaseException) -> Attempt:
    """How an attempt whose tool raised `exc`, which is no `Exception`, ended."""
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return Attempt(CallStatus.CANCELLED, error=f"the tool raised {type(exc).__name__} without being cancelled")
    return Attempt(CallStatus.FAILED, error=f"the tool raised {type(exc).__name__}")


def _failed(exc: Exception) -> Attempt:
    """How an attempt that raised `exc` ended."""
    status, error = describe_failure(exc)
    # Why a tool is unavailable can quote its server (a blocked tool's changed definition).
    unavailable = isinstance(exc, ToolUnavailableError)
    return Attempt(status, error=error, transient=is_transient(exc), untrusted=unavailable)


def _invalid_arguments(arguments: object) -> str:
    """Why arguments that are not a mapping are rejected; JSON text that failed to parse says where."""
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            # RecursionError: nested deeper than the parser goes, which fails this call alone.
            why = exc if isinstance(exc, ValueError) else "nested too deep to parse"
            text = arguments if len(arguments) <= 200 else f"{arguments[:200]}..."
            return f"invalid arguments: expected a JSON object, got text that is not valid JSON ({why}): {text!r}"
        return "invalid arguments: expected a JSON object, got a str of JSON text; parse it into a dict"
    return f"invalid arguments: expected a JSON object, got {type(arguments).__name__}"


def _error_text(result: CallToolResult) -> str:
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]  # type: ignore[union-attr]
    return " ".join(texts).strip() or "the tool reported an error"
