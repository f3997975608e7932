"""Retries: only eligible calls, only after transient failures, within attempts, deadline and budget."""

from __future__ import annotations

import itertools
import math
import random
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    CallToolResult,
    ListToolsResult,
    TextContent,
    Tool,
    ToolAnnotations,
)

from benchmarks.retry_figures import measure
from dispatcher import CallStatus, ConfigurationError, Dispatcher, RetryPolicy, ToolCall, ToolEntry
from dispatcher._core._annotations import effective_annotations
from dispatcher._driver._retry import MAX_ATTEMPTS, Budget, eligible, is_transient
from dispatcher.testing import FaultInjector, FaultKind, inject_faults

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from dispatcher import ToolResult

IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)
NOT_IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)

# Short real-time waits, so that retries cost little on the real-clock backends.
FAST = RetryPolicy(wait_initial=0.001, wait_max=0.004, seed=0)

# Both backends, plus trio on a virtual clock that jumps whenever every task is blocked.
pytestmark = pytest.mark.backends("asyncio", "trio", "trio-mockclock")


def notes_server() -> MCPServer:
    """A server with honest annotations: `put` is idempotent, `append` is not, `get` reads.

    Its tools are async: a sync tool runs in a worker thread, and a virtual clock jumps ahead meanwhile.
    """
    server = MCPServer("notes")
    notes: dict[str, str] = {}

    @server.tool(annotations=IDEMPOTENT)
    async def put(key: str, value: str = "") -> str:
        """Set a note (idempotent)."""
        notes[key] = value
        return f"put {key}"

    @server.tool(annotations=NOT_IDEMPOTENT)
    async def append(key: str, value: str = "") -> str:
        """Append to a note (not idempotent)."""
        notes[key] = notes.get(key, "") + value
        return f"appended {key}"

    @server.tool(annotations=READ)
    async def get(key: str) -> str:
        """Read a note."""
        return notes.get(key, "")

    @server.tool(annotations=IDEMPOTENT)
    async def broken(key: str) -> str:
        """Always fails inside the tool: the server reports isError."""
        raise ValueError(f"cannot handle {key}")

    @server.tool(annotations=IDEMPOTENT)
    async def rejects(key: str, code: int) -> str:
        """Always answers with a JSON-RPC error of the given code."""
        raise MCPError(code=code, message=f"rejected {key}")

    return server


@asynccontextmanager
async def connected(
    *,
    trusted: bool = True,
    overrides: Mapping[str, ToolAnnotations] | None = None,
    retry: RetryPolicy | None = FAST,
    call_timeout: float | None = 60.0,
    **faults: Any,
) -> AsyncIterator[tuple[Dispatcher, FaultInjector]]:
    """A dispatcher on the notes server, with a fault injector on the server."""
    server = notes_server()
    injector = inject_faults(server, **faults)
    async with Client(server) as client, Dispatcher(call_timeout=call_timeout, retry=retry) as dispatcher:
        await dispatcher.add_mcp_server("notes", client, trusted=trusted, overrides=overrides)
        yield dispatcher, injector


def call(call_id: str, tool: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id, tool, {"key": call_id, **arguments})


def entry(annotations: ToolAnnotations | None, *, trusted: bool, override: ToolAnnotations | None = None) -> ToolEntry:
    return ToolEntry(
        "t", "s", "t", effective_annotations(annotations, trusted=trusted, override=override), trusted=trusted
    )


# The policy ------------------------------------------------------------------------------------------


def test_policy_defaults() -> None:
    """The defaults are the documented ones: 3 attempts, 0.1 to 5 s waits, a 30 s deadline, a budget."""
    policy = RetryPolicy()
    assert (policy.attempts, policy.wait_initial, policy.wait_max, policy.timeout) == (3, 0.1, 5.0, 30.0)
    assert policy.jitter and not policy.retry_read_only
    assert (policy.budget, policy.budget_refill) == (100.0, 0.2)
    assert Dispatcher().retry == policy


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        ({"attempts": 0}, "retry=None"),
        ({"attempts": 2.5}, "int >= 1"),
        ({"attempts": True}, "int >= 1"),
        ({"wait_initial": -1}, "wait_initial"),
        ({"wait_initial": math.inf}, "wait_initial"),
        ({"wait_max": 0.05}, ">= wait_initial"),
        ({"wait_max": math.nan}, "wait_max"),
        ({"timeout": 0}, "None for no overall deadline"),
        ({"timeout": math.inf}, "None for no overall deadline"),
        ({"budget": 0}, "None for no budget"),
        ({"budget_refill": -0.1}, "budget_refill"),
        ({"jitter": "yes"}, "True or False"),
        ({"retry_read_only": 1}, "True or False"),
        ({"seed": "x"}, "seed"),
    ],
)
def test_policy_rejects_bad_values_and_says_what_to_do(kwargs: dict[str, Any], hint: str) -> None:
    """A value out of range raises ConfigurationError whose message names the fix."""
    with pytest.raises(ConfigurationError, match=hint.replace("(", r"\(")):
        RetryPolicy(**kwargs)


def test_attempts_above_the_cap_are_rejected() -> None:
    """attempts above 10 raise ConfigurationError naming the cap instead of being lowered silently."""
    with pytest.raises(ConfigurationError, match="attempts must be at most 10, got 50"):
        RetryPolicy(attempts=50)
    assert RetryPolicy(attempts=MAX_ATTEMPTS).attempts == MAX_ATTEMPTS == 10


def test_policy_is_frozen_and_keyword_only() -> None:
    """A policy cannot be changed after construction, nor built from positional arguments."""
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.attempts = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        RetryPolicy(5)  # type: ignore[call-arg]


def test_dispatcher_rejects_a_retry_that_is_not_a_policy() -> None:
    """retry= takes a RetryPolicy or None, nothing else."""
    with pytest.raises(ConfigurationError, match="RetryPolicy or None"):
        Dispatcher(retry=3)  # type: ignore[arg-type]
    assert Dispatcher(retry=None).retry is None


def test_backoff_without_jitter_doubles_up_to_wait_max() -> None:
    """Without jitter the k-th retry waits wait_initial * 2**(k-1), capped at wait_max."""
    policy = RetryPolicy(wait_initial=0.5, wait_max=3.0, jitter=False)
    rng = random.Random(0)
    assert [policy.backoff(k, rng) for k in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_backoff_with_jitter_stays_in_its_window_and_follows_the_seed() -> None:
    """Full jitter: each wait is between wait_initial and twice the plain wait (capped); a seed repeats it."""
    policy = RetryPolicy(wait_initial=0.1, wait_max=5.0)
    rng = random.Random(42)
    waits = {k: [policy.backoff(k, rng) for _ in range(500)] for k in range(1, 10)}
    for k, drawn in waits.items():
        high = min(5.0, 0.1 * 2**k)
        assert all(0.1 <= wait <= high for wait in drawn)
        assert max(drawn) - min(drawn) > (high - 0.1) * 0.8, "the waits are not spread over the window"
    again = random.Random(42)
    assert [policy.backoff(1, again) for _ in range(500)] == waits[1]


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (MCPError(code=INTERNAL_ERROR, message="boom"), True),
        (MCPError(code=CONNECTION_CLOSED, message="closed"), True),
        (MCPError(code=REQUEST_TIMEOUT, message="slow"), True),
        (MCPError(code=INVALID_PARAMS, message="bad"), False),
        (MCPError(code=METHOD_NOT_FOUND, message="no"), False),
        (MCPError(code=-32099, message="server-defined"), False),
        (anyio.BrokenResourceError(), True),
        (anyio.ClosedResourceError(), True),
        (anyio.EndOfStream(), True),
        (ConnectionResetError(), True),
        (OSError("network down"), True),
        (TimeoutError(), True),
        (ValueError("bad"), False),
        (RuntimeError("bug"), False),
    ],
    ids=repr,
)
def test_which_failures_are_transient(exc: BaseException, transient: bool) -> None:
    """Timeouts, lost connections, -32603/-32000/-32001 are transient; rejections and bugs are not."""
    assert is_transient(exc) is transient


def test_eligibility_follows_trusted_idempotent_hints_only() -> None:
    """Only an effective (trusted) idempotentHint makes a tool eligible; read-only only on request."""
    policy, with_reads = RetryPolicy(), RetryPolicy(retry_read_only=True)
    assert eligible(policy, entry(IDEMPOTENT, trusted=True))
    assert not eligible(policy, entry(IDEMPOTENT, trusted=False)), "an untrusted claim bought a retry"
    assert eligible(policy, entry(IDEMPOTENT, trusted=False, override=ToolAnnotations(idempotent_hint=True)))
    assert not eligible(policy, entry(NOT_IDEMPOTENT, trusted=True))
    assert not eligible(policy, entry(None, trusted=True))
    assert not eligible(policy, entry(READ, trusted=True))
    assert eligible(with_reads, entry(READ, trusted=True))
    assert not eligible(with_reads, entry(READ, trusted=False))
    assert not eligible(with_reads, entry(NOT_IDEMPOTENT, trusted=True))


def test_budget_spends_one_token_per_retry_and_refills_on_success() -> None:
    """The bucket lends a token per retry, refunds a successful retry's token, earns a little per success."""
    budget = Budget(2, 0.25)
    assert budget.spend() and budget.spend()
    assert not budget.spend(), "an empty budget lent a token"
    budget.succeeded(retried=True)
    assert budget.tokens == 1.0
    for _ in range(3):
        budget.succeeded(retried=False)
    assert budget.tokens == 1.75 and budget.spend() and not budget.spend()
    for _ in range(100):
        budget.succeeded(retried=True)
    assert budget.tokens == 2, "the bucket grew past its capacity"


# Through a real MCP server -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_eligible_call_that_fails_twice_then_succeeds_is_ok_after_three_attempts() -> None:
    """An idempotent call failing twice transiently comes back OK, attempts == 3, with two attempt errors."""
    async with connected() as (dispatcher, faults):
        faults.fail_next("put", "error", "drop", strike="after")
        (result,) = await dispatcher.dispatch([call("p", "put", value="v")])
    assert result.status is CallStatus.OK, result.error
    assert result.attempts == 3 and len(faults.executions("put")) == 3
    first, second = result.attempt_errors
    # The injected "drop" is the server answering -32000: an answer (retried), not a lost connection.
    assert "-32603" in first and "the server answered with error -32000" in second
    assert result.error is None
    assert result.started_at is not None and result.started_at <= faults.ledger[0].started_at


@pytest.mark.anyio
async def test_timed_out_attempt_is_retried(virtual_clock: bool) -> None:
    """An attempt that exceeds call_timeout is abandoned and the idempotent call tried again."""
    timeout = 0.2 if virtual_clock else 2.0  # the second attempt must answer in time on a loaded machine too
    async with connected(call_timeout=timeout) as (dispatcher, faults):
        faults.fail_next("put", "hang")
        (result,) = await dispatcher.dispatch([call("p", "put")])
    assert result.ok and result.attempts == 2
    assert result.attempt_errors == (f"no result within call_timeout={timeout}s",)
    hung, done = faults.ledger
    assert hung.outcome == "cancelled" and done.outcome == "ok"


@pytest.mark.anyio
@pytest.mark.parametrize("strike", ["before", "after"])
async def test_non_idempotent_call_runs_at_most_once(strike: str) -> None:
    """A trusted non-idempotent tool is never repeated, even when the failure struck after it ran."""
    async with connected() as (dispatcher, faults):
        faults.fail_next("append", "drop", strike=strike)  # type: ignore[arg-type]
        (result,) = await dispatcher.dispatch([call("a", "append", value="x")])
    assert result.status is CallStatus.FAILED and result.attempts == 1 and result.attempt_errors == ()
    assert len(faults.executions("append")) == 1


@pytest.mark.anyio
async def test_untrusted_server_claim_buys_no_retry() -> None:
    """An untrusted server's idempotentHint is ignored: its calls run at most once."""
    async with connected(trusted=False) as (dispatcher, faults):
        faults.fail_next("put", "error")
        (result,) = await dispatcher.dispatch([call("p", "put")])
    assert result.status is CallStatus.FAILED and result.attempts == 1
    assert len(faults.executions("put")) == 1


@pytest.mark.anyio
async def test_user_override_makes_an_untrusted_tool_retryable() -> None:
    """The user's own idempotentHint override is trusted, even for an untrusted server."""
    overrides = {"put": ToolAnnotations(idempotent_hint=True)}
    async with connected(trusted=False, overrides=overrides) as (dispatcher, faults):
        faults.fail_next("put", "error")
        (result,) = await dispatcher.dispatch([call("p", "put")])
    assert result.ok and result.attempts == 2


@pytest.mark.anyio
async def test_read_only_tools_are_retried_only_when_the_policy_says_so() -> None:
    """A trusted read-only tool is not idempotent by default; retry_read_only=True makes it eligible."""
    async with connected() as (dispatcher, faults):
        faults.fail_next("get", "error")
        (result,) = await dispatcher.dispatch([call("g", "get")])
    assert result.status is CallStatus.FAILED and result.attempts == 1
    policy = RetryPolicy(retry_read_only=True, wait_initial=0.001, wait_max=0.001)
    async with connected(retry=policy) as (dispatcher, faults):
        faults.fail_next("get", "error")
        (result,) = await dispatcher.dispatch([call("g", "get")])
    assert result.ok and result.attempts == 2


@pytest.mark.anyio
async def test_is_error_results_are_never_retried() -> None:
    """A tool that answered with isError (injected or raised in the tool) ran: its call is not repeated."""
    async with connected() as (dispatcher, faults):
        faults.fail_next("put", "tool_error")
        injected, raised, unknown = await dispatcher.dispatch(
            [call("p", "put"), call("b", "broken"), ToolCall("u", "no_such_tool")]
        )
    assert injected.status is CallStatus.TOOL_ERROR and injected.attempts == 1
    assert raised.status is CallStatus.TOOL_ERROR and raised.attempts == 1
    assert unknown.status is CallStatus.FAILED and unknown.attempts == 0
    assert len(faults.executions("put")) == 1 and len(faults.executions("broken")) == 1


@pytest.mark.anyio
@pytest.mark.parametrize(("code", "retried"), [(INVALID_PARAMS, False), (METHOD_NOT_FOUND, False), (-32099, False)])
async def test_rejections_by_the_server_are_never_retried(code: int, retried: bool) -> None:
    """-32602, -32601 and other server-defined codes are final, even for an idempotent tool."""
    async with connected() as (dispatcher, faults):
        (result,) = await dispatcher.dispatch([call("r", "rejects", code=code)])
    assert result.status is CallStatus.FAILED and result.attempts == 1
    assert len(faults.executions("rejects")) == 1


@pytest.mark.anyio
async def test_cancelling_a_hanging_attempt_is_never_retried() -> None:
    """A caller who gives up cancels the running attempt; the call ends CANCELLED and is not repeated."""
    async with connected(call_timeout=None) as (dispatcher, faults):
        faults.fail_next("put", "hang")
        async with dispatcher.batch() as batch:
            pending = batch.submit(call("p", "put"))
            with anyio.fail_after(10):
                while not faults.ledger:
                    await anyio.lowlevel.checkpoint()
            batch.cancel()
        result = pending.result()
        with anyio.fail_after(10):  # the server sees the cancellation a little after the client sends it
            while faults.ledger[0].finished_at is None:  # noqa: ASYNC110 - the ledger has no event to wait on
                await anyio.sleep(0.01)
    assert result.status is CallStatus.CANCELLED and result.attempts == 1
    (execution,) = faults.ledger
    assert execution.outcome == "cancelled"


@pytest.mark.anyio
async def test_cancelling_during_the_backoff_ends_the_call() -> None:
    """A call cancelled while it waits to retry ends CANCELLED with the failure so far, with no new attempt."""
    failed = anyio.Event()
    runs: list[int] = []

    async def flaky() -> str:
        runs.append(1)
        failed.set()
        raise MCPError(code=INTERNAL_ERROR, message="try later")

    policy = RetryPolicy(wait_initial=30.0, wait_max=30.0, jitter=False, timeout=None)
    async with Dispatcher(retry=policy) as dispatcher:
        dispatcher.add_function(flaky, annotations=IDEMPOTENT)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                batch = dispatcher.batch()
                pending = batch.submit(ToolCall("f", "flaky"))
                tg.start_soon(batch.wait)
                await failed.wait()
                batch.cancel()
    result = pending.result()
    assert result.status is CallStatus.CANCELLED and result.attempts == 1
    assert result.attempt_errors == ("the server answered with error -32603: try later",)
    assert runs == [1]


@pytest.mark.anyio
async def test_cancelling_a_retry_attempt_ends_the_call() -> None:
    """A call cancelled during its second attempt ends CANCELLED after two attempts, with no third."""
    second = anyio.Event()
    runs: list[int] = []

    async def flaky() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise MCPError(code=CONNECTION_CLOSED, message="gone")
        second.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with Dispatcher(retry=FAST) as dispatcher:
        dispatcher.add_function(flaky, annotations=IDEMPOTENT)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                batch = dispatcher.batch()
                pending = batch.submit(ToolCall("f", "flaky"))
                tg.start_soon(batch.wait)
                await second.wait()
                batch.cancel()
        with anyio.fail_after(10):  # the cancelled attempt unwinds in a few steps, however loaded the machine
            while not dispatcher.idle:  # noqa: ASYNC110 - `idle` is a property with no event to wait on
                await anyio.sleep(0.01)
    result = pending.result()
    assert result.status is CallStatus.CANCELLED and result.error == "cancelled while running"
    assert result.attempts == 2 and result.attempt_errors == ("the server answered with error -32000: gone",)
    assert runs == [1, 1]


@pytest.mark.anyio
async def test_cancelling_the_waiting_task_propagates_and_is_not_retried() -> None:
    """Cancelling the task that awaits dispatch() cancels the call, and the cancellation propagates."""
    started = anyio.Event()

    async def slow() -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with Dispatcher(retry=FAST) as dispatcher:
        dispatcher.add_function(slow, annotations=IDEMPOTENT)
        results: list[ToolResult] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.extend(await dispatcher.dispatch([ToolCall("s", "slow")]))

            tg.start_soon(run)
            await started.wait()
            tg.cancel_scope.cancel()
        assert results == [], "the cancelled dispatch() returned instead of propagating"
        assert dispatcher.idle


@pytest.mark.anyio
@pytest.mark.parametrize(
    "exc",
    [anyio.BrokenResourceError(), anyio.ClosedResourceError(), anyio.EndOfStream(), OSError("reset"), TimeoutError()],
    ids=lambda exc: type(exc).__name__,
)
async def test_transport_errors_are_retried(exc: Exception) -> None:
    """A transport failure between client and server is transient for an eligible call."""
    client = FlakyClient([exc])
    async with Dispatcher(retry=FAST) as dispatcher:
        await dispatcher.add_mcp_server("flaky", cast("Client", client), trusted=True)
        (result,) = await dispatcher.dispatch([ToolCall("1", "put", {})])
    assert result.ok and result.attempts == 2 and client.calls == 2


@pytest.mark.anyio
async def test_a_bug_in_the_client_is_not_retried() -> None:
    """An exception that is not a transport failure is final."""
    client = FlakyClient([ValueError("bug")])
    async with Dispatcher(retry=FAST) as dispatcher:
        await dispatcher.add_mcp_server("flaky", cast("Client", client), trusted=True)
        (result,) = await dispatcher.dispatch([ToolCall("1", "put", {})])
    assert result.status is CallStatus.FAILED and result.attempts == 1 and client.calls == 1


@pytest.mark.anyio
async def test_local_functions_are_retried_on_transient_mcp_errors() -> None:
    """A local function declared idempotent is retried when it raises a transient MCPError."""
    runs: list[int] = []

    async def flaky() -> str:
        runs.append(1)
        if len(runs) < 3:
            raise MCPError(code=CONNECTION_CLOSED, message="upstream went away")
        return "ok"

    async with Dispatcher(retry=FAST) as dispatcher:
        dispatcher.add_function(flaky, annotations=IDEMPOTENT)
        (result,) = await dispatcher.dispatch([ToolCall("f", "flaky")])
    assert result.ok and result.attempts == 3 and len(runs) == 3


@pytest.mark.anyio
async def test_retry_none_never_retries() -> None:
    """Dispatcher(retry=None) runs every call once."""
    async with connected(retry=None) as (dispatcher, faults):
        faults.fail_next("put", "error")
        (result,) = await dispatcher.dispatch([call("p", "put")])
    assert result.status is CallStatus.FAILED and result.attempts == 1


@pytest.mark.anyio
async def test_concurrent_retried_calls_do_not_share_retry_state() -> None:
    """Reads retried at the same time each keep their own attempts and errors."""
    policy = RetryPolicy(retry_read_only=True, attempts=5, wait_initial=0.001, wait_max=0.004, seed=3)
    async with connected(retry=policy) as (dispatcher, faults):
        for i in range(1, 5):
            kinds: list[FaultKind] = ["error", "drop", "error", "drop"]
            faults.fail_next("get", *kinds[:i], arguments={"key": f"g{i}"})
        results = await dispatcher.dispatch([call(f"g{i}", "get") for i in range(5)])
    assert all(result.ok for result in results), [result.error for result in results]
    assert [result.attempts for result in results] == [1, 2, 3, 4, 5]
    assert [len(result.attempt_errors) for result in results] == [0, 1, 2, 3, 4]
    for i in range(5):
        assert len(faults.executions("get", {"key": f"g{i}"})) == i + 1


@pytest.mark.anyio
async def test_mutating_call_keeps_its_exclusive_turn_while_it_retries() -> None:
    """Nothing submitted after a retried write starts before its last attempt ends."""
    async with connected() as (dispatcher, faults):
        faults.fail_next("put", "error", "error")
        before, write, after, later = await dispatcher.dispatch(
            [call("r1", "get"), call("w", "put"), call("r2", "get"), call("a", "append")]
        )
    assert before.ok and write.ok and after.ok and later.ok
    assert write.attempts == 3
    runs = faults.executions("put")
    last_put = runs[-1]
    assert last_put.finished_at is not None
    (first_read,) = faults.executions("get", {"key": "r1"})
    assert first_read.finished_at is not None and first_read.finished_at <= runs[0].started_at
    for key, tool in (("r2", "get"), ("a", "append")):
        (execution,) = faults.executions(tool, {"key": key})
        assert execution.started_at >= last_put.finished_at, f"{key} overtook the retried write"


@pytest.mark.anyio
async def test_retry_budget_drains_in_an_outage_and_refills_on_success() -> None:
    """In a full outage a server's retries stop once its budget is spent; successes earn it back."""
    policy = RetryPolicy(budget=5, budget_refill=0.5, wait_initial=0.001, wait_max=0.001, seed=0)
    async with connected(retry=policy, rate=1.0, tools=["put"]) as (dispatcher, faults):
        results = await dispatcher.dispatch([call(f"p{i}", "put") for i in range(20)])
        assert [result.attempts for result in results[:4]] == [3, 3, 2, 1]
        assert sum(result.attempts for result in results) == 20 + 5
        assert "retry budget of server 'notes' is spent" in (results[-1].error or "")
        assert len(faults.executions("put")) == 25
        faults.rate = 0.0
        assert all(r.ok for r in await dispatcher.dispatch([call(f"q{i}", "put") for i in range(4)]))
        faults.rate = 1.0
        (result,) = await dispatcher.dispatch([call("z", "put")])
        assert result.attempts == 3, "four successes at 0.5 should have earned two retries back"


@pytest.mark.backends("trio-mockclock")
@pytest.mark.anyio
async def test_attempts_are_capped_at_ten() -> None:
    """A call of the largest allowed policy gets exactly 10 attempts, then stops."""
    policy = RetryPolicy(attempts=10, budget=None, timeout=None, seed=0)
    async with connected(retry=policy, rate=1.0, kinds=("drop",)) as (dispatcher, faults):
        (result,) = await dispatcher.dispatch([call("p", "put")])
    assert result.status is CallStatus.FAILED and result.attempts == 10
    assert len(result.attempt_errors) == 9 and len(faults.ledger) == 10
    assert (result.error or "").endswith("(after 10 attempts)")


@pytest.mark.backends("trio-mockclock")
@pytest.mark.anyio
async def test_backoff_waits_between_attempts_follow_the_policy() -> None:
    """Attempts are spaced by the policy's exponential waits (virtual clock, no jitter)."""
    policy = RetryPolicy(attempts=4, wait_initial=1.0, wait_max=3.0, jitter=False, timeout=None)
    async with connected(retry=policy, rate=1.0, kinds=("error",)) as (dispatcher, faults):
        await dispatcher.dispatch([call("p", "put")])
    starts = [execution.started_at for execution in faults.ledger]
    gaps = [round(later - earlier, 6) for earlier, later in itertools.pairwise(starts)]
    assert gaps == [1.0, 2.0, 3.0]


@pytest.mark.backends("trio-mockclock")
@pytest.mark.anyio
async def test_the_overall_deadline_holds() -> None:
    """No attempt starts after RetryPolicy.timeout, and retries are cut off at it."""
    policy = RetryPolicy(attempts=10, timeout=3.5, wait_initial=0.25, wait_max=0.25, jitter=False, budget=None)
    async with connected(retry=policy, call_timeout=1.0, rate=1.0, kinds=("hang",)) as (dispatcher, faults):
        (result,) = await dispatcher.dispatch([call("p", "put")])
    assert result.status is CallStatus.TIMEOUT
    assert result.started_at is not None
    deadline = result.started_at + 3.5
    assert all(execution.started_at < deadline for execution in faults.ledger)
    assert result.finished_at <= deadline + 1e-6
    assert result.attempts == len(faults.ledger) == 3
    assert "retry deadline (RetryPolicy.timeout=3.5s)" in (result.error or "")
    assert result.attempt_errors == ("no result within call_timeout=1.0s",) * 2


@pytest.mark.backends("trio-mockclock")
@pytest.mark.anyio
async def test_no_retry_when_the_wait_would_end_past_the_deadline() -> None:
    """A retry whose wait would end after the deadline is not made: the call ends at once."""
    policy = RetryPolicy(attempts=5, timeout=2.0, wait_initial=1.5, wait_max=1.5, jitter=False, budget=None)
    async with connected(retry=policy, rate=1.0, kinds=("error",)) as (dispatcher, faults):
        start = anyio.current_time()
        (result,) = await dispatcher.dispatch([call("p", "put")])
    assert result.attempts == 2 and len(faults.ledger) == 2
    assert result.finished_at - start < 2.0
    assert "no time left before RetryPolicy.timeout=2.0s" in (result.error or "")


@pytest.mark.backends("trio-mockclock")
@pytest.mark.anyio
async def test_the_first_attempt_has_the_full_call_timeout() -> None:
    """Being eligible never shortens a call: the first attempt is bounded by call_timeout alone."""
    policy = RetryPolicy(timeout=2.0)
    async with connected(retry=policy, call_timeout=10.0, rate=1.0, kinds=("hang",)) as (dispatcher, _):
        (result,) = await dispatcher.dispatch([call("p", "put")])
    assert result.status is CallStatus.TIMEOUT and result.attempts == 1
    assert result.run_time == pytest.approx(10.0)
    assert "not retried: RetryPolicy.timeout=2.0s has passed" in (result.error or "")


# Property: nothing ineligible ever runs twice -------------------------------------------------------

HINTS = (True, False, None)
TOOL_NAMES = [f"t_{ro}_{idem}".lower() for ro in HINTS for idem in HINTS]


def combos_server(name: str) -> MCPServer:
    """A server with one tool per combination of readOnlyHint and idempotentHint (None: not declared)."""
    server = MCPServer(name)
    for ro in HINTS:
        for idem in HINTS:

            async def tool(key: str) -> str:
                return key

            server.add_tool(
                tool,
                name=f"t_{ro}_{idem}".lower(),
                annotations=ToolAnnotations(read_only_hint=ro, idempotent_hint=idem),
            )
    return server


def expected_eligible(tool: str, trusted: bool, override: ToolAnnotations | None, retry_read_only: bool) -> bool:
    """Eligibility computed from first principles, independently of the dispatcher."""
    _, ro_text, idem_text = tool.split("_")
    declared = {"true": True, "false": False, "none": None}
    declared_ro, declared_idem = declared[ro_text], declared[idem_text]

    def hint(name: str, value: bool | None) -> bool:
        chosen = getattr(override, name) if override is not None else None
        if chosen is None and trusted:
            chosen = value
        return bool(chosen)

    return hint("idempotent_hint", declared_idem) or (retry_read_only and hint("read_only_hint", declared_ro))


override_strategy = st.one_of(
    st.none(),
    st.builds(
        ToolAnnotations,
        read_only_hint=st.sampled_from(HINTS),
        idempotent_hint=st.sampled_from(HINTS),
    ),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    trust=st.tuples(st.booleans(), st.booleans()),
    overrides=st.tuples(
        st.dictionaries(st.sampled_from(TOOL_NAMES), override_strategy, max_size=4),
        st.dictionaries(st.sampled_from(TOOL_NAMES), override_strategy, max_size=4),
    ),
    retry_read_only=st.booleans(),
    picks=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(TOOL_NAMES)), min_size=1, max_size=14),
    seed=st.integers(0, 2**16),
)
@pytest.mark.anyio
@pytest.mark.slow
async def test_no_ineligible_call_ever_runs_twice(
    trust: tuple[bool, bool],
    overrides: tuple[dict[str, ToolAnnotations | None], dict[str, ToolAnnotations | None]],
    retry_read_only: bool,
    picks: list[tuple[int, str]],
    seed: int,
) -> None:
    """Random batches, trust and annotations at a 30% fault rate: the ledger never shows an ineligible call twice."""
    servers = [combos_server("a"), combos_server("b")]
    kinds: tuple[FaultKind, ...] = ("hang", "drop", "error", "tool_error", "crash")
    injectors = [
        inject_faults(server, rate=0.3, seed=seed + i, kinds=kinds, strike="either") for i, server in enumerate(servers)
    ]
    policy = RetryPolicy(retry_read_only=retry_read_only, wait_initial=0.001, wait_max=0.004, seed=seed)
    user_overrides = [{tool: o for tool, o in chosen.items() if o is not None} for chosen in overrides]
    calls = [ToolCall(f"c{i}", tool, {"key": f"c{i}"}, server="ab"[s]) for i, (s, tool) in enumerate(picks)]
    async with (
        Client(servers[0]) as client_a,
        Client(servers[1]) as client_b,
        Dispatcher(call_timeout=0.05, retry=policy) as dispatcher,
    ):
        for name, client, trusted, chosen in zip("ab", (client_a, client_b), trust, user_overrides, strict=True):
            await dispatcher.add_mcp_server(name, client, trusted=trusted, overrides=chosen)
        with anyio.fail_after(60):
            results = await dispatcher.dispatch(calls)
    assert [result.call_id for result in results] == [c.id for c in calls]
    for (s, tool), c, result in zip(picks, calls, results, strict=True):
        runs = injectors[s].executions(tool, {"key": c.id})
        # Every run is one of the call's attempts. On a stalled loop an attempt can time out before the
        # server starts it (or the server starts it after the batch ended), so it may count without a run.
        assert len(runs) <= result.attempts, (c, result)
        if expected_eligible(tool, trust[s], user_overrides[s].get(tool), retry_read_only):
            assert len(runs) <= policy.attempts
        else:
            assert len(runs) <= 1, f"ineligible call {c} ran {len(runs)} times: {result}"
            assert result.attempts == 1, f"ineligible call {c} was attempted {result.attempts} times: {result}"
        if result.status in (CallStatus.OK, CallStatus.TOOL_ERROR):
            assert runs[-1].outcome == ("ok" if result.ok else "tool_error")
        assert len(result.attempt_errors) == result.attempts - 1


# Figures -------------------------------------------------------------------------------------------


@pytest.mark.backends("trio-mockclock")
@pytest.mark.anyio
async def test_figures_smoke() -> None:
    """The figures script runs: most calls succeed at 30% faults, an outage stays near one attempt per call."""
    flaky = await measure(calls=400, rate=0.3, seed=1, retry=RetryPolicy(seed=1))
    assert flaky.success_rate > 0.95 and 1.2 < flaky.attempts_per_call < 1.6
    outage = await measure(calls=400, rate=1.0, seed=1, retry=RetryPolicy(seed=1, budget=20))
    assert outage.success_rate == 0 and outage.attempts_per_call <= 1 + 20 / 400 + 1e-9


class FlakyClient:
    """A stand-in for `mcp.Client` whose calls raise the given exceptions first, then succeed."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    async def list_tools(self, cursor: str | None = None, **options: Any) -> ListToolsResult:
        return ListToolsResult(tools=[Tool(name="put", input_schema={"type": "object"}, annotations=IDEMPOTENT)])

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return CallToolResult(content=[TextContent(type="text", text="done")])
