"""Retries: which calls may be repeated, after which failures, how often and how soon.

A call is repeated only when repeating it is known to be harmless and its failure may be transient:

- eligible: the tool's effective idempotentHint is true. Effective annotations hold only trusted
  information (a trusted server's hints, the user's overrides, a local function's annotations), so an
  untrusted server cannot buy retries by claiming idempotence. `RetryPolicy.retry_read_only` lets
  trusted read-only tools count as idempotent too;
- transient: the outcome is unknown or the server may recover (a timeout, a lost connection or
  transport error, JSON-RPC -32603, -32000 and -32001, whether the server answered them or the SDK
  made them up). A tool that answered (even with ``isError``), a request the server rejected (-32601,
  -32602, or any other code) and cancellation are final. A -32000 answer is never a lost connection
  by itself: see `_failures`.

tenacity is the engine: `Retrier` builds a fresh `tenacity.AsyncRetrying` for every call, sleeping with
`anyio.sleep`. Its stop condition reads the event loop's clock (`anyio.current_time`), never tenacity's
wall-clock stops, so virtual clocks drive backoff and deadlines in tests. No tenacity type leaves
this module.

A `Budget` per server caps how much retrying can add to a server's load (a token bucket like the AWS
SDKs' retry quota): each retry spends one token; a first-attempt success earns a fraction of one back and
a successful retry returns the token it spent. At a moderate fault rate the bucket stays nearly full; in
an outage it drains and calls stop being retried, so the attempts per call fall back towards one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.lowlevel
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT
from tenacity import AsyncRetrying
from tenacity.retry import retry_if_result

from .._core import _checks as checks
from .._core._backoff import ceiling, check_waits
from .._core._backoff import is_number as _is_number
from .._core._errors import ConfigurationError
from .._mcp._failures import is_transport_failure

if TYPE_CHECKING:
    import random
    from collections.abc import Awaitable, Callable

    from mcp.types import CallToolResult
    from tenacity import RetryCallState

    from .._core._calls import CallStatus
    from .._core._catalog import ToolEntry

__all__ = [
    "MAX_ATTEMPTS",
    "Attempt",
    "Budget",
    "Retrier",
    "RetryBudget",
    "RetryPolicy",
    "eligible",
    "is_transient",
]

MAX_ATTEMPTS = 10
"""The most attempts a policy may allow (gRPC clamps its own to 5); more is a ConfigurationError."""

# Answers that may go away: -32000 (a server's "try later", such as a rate limit, or the SDK's own
# "connection closed" that the connection layer could not confirm), -32001 (the SDK's request timeout)
# and -32603 (internal error). Every other code is final, -32601 and -32602 above all.
_TRANSIENT_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT, INTERNAL_ERROR})


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """When and how a failed call is tried again.

    Only calls whose tool is declared idempotent by a trusted source are ever retried, and only after
    a failure that may be transient (docs/retries.md has the full rules). Everything else runs at most
    once, whatever this policy says.

    Args:
        attempts: The most attempts per call, the first included, from 1 (which turns retrying off)
            to 10.
        wait_initial: Seconds before the first retry (without jitter), and the shortest wait.
        wait_max: The longest wait between two attempts, in seconds.
        timeout: One deadline for all the attempts of a call, in seconds from the start of its first
            attempt: no attempt starts after it, and the attempts after the first are cut off at it.
            The first attempt is bounded by the dispatcher's ``call_timeout`` alone, like any call.
            None for no overall deadline.
        jitter: Randomise the waits (full jitter). Without jitter the k-th retry waits
            ``min(wait_max, wait_initial * 2**(k-1))``; with it, a uniformly random time between
            ``wait_initial`` and twice that, capped at ``wait_max``, so that calls that failed together
            do not retry together.
        budget: The retries each server may have outstanding in a burst (a token bucket, one token per
            retry), or None for no budget. A drained budget makes further transient failures of that
            server final until successes refill it.
        budget_refill: Tokens a call earns back for its server when its first attempt succeeds; a
            successful retry returns the token it spent. The defaults (100 tokens, 0.2 per success) are
            the AWS SDKs' retry quota (500 tokens, 5 per retry, 1 per success) in units of one retry.
        retry_read_only: Also retry tools whose only trusted hint is readOnlyHint. Off by default:
            idempotentHint is the spec's signal that repeating a call is harmless, and a read-only tool
            that is open-world may still have effects elsewhere (a metered API, a visit log).
        seed: Seeds the random source of the jitter, for reproducible waits; None seeds from the system.

    Raises:
        ConfigurationError: A value is out of range; the message says what to use instead.
    """

    attempts: int = 3
    wait_initial: float = 0.1
    wait_max: float = 5.0
    timeout: float | None = 30.0
    jitter: bool = True
    budget: float | None = 100.0
    budget_refill: float = 0.2
    retry_read_only: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        attempts = checks.whole("attempts", self.attempts, hint="use Dispatcher(retry=None) to turn retries off")
        if attempts > MAX_ATTEMPTS:
            raise ConfigurationError(
                f"attempts must be at most {MAX_ATTEMPTS}, got {attempts!r}; "
                "a call that fails that often will not be saved by more attempts"
            )
        check_waits(self.wait_initial, self.wait_max)
        checks.seconds("timeout", self.timeout, none="no overall deadline")
        if self.budget is not None and (not _is_number(self.budget) or not 1 <= self.budget < math.inf):
            raise ConfigurationError(
                f"budget must be a number of retries >= 1, got {self.budget!r}; use None for no budget"
            )
        if not _is_number(self.budget_refill) or not 0 <= self.budget_refill < math.inf:
            raise ConfigurationError(
                f"budget_refill must be a finite number of retries >= 0, got {self.budget_refill!r}"
            )
        for name in ("jitter", "retry_read_only"):
            checks.flag(name, getattr(self, name))
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ConfigurationError(f"seed must be an int or None, got {self.seed!r}")

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before the `retry`-th retry (1 for the wait after the first attempt)."""
        wait = ceiling(retry, self.wait_initial, self.wait_max)
        if not self.jitter:
            return wait
        return rng.uniform(self.wait_initial, min(self.wait_max, 2.0 * wait))


def eligible(policy: RetryPolicy, entry: ToolEntry, *, keyed: bool = False) -> bool:
    """Whether the calls of a tool may be repeated under this policy.

    `entry.annotations` are the effective annotations, which hold only trusted hints: an untrusted
    server's claims were replaced by the spec defaults (not idempotent, not read-only) when it was
    registered, while the user's overrides for it were kept. `keyed`: the user declared the tool's
    server to deduplicate calls by an idempotency key (`IdempotencyKeys`), which each call carries; a
    trusted server's tools are then all repeatable, since a repeated key does nothing more.
    """
    annotations = entry.annotations
    if keyed and entry.trusted and not annotations.read_only_hint:
        return True
    return bool(annotations.idempotent_hint) or (policy.retry_read_only and bool(annotations.read_only_hint))


def is_transient(exc: BaseException) -> bool:
    """Whether an exception raised by one attempt may go away if the call is made again.

    Cancellation is not transient: it is never passed here, and it would not qualify if it were.
    """
    if isinstance(exc, MCPError):
        return exc.error.code in _TRANSIENT_CODES
    return isinstance(exc, TimeoutError) or is_transport_failure(exc)


class RetryBudget(Protocol):
    """A server's retry tokens: `Budget` in one process, or one shared by a fleet (`dispatcher.fleet`)."""

    def spend(self) -> bool | Awaitable[bool]:
        """Take the token for one retry; False (and nothing taken) when there is none left."""
        ...

    def succeeded(self, retried: bool) -> None:
        """A call got an answer: a retried call returns its last token, any other earns the refill."""
        ...


class Budget:
    """One server's retry tokens. Single-threaded: only the event loop's tasks touch it."""

    __slots__ = ("capacity", "refill", "tokens")

    def __init__(self, capacity: float, refill: float) -> None:
        self.capacity = capacity
        self.refill = refill
        self.tokens = capacity

    def spend(self) -> bool:
        """Take the token for one retry; False (and nothing taken) when there is none left."""
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def succeeded(self, retried: bool) -> None:
        """A call got an answer: a retried call returns its last token, any other earns the refill."""
        self.tokens = min(self.capacity, self.tokens + (1.0 if retried else self.refill))


@dataclass(slots=True)
class Attempt:
    """How one attempt of a call ended.

    Attributes:
        status: The status the call gets if this attempt is its last.
        result: The tool's answer (OK or TOOL_ERROR), else None.
        error: Why the attempt did not succeed, else None.
        transient: Whether trying again could give a different outcome.
        untrusted: Whether `error` quotes text a server wrote (see `ToolResult.untrusted_content`).
    """

    status: CallStatus
    result: CallToolResult | None = None
    error: str | None = None
    transient: bool = False
    untrusted: bool = False

    @property
    def answered(self) -> bool:
        """Whether the tool answered (OK or isError): evidence that its server is up."""
        return self.result is not None


def _transient(attempt: Attempt) -> bool:
    return attempt.transient


class Retrier:
    """The retry state of one call: its attempts, waits, deadline and the errors seen so far.

    Build one per call; never share one between calls (tenacity's retrying objects keep per-call state,
    and so does this).

    Args:
        policy: The dispatcher's retry policy.
        budget: The retry budget of the call's server, or None for no budget.
        rng: The random source of the jitter.
        server: The server's name, for messages.
        recheck: Asked before each retry (after the wait's length is drawn, before the budget is
            spent): why the call may no longer be retried (its tool's effective annotations read
            again, as they may have changed during the backoff), or None if it still may.
    """

    __slots__ = ("_budget", "_deadline", "_policy", "_recheck", "_rng", "_server", "_started", "_stopped", "errors")

    def __init__(
        self,
        policy: RetryPolicy,
        budget: RetryBudget | None,
        rng: random.Random,
        server: str | None,
        *,
        recheck: Callable[[], str | None] | None = None,
    ) -> None:
        self._policy = policy
        self._recheck = recheck
        self._budget = budget
        self._rng = rng
        self._server = server
        self._deadline = math.inf
        self._started = 0
        self._stopped: str | None = None
        self.errors: list[str] = []
        """Why each finished attempt failed, oldest first (a successful attempt adds nothing)."""

    @property
    def attempts(self) -> int:
        """How many attempts have started."""
        return self._started

    async def run(self, attempt: Callable[[float, float], Awaitable[Attempt]], started: float) -> Attempt:
        """Make attempts until one is final, or the policy says to stop; return the last one.

        Args:
            attempt: Runs one attempt and describes how it ended, without raising (cancellation
                aside). Its arguments are the loop-clock times at which it starts and at which it
                must be cut off to respect the overall deadline (``math.inf`` for the first attempt).
            started: The loop-clock time at which the first attempt starts.

        Returns:
            The last attempt, its error extended with why retrying stopped when it stopped on a
            transient failure.
        """
        if self._policy.timeout is not None:
            self._deadline = started + self._policy.timeout
        self._started = 1
        last = await attempt(started, math.inf)
        if last.error is not None:
            self.errors.append(last.error)
        if last.transient:
            # Only now is the retry machinery needed; the common case never builds it.
            last = await self._retry(last, attempt)
        if self._budget is not None and last.answered:
            self._budget.succeeded(retried=self._started > 1)
        if last.transient and self._stopped is not None and last.error is not None:
            last.error = f"{last.error} ({self._stopped})"
        return last

    async def _retry(self, first: Attempt, attempt: Callable[[float, float], Awaitable[Attempt]]) -> Attempt:
        # tenacity is handed the first attempt's outcome as its own first attempt, so that every
        # decision to retry, wait or stop is taken by the same engine.
        replay: Attempt | None = first
        previous = first

        async def one() -> Attempt:
            nonlocal replay, previous
            if replay is not None:
                outcome, replay = replay, None
                return outcome
            # The backoff has ended (or a shared budget answered): a cancellation that came as it ended may not
            # have landed yet. Under asyncio a scope cancelled once the sleep's future is done leaves its
            # cancellation for the task's next checkpoint, and nothing from here to the tool is one: this is it,
            # so a cancelled call starts no attempt after any wait.
            await anyio.lowlevel.checkpoint_if_cancelled()
            if self._recheck is not None and self._recheck() is not None:
                # Eligibility changed during the wait: no attempt; `_stop` says why and ends it.
                return previous
            self._started += 1
            outcome = previous = await attempt(anyio.current_time(), self._deadline)
            if outcome.error is not None:
                self.errors.append(outcome.error)
            return outcome

        retrying = AsyncRetrying(
            sleep=anyio.sleep,
            stop=self._stop,  # type: ignore[arg-type]  # AsyncRetrying awaits a coroutine stop; its hint omits it
            wait=self._wait,
            # A failed outcome is an exception out of `one`: cancellation, or a bug. Never retried:
            # tenacity re-raises it.
            retry=retry_if_result(_transient),
            retry_error_callback=_last_outcome,
        )
        try:
            last: Attempt = await retrying(one)
        finally:
            # tenacity keeps its last iteration's actions (bound methods of `retrying`) in its
            # per-thread state, a cycle through `retrying` and this retrier: break it, so that a
            # finished call is freed by reference counting instead of waiting for the collector.
            retrying.iter_state.reset()
        return last

    def _wait(self, state: RetryCallState) -> float:
        return self._policy.backoff(self._started, self._rng)

    async def _stop(self, state: RetryCallState) -> bool:
        # Consulted after a transient failure, with the next wait already drawn. The budget is asked
        # last, so a token is spent only on a retry that will happen.
        policy = self._policy
        started = self._started
        if started >= policy.attempts:
            self._stopped = f"after {started} attempts" if started > 1 else None
            return True
        now = anyio.current_time()
        if now >= self._deadline:
            # An attempt cut off at the deadline says so in its own error.
            self._gave_up(f"RetryPolicy.timeout={policy.timeout}s has passed" if started == 1 else "")
            return True
        if now + state.upcoming_sleep >= self._deadline:
            self._gave_up(f"no time left before RetryPolicy.timeout={policy.timeout}s")
            return True
        if self._recheck is not None:
            why = self._recheck()
            if why is not None:
                self._gave_up(why)
                return True
        if self._budget is not None and not await _spend(self._budget):
            where = "local functions" if self._server is None else f"server {self._server!r}"
            self._gave_up(f"the retry budget of {where} is spent")
            return True
        return False

    def _gave_up(self, why: str) -> None:
        started = self._started
        if started == 1:
            self._stopped = f"not retried: {why}"
        else:
            self._stopped = f"after {started} attempts; {why}" if why else f"after {started} attempts"


async def _spend(budget: RetryBudget) -> bool:
    # A local budget answers at once; a shared one asks its coordination service.
    spent = budget.spend()
    return spent if isinstance(spent, bool) else await spent


def _last_outcome(state: RetryCallState) -> Attempt:
    assert state.outcome is not None
    outcome: Attempt = state.outcome.result()
    return outcome
