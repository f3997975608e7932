"""One seeded chaos run against an in-process workspace: faults, cut connections, mixed batches.

`run_scenario(seed)` draws everything from `random.Random(seed)`: the dispatcher's limits, the faults
(`dispatcher.testing.inject_faults`: hangs, dropped answers, server errors, tool errors and crashes,
striking before or after the tool ran), the latencies, when connections are cut, and the batches, sent
to a trusted and an untrusted registration of the same server, one at a time or two at once. It checks
every invariant of `harness` after each batch, then that a batch runs clean once the faults stop.

Under trio's `MockClock(autojump_threshold=0)` with the scheduler's random source seeded (see
`run_replayable`), a seed always gives the same run: the same `Report.trace`. A failing seed can be
replayed with ``python -m tests.chaos.replay SEED``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import trio
from trio.testing import MockClock

from dispatcher import CallStatus, Dispatcher, ReconnectPolicy, RetryPolicy, ToolCall
from dispatcher.examples import Workspace
from dispatcher.testing import inject_faults

from . import harness
from .harness import FIGURES, Cuttable, call_key

if TYPE_CHECKING:
    from dispatcher import CallEvent, ToolResult
    from dispatcher.testing import FaultKind

# (tool, weight); arguments are made unique per call so that ledgers map back to calls.
_TOOLS = (
    ("search_notes", 3),
    ("read_note", 3),
    ("fetch_url", 2),
    ("create_note", 1),
    ("set_note", 2),
    ("append_note", 2),
    ("delete_note", 1),
    ("send_message", 1),
)
_FAULT_KINDS: tuple[FaultKind, ...] = ("hang", "drop", "error", "tool_error", "crash")


@dataclass
class Report:
    """What one run did and what it found."""

    seed: int
    trace: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    batches: int = 0
    calls: int = 0
    faults: int = 0
    cuts: int = 0


def make_call(rng: random.Random, call_id: str, server: str) -> ToolCall:
    """A random call of the workspace with arguments unique to it."""
    tool = rng.choices([name for name, _ in _TOOLS], weights=[weight for _, weight in _TOOLS])[0]
    arguments: dict[str, str] = {
        "search_notes": {"query": call_id},
        "read_note": {"name": call_id},
        "fetch_url": {"url": f"https://{call_id}.example/"},
        "create_note": {"name": call_id, "text": call_id},
        "set_note": {"name": f"s{rng.randrange(3)}", "text": call_id},
        "append_note": {"name": f"a{rng.randrange(2)}", "text": call_id},
        "delete_note": {"name": call_id},
        "send_message": {"to": "ops", "text": call_id},
    }[tool]
    return ToolCall(call_id, tool, arguments, server=server)


def _event_line(event: CallEvent, start: float) -> str:
    line = f"{event.time - start:.6f} {event.kind} {event.call.id} attempt={event.attempt}"
    if event.result is not None:
        line += f" {event.result.status.value}"
    if event.error is not None:
        line += f" error={event.error!r}"
    return line


async def run_scenario(
    seed: int,
    *,
    batches: int = 3,
    time_scale: float = 1.0,
    reconnect: ReconnectPolicy | None = None,
    probe_rounds: int = 1,
) -> Report:
    """Run one seeded scenario; latencies and waits are multiplied by `time_scale`, timeouts by at least 0.5.

    After the faults stop, a probe batch must be answered. On a virtual clock (``probe_rounds=1``) its
    first sending must be. On a real clock, pass more rounds: a probe call that ran out of
    ``call_timeout`` (a loaded machine can stall the loop past a short one) is sent again, up to
    `probe_rounds` times in all; a dispatcher that does not recover still fails every round.
    """
    rng = random.Random(seed)
    report = Report(seed)
    start = anyio.current_time()
    events: list[CallEvent] = []
    workspace = Workspace(
        latency_by_tool={name: rng.choice((0.0, 0.01, 0.1, 0.4)) * time_scale for name, _ in _TOOLS},
    )
    faults = inject_faults(
        workspace.server,
        rate=rng.choice((0.05, 0.15, 0.3)),
        seed=seed,
        kinds=rng.sample(_FAULT_KINDS, rng.randint(1, len(_FAULT_KINDS))),
        strike="either",
    )
    cuttable = Cuttable(workspace.server)
    policy = RetryPolicy(
        attempts=rng.choice((1, 2, 3, 5)),
        wait_initial=0.05 * time_scale,
        wait_max=0.5 * time_scale,
        timeout=rng.choice((None, 10.0 * time_scale)),
        budget=rng.choice((None, 5.0, 100.0)),
        retry_read_only=rng.random() < 0.3,
        seed=seed,
    )
    # On a real clock, timeouts are scaled down less than latencies: a busy machine (or a long garbage
    # collection in a big test session) must not make the probe time out.
    call_timeout = rng.choice((0.5, 2.0)) * max(time_scale, 0.5)
    # With no hook, the scheduler takes its plain path (no per-call state): run both.
    observe = rng.random() < 0.7
    limit = rng.choice((None, 1, 2, 4, 16))
    cut_every = rng.choice((None, 0.3, 1.0, 3.0))

    def on_event(event: CallEvent) -> None:
        events.append(event)
        report.trace.append(_event_line(event, start))

    hook = on_event if observe else None
    async with Dispatcher(max_concurrency=limit, call_timeout=call_timeout, retry=policy, on_event=hook) as d:
        await d.connect("ws", cuttable.client, trusted=True, max_concurrency=rng.choice((None, 2)), reconnect=reconnect)
        await d.connect("raw", cuttable.client, trusted=False, reconnect=reconnect)

        async def cutter() -> None:
            assert cut_every is not None
            while True:
                await anyio.sleep(rng.expovariate(1 / cut_every) * time_scale)
                if cuttable.cut():
                    report.trace.append(f"{anyio.current_time() - start:.6f} cut")

        async def one_batch(number: int, results_out: dict[str, ToolResult]) -> None:
            calls = [
                make_call(rng, f"b{number}-c{i}", "ws" if rng.random() < 0.7 else "raw")
                for i in range(rng.randint(1, 30))
            ]
            # Generous: every call alone, through every attempt and wait, plus reconnects.
            bound = 30 + len(calls) * policy.attempts * (call_timeout + policy.wait_max + 2 * time_scale)
            try:
                with anyio.fail_after(bound):
                    results = await d.dispatch(calls)
            except TimeoutError:
                FIGURES.hangs += 1
                report.violations.append(f"batch {number} did not finish within {bound:.1f}s")
                return
            report.violations += harness.check_results(calls, results)
            for result in results:
                results_out[result.call_id] = result
                report.trace.append(
                    f"result {result.call_id} {result.status.value} attempts={result.attempts} error={result.error!r}"
                )
            report.batches += 1
            report.calls += len(calls)
            calls_sent.extend(calls)

        calls_sent: list[ToolCall] = []
        results: dict[str, ToolResult] = {}
        async with anyio.create_task_group() as chaos:
            if cut_every is not None:
                chaos.start_soon(cutter)
            number = 0
            while number < batches:
                if rng.random() < 0.3 and number + 1 < batches:
                    # Two agents sharing the dispatcher: their batches interleave under the same rules.
                    async with anyio.create_task_group() as pair:
                        pair.start_soon(one_batch, number, results)
                        pair.start_soon(one_batch, number + 1, results)
                    number += 2
                else:
                    await one_batch(number, results)
                    number += 1
                report.violations += harness.check_idle(d)
            chaos.cancel_scope.cancel()

        # The server came back: with no more faults and cuts, the next batch runs clean once a
        # reconnect may be tried again (a reconnect cut short backs off before the next one).
        faults.rate = 0.0
        await anyio.sleep((reconnect or ReconnectPolicy()).wait_max)
        probe = [make_call(rng, f"probe-c{i}", "ws") for i in range(5)]
        with anyio.fail_after(60 * max(time_scale, 0.1) + 60):
            after, problems = await harness.dispatch_until_answered(d, probe, rounds=probe_rounds, trace=report.trace)
        report.violations += problems
        bad = [r for r in after if r.status not in (CallStatus.OK, CallStatus.TOOL_ERROR)]
        report.violations += [f"after the faults stopped, {r.call_id} ended {r.status.value}: {r.error}" for r in bad]
        report.violations += harness.check_idle(d)

    # The ledgers: nothing ran more often than it may, and exclusive calls ran alone on the server.
    tool_of = {call.id: call.name for call in calls_sent}
    allowed = {
        call.id: harness.may_run(call, policy.attempts, retry_read_only=policy.retry_read_only) for call in calls_sent
    }
    report.violations += harness.count_executions(
        [call_key(execution.tool, execution.arguments) for execution in faults.ledger],
        calls_sent,
        allowed,
        tool_of=tool_of,
    )
    for call in calls_sent:
        result = results[call.id]
        if result.attempts > allowed[call.id]:
            report.violations.append(f"{call.id} made {result.attempts} attempts; at most {allowed[call.id]}")
            FIGURES.executed_twice += 1
    exclusive = {call.id for call in calls_sent if harness.must_run_alone(call)}
    report.violations += harness.check_exclusive_events(events, exclusive)
    report.violations += _check_workspace_overlaps(workspace, calls_sent, results, events)
    running = [execution for execution in workspace.ledger if execution.outcome == "running"]
    if running:
        report.violations.append(f"{len(running)} executions still running after the dispatcher closed")
        FIGURES.leaks += 1

    report.faults = sum(1 for execution in faults.ledger if execution.fault is not None)
    report.cuts = cuttable.cuts
    for execution in faults.ledger:
        if execution.fault is not None:
            FIGURES.fault(f"{execution.fault}-{execution.strike}")
    FIGURES.fault("connection-cut", cuttable.cuts)
    FIGURES.batches += report.batches
    FIGURES.calls += report.calls
    report.trace += [
        f"ledger {e.index} {e.tool} {e.arguments} fault={e.fault} strike={e.strike} ran={e.body_ran} {e.outcome}"
        for e in faults.ledger
    ]
    return report


def _check_workspace_overlaps(
    workspace: Workspace, calls: list[ToolCall], results: dict[str, ToolResult], events: list[CallEvent]
) -> list[str]:
    """An exclusive call's execution never overlapped another, unless the client had abandoned the other.

    An execution is abandoned when the client stopped waiting for it: its call timed out, was
    cancelled or failed, or was tried again (so this was not its last execution). The server may run
    such an execution on for a while, and the client cannot know when it stops. Such an overlap is
    allowed within its bound (RELIABILITY.md): when the run was observed, the dispatcher gave the other
    call up (an attempt retried, or its result) before it started the one that overlapped it.
    """
    gave_up: dict[str, int] = {}
    began: dict[str, int] = {}
    for index, event in enumerate(events):
        if event.kind in ("retried", "finished"):
            gave_up.setdefault(event.call.id, index)
        if event.kind in ("started", "retried"):
            began[event.call.id] = index
    never = len(events)
    by_key = {call_key(call.name, call.arguments): call for call in calls}
    ledger = workspace.ledger
    owner = {execution.seq: by_key.get(call_key(execution.tool, execution.arguments)) for execution in ledger}
    last = {call.id: seq for seq, call in owner.items() if call is not None}
    answered = (CallStatus.OK, CallStatus.TOOL_ERROR)
    problems = []
    for execution in ledger:
        call = owner[execution.seq]
        if call is None:
            continue
        for seq in sorted(execution.running_at_start):
            other = owner[seq]
            if other is None or not (harness.must_run_alone(call) or harness.must_run_alone(other)):
                continue
            if last[other.id] != seq or results[other.id].status not in answered:
                if not events or gave_up.get(other.id, never) <= began.get(call.id, never):
                    FIGURES.server_overlaps_after_abandoned_calls += 1
                    continue
                problems.append(f"{call.id} ({call.name}) started before the dispatcher gave {other.id} up")
                FIGURES.exclusive_overlaps += 1
                continue
            problems.append(f"{call.id} ({call.name}) started on the server while {other.id} ({other.name}) ran")
            FIGURES.exclusive_overlaps += 1
    return problems


def run_replayable(seed: int, *, batches: int = 3) -> Report:
    """Run a scenario in a fresh trio loop on a virtual clock, its scheduler seeded: the same seed, the same run."""
    # trio runs the tasks that became runnable together in a random order. In deterministic mode
    # (which hypothesis turns on when it is imported, as under pytest) it sorts them by creation and
    # shuffles them with this generator: seeding it makes the interleavings, and so the trace, repeat.
    run = trio._core._run
    deterministic = run._ALLOW_DETERMINISTIC_SCHEDULING
    run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    run._r.seed(seed)

    async def main() -> Report:
        return await run_scenario(seed, batches=batches)

    try:
        clock = MockClock(autojump_threshold=0)
        report: Report = anyio.run(main, backend="trio", backend_options={"clock": clock})
    finally:
        run._ALLOW_DETERMINISTIC_SCHEDULING = deterministic  # type: ignore[misc]
    return report


def describe(report: Report, test: str) -> str:
    """A failure message: the violations and how to replay the seed."""
    shown = "\n  ".join(report.violations[:20])
    more = f"\n  ... and {len(report.violations) - 20} more" if len(report.violations) > 20 else ""
    return f"{len(report.violations)} violations:\n  {shown}{more}\n{harness.replay_hint(test, report.seed)}"
