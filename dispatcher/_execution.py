"""Execution: how a submitted call is admitted, run and settled.

Calls are admitted by `_gate.Gate` (a fair readers-writer discipline with limits) and run by a pool of
worker tasks that lives in the dispatcher's task group. A worker that finishes a call takes the next
admitted call itself, so a stream of short calls costs no task creation per call; workers are created
on demand up to the concurrency limit and park when there is nothing to run.

Every call settles exactly once into a `ToolResult`. Failures are results, never exceptions that could
cancel siblings. Cancelling a waiting caller cancels that caller's calls, waits until they have ended,
and then lets the cancellation propagate.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ._batch import Batch, PendingCall
from ._calls import CallStatus, ToolResult
from ._catalog import ArgumentError
from ._coordination import admitted_runner, budget_factory
from ._errors import DispatcherClosedError
from ._gate import Gate, Ticket
from ._mcp import describe_failure
from ._retry import Attempt, Retrier, RetryPolicy, eligible, is_transient

if TYPE_CHECKING:
    from collections.abc import Iterable

    from anyio.abc import TaskGroup
    from mcp.types import CallToolResult

    from ._approval import ApprovalRequest
    from ._calls import ToolCall
    from ._catalog import Catalog, ToolEntry
    from ._hooks import CallHooks
    from ._observe import CallState
    from ._retry import RetryBudget

__all__ = ["Executor", "settle"]

# The longest `ToolResult.error` kept; a longer explanation is cut, saying how long it was.
_MAX_ERROR = 1000

# Parked workers kept for reuse when there is no concurrency limit; beyond this, idle workers exit.
_IDLE_WORKERS_UNLIMITED = 64


def settle(
    work: PendingCall,
    status: CallStatus,
    *,
    result: CallToolResult | None = None,
    error: str | None = None,
    attempts: int = 0,
    attempt_errors: tuple[str, ...] = (),
) -> None:
    """Give a call its one result, tell its hooks and waiters, and count it done in its batch."""
    entry = work._entry
    if error is not None and len(error) > _MAX_ERROR:
        # A tool or server can put anything in its error text; the full text stays in `result`.
        error = f"{error[:_MAX_ERROR]}... ({len(error):,} characters in all)"
    work._result = settled = ToolResult(
        work.call,
        status,
        result=result,
        error=error,
        attempts=attempts,
        tool=entry.name if entry is not None else None,
        server=entry.server if entry is not None else None,
        queued_at=work.queued_at,
        started_at=work.started_at,
        finished_at=anyio.current_time(),
        attempt_errors=attempt_errors,
        # Anything an open-world tool sent back, errors included, may carry instructions.
        untrusted_content=attempts > 0 and entry is not None and bool(entry.annotations.open_world_hint),
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
    if work._event is not None:
        work._event.set()
    assert batch is not None, "a call settles once"
    batch._settled()


class _Slot:
    """A parked worker waiting to be handed a call."""

    __slots__ = ("event", "ticket")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.ticket: Ticket[PendingCall] | None = None


class Executor:
    """Admits, runs and settles the calls of every batch of one dispatcher.

    Args:
        catalog: Where call names resolve to tools.
        max_concurrency: The most calls running at once, or None for no limit.
        call_timeout: Seconds each attempt may take, or None.
        retry: The retry policy, or None to never retry.
        coordinator: The fleet's `Coordinator` (`_coordination`), or None: this process decides alone.
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
        # The fleet hook: how an admitted call runs (`_run` itself without a coordinator), and retry budgets.
        self._run_admitted = admitted_runner(coordinator, self._run)
        self._new_budget = budget_factory(coordinator)
        self._rng = random.Random(retry.seed if retry is not None else None)
        self.gate: Gate[PendingCall] = Gate(max_concurrency)
        self.live: set[Batch] = set()
        """The batches that have calls without a result."""
        self._tg: TaskGroup | None = None
        self._open = False
        self._idle: list[_Slot] = []
        self._idle_cap = max_concurrency if max_concurrency is not None else _IDLE_WORKERS_UNLIMITED
        self._workers = 0
        self._watched: deque[PendingCall] = deque()
        self._watchdog_wake: anyio.Event | None = None

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
        if self._call_timeout is not None:
            tg.start_soon(self._watchdog, self._call_timeout)

    def close(self) -> None:
        """Take no more calls; the outstanding ones end as CANCELLED."""
        self._open = False
        # Waiters get their results instead of hanging.
        for batch in list(self.live):
            batch.cancel()
        for slot in self._idle:
            slot.event.set()
        self._idle.clear()

    def check_open(self) -> None:
        """Raise `DispatcherClosedError` unless calls can be submitted."""
        if not self._open:
            raise DispatcherClosedError("the Dispatcher is not open: use it inside `async with Dispatcher() as d:`")

    # Submission ------------------------------------------------------------------------------------

    def submit_all(self, batch: Batch, calls: list[ToolCall]) -> list[PendingCall]:
        """Queue checked calls of `batch` in order."""
        submit = self.submit
        return [submit(batch, call) for call in calls]

    def submit(self, batch: Batch, call: ToolCall) -> PendingCall:
        """Queue one checked call of `batch`; a call that cannot run settles at once as FAILED."""
        self.check_open()
        work = PendingCall(call, batch, anyio.current_time())
        batch._works.append(work)
        batch._added()
        resolution = self._catalog.resolve(call.name, call.server)
        hooks = batch._hooks
        if hooks is not None:
            work._state = hooks.queued(call, resolution.entry, work.queued_at)
        if resolution.entry is None or resolution.impl is None:
            settle(work, CallStatus.FAILED, error=resolution.error)
            return work
        work._entry = entry = resolution.entry
        work._impl = impl = resolution.impl
        arguments = call.arguments if call.arguments is not None else {}
        if not isinstance(arguments, Mapping):
            settle(work, CallStatus.FAILED, error=_invalid_arguments(arguments))
            return work
        try:
            work._prepared = impl.prepare(arguments)
        except ArgumentError as exc:
            settle(work, CallStatus.FAILED, error=str(exc))
            return work
        except Exception as exc:
            settle(work, CallStatus.FAILED, error=f"invalid arguments: {type(exc).__name__}: {exc}")
            return work
        if hooks is None:
            work._ticket = self.gate.submit(work, exclusive=entry.exclusive, server=entry.server)
        else:
            self._submit_hooked(work, entry, hooks)
        self._pump()
        return work

    def _submit_hooked(self, work: PendingCall, entry: ToolEntry, hooks: CallHooks) -> None:
        """Queue a call of a batch with hooks: held at its place while its approval is asked for."""
        state = work._state
        assert state is not None
        request = hooks.approval(work.call, entry, state)
        work._ticket = self.gate.submit(work, exclusive=entry.exclusive, server=entry.server, held=request is not None)
        if request is not None:
            assert self._tg is not None
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

    async def _approve_at_start(self, work: PendingCall, state: CallState, scope: anyio.CancelScope) -> bool:
        """Ask the approval the session guard may now require of a call about to start.

        Returns:
            Whether the call was denied (and settled).
        """
        hooks = work._hooks
        assert hooks is not None
        request = hooks.recheck(work.call, state)
        if request is None:
            return False
        work._scope = scope
        try:
            denial = await hooks.ask(request, state)
        except BaseException:
            work._scope = None
            if work._result is None:
                why = "cancelled while waiting for approval" if work._cancel_requested else "the dispatcher closed"
                settle(work, CallStatus.CANCELLED, error=why)
            raise
        work._scope = None
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

    # Workers ---------------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Hand every call the gate admits now to a parked worker, or to a new one."""
        gate = self.gate
        idle = self._idle
        while True:
            ticket = gate.take()
            if ticket is None:
                return
            if idle:
                slot = idle.pop()
                slot.ticket = ticket
                slot.event.set()
            else:
                assert self._tg is not None
                self._workers += 1
                self._tg.start_soon(self._worker, ticket)

    async def _next(self) -> Ticket[PendingCall] | None:
        """The next admitted call for a worker that just finished one, parking if there is none."""
        # Take a call before waking others: a worker with work to do never parks.
        ticket = self.gate.take()
        self._pump()
        if ticket is None and self._open and len(self._idle) < self._idle_cap:
            slot = _Slot()
            self._idle.append(slot)
            await slot.event.wait()
            ticket = slot.ticket
        return ticket

    async def _worker(self, ticket: Ticket[PendingCall] | None) -> None:
        """Run admitted calls one after another until there is nothing left to run.

        A cancel scope per call would cost more than the rest of a short call's bookkeeping, so a worker
        runs its calls inside one scope and only opens a new one after that scope was cancelled to
        interrupt a call (a timeout, or its caller giving up).
        """
        gate = self.gate
        try:
            while ticket is not None:
                with anyio.CancelScope() as scope:
                    while ticket is not None:
                        await self._run_admitted(ticket.item, scope)
                        gate.finish(ticket)
                        ticket = None
                        if scope.cancel_called:
                            break  # the scope is spent; open a fresh one
                        ticket = await self._next()
                if ticket is not None:
                    # The call was interrupted by its scope: settle it, free its place, go on.
                    work = ticket.item
                    work._scope = None
                    if work._result is None:
                        if work._cancel_requested:
                            settle(work, CallStatus.CANCELLED, error="cancelled while running", attempts=1)
                        else:
                            timeout = self._call_timeout
                            settle(
                                work,
                                CallStatus.TIMEOUT,
                                error=f"no result within call_timeout={timeout}s",
                                attempts=1,
                            )
                    gate.finish(ticket)
                ticket = await self._next()
        finally:
            self._workers -= 1
            if ticket is not None and ticket.item._result is None:
                # The dispatcher is closing under this worker.
                settle(ticket.item, CallStatus.CANCELLED, error="the dispatcher closed", attempts=1)

    # One call --------------------------------------------------------------------------------------

    async def _run(self, work: PendingCall, scope: anyio.CancelScope) -> None:
        """Run one admitted call and settle it, unless its scope interrupts it."""
        if work._cancel_requested:
            settle(work, CallStatus.CANCELLED, error="cancelled before it started")
            return
        state = work._state
        if state is not None and state.recheck and await self._approve_at_start(work, state, scope):
            return
        impl = work._impl
        assert impl is not None
        retry = self._retry
        if retry is not None and work._entry is not None and eligible(retry, work._entry):
            await self._run_retrying(work, scope, retry)
            return
        work.started_at = anyio.current_time()
        if state is not None:
            hooks = work._hooks
            assert hooks is not None
            hooks.attempt_started(work.call, state, work.started_at)  # its end is reported with the result
        work._scope = scope
        if self._call_timeout is not None:
            self._watch(work)
        try:
            result = await impl.invoke(work._prepared)
        except Exception as exc:
            work._scope = None
            status, error = describe_failure(exc)
            settle(work, status, error=error, attempts=1)
            return
        work._scope = None
        if result.is_error:
            settle(work, CallStatus.TOOL_ERROR, result=result, error=_error_text(result), attempts=1)
        else:
            settle(work, CallStatus.OK, result=result, attempts=1)

    async def _run_retrying(self, work: PendingCall, scope: anyio.CancelScope, policy: RetryPolicy) -> None:
        """Run a call that may be repeated, attempt after attempt, and settle it.

        The call keeps its place in the gate through every attempt and every wait, so an exclusive
        call keeps its exclusive turn and nothing overtakes it. Each attempt has its own cancel scope
        with its deadline instead of the watchdog, since a timed-out attempt must leave the call
        running; `scope` is still what its caller's cancellation (or the dispatcher closing)
        cancels, and that always propagates.
        """
        entry = work._entry
        impl = work._impl
        assert entry is not None and impl is not None
        prepared = work._prepared
        server = entry.server
        budget = None
        if policy.budget is not None:
            budget = self._budgets.get(server)
            if budget is None:
                budget = self._budgets[server] = self._new_budget(server, policy.budget, policy.budget_refill)
        retrier = Retrier(policy, budget, self._rng, server)
        call_timeout = self._call_timeout
        state = work._state
        hooks = work._hooks

        async def attempt(start: float, limit: float) -> Attempt:
            if state is None:
                return await attempt_once(start, limit)
            assert hooks is not None
            hooks.attempt_started(work.call, state, start)
            outcome = await attempt_once(start, limit)
            hooks.attempt_finished(state, outcome.status, outcome.error)
            return outcome

        async def attempt_once(start: float, limit: float) -> Attempt:
            deadline = limit if call_timeout is None else min(limit, start + call_timeout)
            with anyio.CancelScope(deadline=deadline):
                try:
                    result = await impl.invoke(prepared)
                except Exception as exc:
                    status, error = describe_failure(exc)
                    return Attempt(status, error=error, transient=is_transient(exc))
                if result.is_error:
                    return Attempt(CallStatus.TOOL_ERROR, result, _error_text(result))
                return Attempt(CallStatus.OK, result)
            # Only the attempt's own deadline is absorbed by its scope; a cancellation of the call
            # (or of the dispatcher) is still pending and is raised here.
            await anyio.lowlevel.checkpoint_if_cancelled()
            if call_timeout is None or deadline == limit:
                return Attempt(
                    CallStatus.TIMEOUT,
                    error=f"no result before the retry deadline (RetryPolicy.timeout={policy.timeout}s)",
                    transient=True,
                )
            return Attempt(CallStatus.TIMEOUT, error=f"no result within call_timeout={call_timeout}s", transient=True)

        work.started_at = started = anyio.current_time()
        work._scope = scope
        try:
            last = await retrier.run(attempt, started)
        except BaseException:
            # Cancelled: settled now with the attempts made so far, then propagated, never retried.
            work._scope = None
            if work._result is None:
                settle(
                    work,
                    CallStatus.CANCELLED,
                    error="cancelled while running" if work._cancel_requested else "the dispatcher closed",
                    attempts=retrier.attempts,
                    attempt_errors=tuple(retrier.errors),
                )
            raise
        work._scope = None
        errors = retrier.errors if last.error is None else retrier.errors[:-1]
        settle(
            work,
            last.status,
            result=last.result,
            error=last.error,
            attempts=retrier.attempts,
            attempt_errors=tuple(errors),
        )

    # Timeouts --------------------------------------------------------------------------------------

    def _watch(self, work: PendingCall) -> None:
        """Put a started call under the watchdog.

        Every call has the same timeout, so deadlines arrive in start order and a FIFO is a complete
        timer queue. Entries of calls that already ended are dropped as they reach the front.
        """
        queue = self._watched
        while queue and queue[0]._result is not None:
            queue.popleft()
        queue.append(work)
        if self._watchdog_wake is not None:
            self._watchdog_wake.set()
            self._watchdog_wake = None

    async def _watchdog(self, call_timeout: float) -> None:
        queue = self._watched
        while True:
            while queue and (queue[0]._result is not None or queue[0]._scope is None):
                queue.popleft()
            if not queue:
                wake = self._watchdog_wake = anyio.Event()
                await wake.wait()
                continue
            head = queue[0]
            assert head.started_at is not None
            remaining = head.started_at + call_timeout - anyio.current_time()
            if remaining > 0:
                await anyio.sleep(remaining)
                continue
            queue.popleft()
            if head._result is None and head._scope is not None:
                head._scope.cancel()


def _invalid_arguments(arguments: object) -> str:
    """Why arguments that are not a mapping are rejected; JSON text that failed to parse says where."""
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except ValueError as exc:
            text = arguments if len(arguments) <= 200 else f"{arguments[:200]}..."
            return f"invalid arguments: expected a JSON object, got text that is not valid JSON ({exc}): {text!r}"
        return "invalid arguments: expected a JSON object, got a str of JSON text; parse it into a dict"
    return f"invalid arguments: expected a JSON object, got {type(arguments).__name__}"


def _error_text(result: CallToolResult) -> str:
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]  # type: ignore[union-attr]
    return " ".join(texts).strip() or "the tool reported an error"
