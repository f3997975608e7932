"""Execution: the driver that carries out the gate's decisions, in tasks that each hold one admitted call.

The gate (`_gate.Gate`) decides which call may start; the lifecycle (`_lifecycle.CallRecord`) holds each
call's phase and builds its result. This module does the waiting between them, in the shape of anyio's
and aiometer's drivers: a task group (the dispatcher's) and a meter (the gate) saying when `start_soon`
may run, nothing clever around it.

- Submitting a call resolves it, checks its arguments and queues it in the gate (`_submission`);
  a long batch is submitted in slices of a few milliseconds, letting the loop run between them.
- Whenever the gate may admit calls (a call queued, ended, approved or withdrawn) the driver takes
  every call it admits and starts a task for each (`_pump`). Only admitted calls have a task, so the
  number of tasks is bounded by the concurrency limit however long the batch. With no limit, a loop turn
  starts a few tasks more than those whose calls wait (`_unlimited`): the others' tasks carry on with the rest.
- A call's task runs its one attempt, or the retrier's attempts, under one cancel scope of the call's
  own (cancelled by `cancel` and at the call timeout), settles the call through its lifecycle, and
  tells the gate it ended. It then lets the loop run once and, if the gate admitted another call at
  the moment its own ended, carries that call out too (`_run`): starting an anyio task costs about
  twice what running a call that does not wait costs (docs/benchmarks.md, "Choosing the executor").

Failures are results, never exceptions that could cancel siblings. A tool that cancels its own task
(asyncio's `Task.cancel`, which no cancel scope catches) is absorbed at a checkpoint after every call
(`_between`) and between attempts (`_attempts.absorb_stray`), both reading it by one rule (`_attempts.stray`),
so that the cancellation lands on neither the next call or attempt nor the task group. One scheduled to land
later (`call_later`) lands on whatever its task runs then: under asyncio a call that may mutate therefore
never runs in a task that ran another call before it (`_next`), and a read it lands on ends CANCELLED.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import secrets
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .._core._calls import CallStatus
from .._core._gate import Gate
from .._core._lifecycle import Ending, Phase, done_sending
from ._asking import WAITING
from ._attempts import absorb_stray, attempt_scoped, caught, error_text, invoke, stray
from ._clock import no_clock, start_clock
from ._coordination import admitted_runner, budget_factory
from ._deadlines import Deadlines
from ._retry import Attempt, Retrier, RetryBudget, RetryPolicy, eligible
from ._submission import Submission
from ._unlimited import UnlimitedStarts

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from anyio.abc import TaskGroup

    from .._core._catalog import Catalog, ToolEntry
    from .._core._gate import Ticket
    from .._core._idempotency import IdempotencyKeys
    from ._batch import Batch, PendingCall

__all__ = ["Executor"]

# Seconds for which a call's task under trio carries on with the calls it takes before letting the loop run,
# and the most calls it carries on with in that time: a virtual clock (trio's MockClock) stands still while
# tasks run, so time alone would never end the window there.
_FOLLOW = 0.0002
_FOLLOW_CALLS = 32
_OK = CallStatus.OK  # read once (an Enum class's attribute costs a hook call on Python 3.11: see `_lifecycle`)


class Executor(Submission):
    """Admits, runs and settles the calls of every batch of one dispatcher.

    Args:
        catalog: Where call names resolve to tools.
        max_concurrency: The most calls running at once, or None for no limit.
        call_timeout: Seconds each attempt may take, or None.
        retry: The retry policy, or None to never retry.
        coordinator: A fleet `Coordinator` whose hold wraps each admitted call, or None.
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
        self._retry = retry
        self._budgets: dict[str | None, RetryBudget] = {}
        # A fleet coordinator wraps each admitted call in its fleet-wide hold; without one, nothing is added.
        self._run_admitted = admitted_runner(coordinator, self._execute, call_timeout)
        # Whether calls run in no fleet hold, so that a call may run under its task's scope (`_shares_scope`).
        self._local = self._run_admitted == self._execute
        self._new_budget = budget_factory(coordinator)
        self._rng = random.Random(retry.seed if retry is not None else None)
        self.gate: Gate[PendingCall] = Gate(max_concurrency)
        # Whether `skip_dependents` is under way (settling a skipped call calls it again).
        self._skipping = False
        # How each server declared to deduplicate takes its idempotency keys, and the secret they derive from.
        self._idempotency: dict[str, IdempotencyKeys] = {}
        self._key_secret = secrets.token_bytes(32)
        self._batches = itertools.count()
        self.live: set[Batch] = set()
        """The batches that have calls without a result."""
        self._tg: TaskGroup | None = None
        self._open = False
        # The running loop's clock, read without looking up the backend at each reading (`start`).
        self._now: Callable[[], float] = anyio.current_time
        self._cancel_scope: Callable[..., anyio.CancelScope] = anyio.CancelScope
        self._checkpoint: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint
        self._strays = True
        # With no limit: how many tasks each loop turn starts (`_pump`).
        self._unlimited = UnlimitedStarts(self.gate, self._accepting)
        # The call timeout of the calls running their one attempt (`_deadlines`).
        self._deadlines = Deadlines(self._now, None)

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
        # The backend's own clock, cancel scopes and checkpoint: what anyio's functions of those names
        # call, after looking the backend up again at every call.
        token = anyio.lowlevel.current_token()
        backend = token.backend_class
        self._cancel_scope = backend.create_cancel_scope
        self._checkpoint = backend.checkpoint
        # Only asyncio lets a tool cancel its own task without a scope (see `_run`).
        self._strays = getattr(backend, "__name__", "") != "TrioBackend"
        # The clock itself, read once here rather than found again at each reading: the running loop's
        # `time` (what anyio's asyncio backend reads), trio's run clock (what `trio.current_time` reads).
        self._now = _loop_clock(token.native_token, self._strays) or backend.current_time
        self._deadlines = Deadlines(self._now, tg.start_soon)
        self._unlimited.start(tg.start_soon, self._run, self._checkpoint)

    def _accepting(self) -> bool:
        return self._open

    def close(self) -> None:
        """Take no more calls; the outstanding ones end as CANCELLED."""
        self._open = False
        # Waiters get their results instead of hanging.
        for batch in list(self.live):
            batch.cancel()

    # Cancellation, keys, fail-fast ----------------------------------------------------------------

    def cancel(self, works: Iterable[PendingCall]) -> None:
        """Cancel calls that have not ended: queued ones settle now, running ones are interrupted."""
        withdrew = False
        now = self._now()
        for work in works:
            if work.phase is Phase.SETTLED:
                continue
            ticket = work.ticket
            if ticket is not None and self.gate.withdraw(ticket):
                withdrew = True
                work.settle(Ending.CANCELLED, now)  # and its approval, if being asked, stops
            else:
                work.request_cancel()
        if withdrew and self._open:
            self._pump()

    def number_batch(self) -> int:
        """A number for a new batch, never given before by this executor."""
        return next(self._batches)

    def skip_dependents(self, batch: Batch, failed: PendingCall) -> None:
        """Settle as SKIPPED the waiting calls of `batch` after `failed` that depend on a failure (`FailFast`).

        One forward pass: a skipped call that may mutate is a failure in turn (settling it calls back
        here, and returns at once), which the calls after it, still ahead in the pass, see.
        """
        if self._skipping:
            return
        rules = batch.fail_fast
        assert rules is not None
        self._skipping = True
        withdrew = False
        try:
            now = self._now()
            works = batch._works
            for later in works[failed.position + 1 :]:
                ticket = later.ticket
                if ticket is None or ticket.state not in WAITING:
                    continue
                dependency = rules.blocker(later.position, ticket.keys)
                if dependency is not None and self.gate.withdraw(ticket):
                    withdrew = True
                    later.skip(ticket.keys, dependency, now)
        finally:
            self._skipping = False
        if withdrew and self._open:
            self._pump()

    # Running ---------------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Start a task for each call the gate admits now (with no limit: as many as this loop turn allows)."""
        gate = self.gate
        if gate.limit is None:
            self._unlimited.pump()
            return
        ticket = gate.take()
        if ticket is None:
            return
        tg = self._tg
        assert tg is not None
        start = tg.start_soon
        run = self._run
        while ticket is not None:
            work = ticket.item
            work.admit()
            start(run, work, ticket)
            ticket = gate.take()

    async def _run(self, work: PendingCall, ticket: Ticket[PendingCall]) -> None:
        """An admitted call's task: run it, tell the gate it ended, and carry on with the next admitted call.

        When its call has ended, the task takes the next call the gate admits, if there is one at
        that moment, instead of starting a task for it (starting an anyio task costs several times what
        running a call that does not wait costs: docs/benchmarks.md, "Choosing the executor"); the other
        calls the gate admits get tasks of their own (`_pump`). Between two calls the task lets the loop
        run once (under trio, once per `_FOLLOW` or per `_FOLLOW_CALLS` calls: no tool can cancel its task
        there), so a run of calls that never wait cannot hold the loop, and a cancellation a tool left on
        its task lands there (`absorb_stray`).

        The task's calls run under one cancel scope of the task's, the call's interrupt (`cancel`, its
        call timeout), as long as none cancels it: a cancelled scope cannot be used again, so the task
        leaves it, settles the call it cut short, and enters a fresh one for the next call. A call the
        task's scope cannot carry (`_shares_scope`) runs under a scope of its own inside (`_execute`).
        """
        gate = self.gate
        local = self._local
        cancelled = anyio.get_cancelled_exc_class()
        # Only trio carries on with the calls it takes (asyncio lets the loop run after every call).
        until = -math.inf if self._strays else self._now() + _FOLLOW
        follows = _FOLLOW_CALLS
        while True:
            cut = False  # whether the task's scope was cancelled while the call ran (it is settled below)
            try:
                with self._cancel_scope() as scope:
                    shared = _Shared(scope)
                    while True:
                        try:
                            if not self._open:
                                work.settle(Ending.CLOSED, self._now())
                            elif (
                                local
                                and (entry := work.entry) is not None
                                and entry.server is None
                                and ((state := work.state) is None or not state.recheck)
                            ):  # `_shares_scope`, inline
                                await self._carry_out(work, scope, shared)
                            else:
                                await self._run_admitted(work)
                        except cancelled:
                            if scope.cancel_called:
                                cut = True
                                raise  # to the task's scope, or beyond it if the dispatcher is closing too
                            # Either the dispatcher is closing (its task group is cancelled: every scope around
                            # this task is), or a cancellation of the task's own that no scope caught (see
                            # `_absorb_stray`) ended the call: the task ends quietly, never cancelling the task group.
                            closing = anyio.current_effective_deadline() == -math.inf
                            self._cut_short(work, closing)
                            if closing:
                                raise
                        except BaseException:
                            # KeyboardInterrupt, SystemExit (or a bug) ends the dispatcher's block: the call still
                            # gets its result, or a caller waiting for it, shielded, would wait forever.
                            work.settle(Ending.CLOSED, self._now())
                            raise
                        finally:
                            done_sending()
                            if not cut:
                                gate.finish(ticket)
                        following = self._next()
                        del work, ticket  # hold no finished call while the loop runs
                        if shared.spent:
                            break  # cancelled as its call ended, or given a deadline: not for the next call
                        if following is not None and not self._strays and follows and self._now() < until:
                            follows -= 1
                            work, ticket = following.item, following
                            continue  # no cancellation can be stray here, and this task took no slice yet
                        until = await self._between(following)
                        follows = _FOLLOW_CALLS
                        if following is None:
                            return
                        work, ticket = following.item, following
            except cancelled:
                if not cut:
                    raise
                # The scope's cancellation went on past it: the dispatcher is closing, or a cancellation of the
                # task's own (a tool's `Task.cancel`) came with it, which is absorbed as anywhere else.
                if anyio.current_effective_deadline() == -math.inf:
                    self._cut_short(work, True)
                    gate.finish(ticket)
                    raise
            if cut:
                self._interrupted(work)
                gate.finish(ticket)
                following = self._next()
                del work, ticket
            until = await self._between(following)
            follows = _FOLLOW_CALLS
            if following is None:
                return
            work, ticket = following.item, following

    def _next(self) -> Ticket[PendingCall] | None:
        """As a call's task is done with its call: the call it takes next, if the gate admits one now, after
        starting tasks for the others the gate admits (and, under asyncio, for a call that may mutate)."""
        if not self._open:
            return None
        gate = self.gate
        following = gate.take()
        if following is not None:  # (if the gate admits none now, `_pump` would start none either)
            if gate.limit is None:
                self._unlimited.carried_on()  # (a task whose call did not wait: `_unlimited`)
            following.item.admit()
            if following.exclusive and self._strays:
                # A tool can leave a cancellation on its task to land later (asyncio: `call_later(delay,
                # task.cancel)`), past any turn of the loop this task lets run: on a call this task carried on it
                # would cut that call short. A call that may mutate gets a task of its own, which no tool ran in.
                tg = self._tg
                assert tg is not None
                tg.start_soon(self._run, following.item, following)
                following = None
            limit = gate.limit
            if limit is None or gate.running < limit:  # (at its limit, the gate admits no other)
                self._pump()
        return following

    async def _between(self, following: Ticket[PendingCall] | None) -> float:
        """Let the loop run between two calls of a task, absorbing a cancellation a tool left on the task;
        the end of the task's next window of calls (under trio; asyncio carries on with none)."""
        try:
            await self._checkpoint()  # `absorb_stray`, inline: one coroutine fewer per call under asyncio
        except BaseException as exc:
            if not stray(exc):
                if following is not None:  # the dispatcher is closing: the call taken ends with it
                    following.item.settle(Ending.CLOSED, self._now())
                    self.gate.finish(following)
                raise
        return -math.inf if self._strays else self._now() + _FOLLOW

    def _shares_scope(self, work: PendingCall) -> bool:
        """Whether a call can run under its task's cancel scope rather than one of its own.

        Not a call in a fleet hold (the hold is released outside the call's scope), nor a call of a
        server (its clock may set its scope's deadline while a person answers a question, even after the
        call has ended), nor one whose approval is asked again as it starts (that sets its scope's deadline).
        """
        if not self._local:
            return False
        entry = work.entry
        state = work.state
        return entry is not None and entry.server is None and (state is None or not state.recheck)

    def _cut_short(self, work: PendingCall, closing: bool) -> None:
        """Settle a call whose task a cancellation ended before the call settled."""
        now = self._now()
        if closing:
            work.settle(Ending.CLOSED, now)
        elif work.cancel_requested:
            work.settle(Ending.CANCELLED, now, "before it started")
        elif work.phase is Phase.RUNNING and self._timed_out(work, now):
            work.settle(Ending.TIMED_OUT, now, self._call_timeout)
        else:
            work.settle(Ending.SELF_CANCELLED, now)

    def _timed_out(self, work: PendingCall, now: float) -> bool:
        started = work.started_at
        timeout = self._call_timeout
        return started is not None and timeout is not None and now >= started + timeout

    async def _execute(self, work: PendingCall) -> None:
        """Run an admitted call's attempts as its retry policy allows, and settle it.

        The call keeps its place in the gate through every attempt and every wait, so an exclusive
        call keeps its exclusive turn and nothing overtakes it. `cancel` cancels the call's scope; the
        dispatcher closing cancels the task group. Either way the call settles as CANCELLED with the
        attempts made so far, and the cancellation is never retried.

        Each attempt ends at its deadline (the call timeout, or the retry policy's deadline). A call
        that gets one attempt carries that deadline on its own scope; an attempt that may be followed
        by another has a scope of its own, since a timed-out attempt must leave the call running.
        """
        with self._cancel_scope() as scope:
            await self._carry_out(work, scope)
            return
        # The scope was cancelled before the call settled: by `cancel`, or at its only attempt's deadline.
        self._interrupted(work)

    async def _carry_out(self, work: PendingCall, scope: anyio.CancelScope, shared: _Shared | None = None) -> None:
        """Run an admitted call's attempts under `scope`, its interrupt, and settle it (see `_execute`).

        A cancellation of `scope` propagates: whoever entered it settles the call (`_interrupted`). `shared`: the
        scope is its task's, which the call's lifecycle and deadline cancel through `shared` (see `_Shared`).
        """
        cut: anyio.CancelScope | _Shared = scope if shared is None else shared
        if work.cancel_requested:
            work.settle(Ending.CANCELLED, self._now(), "before it started")
            return
        entry = work.entry
        assert entry is not None
        retry = self._retry
        state = work.state
        recheck = state is not None and state.recheck
        timeout = self._call_timeout
        # Without an approval to ask at the start, nothing waits between here and the start: the call's
        # only attempt gets its deadline now, kept by the watcher rather than a timer of its own (`_deadlines`).
        started = self._now()
        # Without a retry policy every call gets one attempt (and its key, if any, decides nothing).
        once, keyed = (True, False) if retry is None else self._once(entry, work)
        watch = None
        if once and timeout is not None and not recheck:
            watch = self._deadlines.watch(cut, started + timeout)
        if once and state is None and not recheck:
            # The usual call, in fewer steps: one attempt, no hooks, nothing to wait for before it starts.
            if not work.begin(cut, started):
                if watch is not None:
                    watch.forget()
                return  # settled while it was on its way (its fleet hold lost)
            clock = start_clock(work.call, scope) if entry.server is not None else no_clock()
            if watch is not None and clock is not None:
                clock.bound(scope, watch)
            # `invoke`, inline: the tool's answer needs no `Attempt` on its way to the call's settling.
            impl = work.impl
            assert impl is not None
            try:
                result = await impl.invoke(work.prepared, work.lease)
            except BaseException as exc:
                if watch is not None:
                    watch.forget()
                last = caught(exc)  # or the request to stop that `exc` is, raised
                if last.error is not None:
                    work.failed_attempt(last.error)
                work.finished(last.status, last.error, self._now(), last.result, last.untrusted)
                return
            if watch is not None:
                watch.forget()
            if result.is_error:
                error = error_text(result)
                work.failed_attempt(error)
                work.finished(CallStatus.TOOL_ERROR, error, self._now(), result, False)
            else:
                work.finished(_OK, None, self._now(), result, False)
            return
        work.waiting(cut)
        if recheck:
            if await self._approve_at_start(work):
                return
            started = self._now()
            once, keyed = self._once(entry, work)  # the idempotency keys may have changed meanwhile
            if once and timeout is not None:
                scope.deadline = started + timeout
        if not work.start(started):
            if watch is not None:
                watch.forget()
            return  # settled while it was on its way (its fleet hold lost)
        # The call's deadlines stop while a person answers its server's question (`_clock`); a local
        # function has no server to ask one, and its call no clock (nor that of a call before it).
        clock = start_clock(work.call, scope) if entry.server is not None else no_clock()
        if once:
            if timeout is not None and clock is not None:
                clock.bound(scope, watch)
            try:
                last = await self._attempt(work, False, started, math.inf)
            finally:
                if watch is not None:
                    watch.forget()
        else:
            assert retry is not None  # a call of a policy's retries has one
            still = functools.partial(self._still_eligible, retry, entry, keyed)
            # Read again as each repeat is sent, after any reconnect on its way (see `sent`).
            work.repeat_check = still
            retrier = Retrier(retry, self._budget(retry, entry.server), self._rng, entry.server, recheck=still)
            last = await retrier.run(functools.partial(self._attempt, work, True), started)
        work.finished(last.status, last.error, self._now(), last.result, last.untrusted)

    def _interrupted(self, work: PendingCall) -> None:
        """Settle a call whose scope was cancelled before it settled: by `cancel`, or at its only attempt's deadline."""
        work.waiting(None)
        now = self._now()
        if work.phase is not Phase.RUNNING:
            work.settle(Ending.CANCELLED, now, "while waiting for approval")
        elif work.cancel_requested:
            work.settle(Ending.CANCELLED, now)
        else:
            work.settle(Ending.TIMED_OUT, now, self._call_timeout)

    def _once(self, entry: ToolEntry, work: PendingCall) -> tuple[bool, bool]:
        """Whether a call gets one attempt only, and whether it is repeatable for its key (only a call
        that carries its key is: not one queued while its tool was read-only, which got none)."""
        keyed = work.keyed and self._keyed(entry)
        retry = self._retry
        return retry is None or not eligible(retry, entry, keyed=keyed), keyed

    def _still_eligible(self, policy: RetryPolicy, entry: ToolEntry, keyed: bool) -> str | None:
        """Why a call of `entry` may no longer be retried, reading its tool's entry again; None if it may."""
        current = self._catalog.get(entry.server, entry.tool)
        if current is None:
            return f"tool {entry.name!r} is no longer in the catalogue"
        if eligible(policy, current, keyed=keyed and self._keyed(current)):
            return None
        if entry.trusted and not current.trusted:
            return f"server {entry.server!r} is no longer trusted"
        if keyed and not self._keyed(current):
            return f"tool {entry.name!r} no longer takes the idempotency key (its definition changed)"
        return f"tool {entry.name!r} is no longer declared idempotent (its effective idempotentHint was withdrawn)"

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
        work.attempted()
        state = work.state
        if state is None:
            outcome = await (self._attempt_scoped(work, start, limit) if scoped else invoke(work))
        else:
            hooks = work.hooks
            assert hooks is not None
            hooks.attempt_started(work.call, state, start)
            outcome = await (self._attempt_scoped(work, start, limit) if scoped else invoke(work))
            hooks.attempt_finished(state, outcome.status, outcome.error)
        if outcome.error is not None:
            work.failed_attempt(outcome.error)
        if scoped and outcome.transient:
            # Another attempt may follow, after a wait: not where the tool's own cancellation may land.
            # A final outcome (an answer in hand) goes straight to its settling, with no checkpoint
            # where a cancellation could replace the answer by "cancelled while running" (UNKNOWN);
            # the call's task absorbs a stray cancellation once the call has settled (`_run`).
            await absorb_stray(self._checkpoint)
        return outcome

    def _attempt_scoped(self, work: PendingCall, start: float, limit: float) -> Awaitable[Attempt]:
        retry_timeout = self._retry.timeout if self._retry is not None else None
        return attempt_scoped(work, start, limit, self._call_timeout, retry_timeout, self._cancel_scope)


class _Shared:
    """A task's cancel scope as the calls it carries see it: their lifecycle and deadline cancel it (or set its
    deadline) through this, which notes it, so that the task knows whether the scope may carry its next call
    without asking the scope (trio's `cancel_called` reads the clock to see whether a deadline passed). Nothing
    else changes the task's scope: a call that could (a server's clock, an approval asked at the start) gets
    a scope of its own (`_shares_scope`)."""

    __slots__ = ("_scope", "spent")

    def __init__(self, scope: anyio.CancelScope) -> None:
        self._scope = scope
        self.spent = False

    def cancel(self) -> None:
        self.spent = True
        self._scope.cancel()

    @property
    def deadline(self) -> float:
        return self._scope.deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.spent = True
        self._scope.deadline = value


def _loop_clock(native: object, asyncio: bool) -> Callable[[], float] | None:
    """The running loop's own clock reading, or None where the backend is neither asyncio nor trio."""
    if asyncio:
        return getattr(native, "time", None)  # the running asyncio loop (`anyio.lowlevel.current_token`)
    try:
        import trio.lowlevel  # under trio only: trio is no dependency of the package
    except ImportError:  # pragma: no cover
        return None
    return trio.lowlevel.current_clock().current_time
