"""Closed-loop measurement of one setting of a concurrency limit.

A fixed number of callers each submit a call and wait for its result, then submit the next, so the
dispatcher always has more calls offered than it may run and the limit decides how many are in flight.
After a warm-up, the measurement window runs from the end of the warm-up to the completion of the last
measured call (or the end of a time budget):

- throughput: successful calls (OK) per second of the window, each call counted for the share of its
  run time inside the window (see `summarise`);
- run time (`ToolResult.finished_at - started_at`): a started call's time to its result, the server's
  time plus the round trip of the transport, p50 and p95;
- queue time (`started_at - queued_at`): how long calls waited in the dispatcher for a slot;
- calls in flight: the mean number of calls running during the window;
- errors: calls that ended inside the window without success (a tool error, a failure, a timeout).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher._calls import CallStatus, ToolCall

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from dispatcher._batch import Batch, PendingCall
    from dispatcher._calls import ToolResult
    from dispatcher._dispatcher import Dispatcher

__all__ = ["SettingResult", "Window", "closed_loop", "measure", "summarise"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingResult:
    """What one setting of the limit measured. Times are in seconds.

    Attributes:
        limit: The setting.
        calls: Successful calls (OK) that ended inside the window.
        errors: Calls ending inside the window that did not succeed: the tool reported an error, or the
            call failed, timed out or was cancelled.
        elapsed: The measurement window.
        throughput: Successful calls per second of the window, each counted for the share of its run
            time inside the window.
        run_p50: The median run time of the successful calls (`finished_at - started_at`).
        run_p95: Their 95th percentile run time.
        queue_p50: The median time they waited for a slot (`started_at - queued_at`).
        queue_p95: The 95th percentile of that wait.
        in_flight: The mean number of calls running during the window.
        error: The first error among the measured calls, if any.
    """

    limit: int
    calls: int
    errors: int
    elapsed: float
    throughput: float
    run_p50: float
    run_p95: float
    queue_p50: float
    queue_p95: float
    in_flight: float
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON data (times in milliseconds; NaN as null)."""
        ms = 1000.0
        return {
            "limit": self.limit,
            "calls": self.calls,
            "errors": self.errors,
            "elapsed_s": _finite(self.elapsed),
            "throughput": _finite(self.throughput),
            "run_p50_ms": _finite(self.run_p50 * ms),
            "run_p95_ms": _finite(self.run_p95 * ms),
            "queue_p50_ms": _finite(self.queue_p50 * ms),
            "queue_p95_ms": _finite(self.queue_p95 * ms),
            "in_flight": _finite(self.in_flight),
            "error": self.error,
        }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


async def measure(
    dispatcher: Dispatcher,
    workload: Sequence[ToolCall],
    *,
    limit: int,
    clients: int,
    warmup: int,
    calls: int | None,
    duration: float | None,
    report: Callable[[int, int | None], None] | None,
) -> SettingResult:
    """Run one setting's closed loop (`closed_loop`) and summarise its measurement window."""
    window = await closed_loop(
        dispatcher, workload, clients=clients, warmup=warmup, calls=calls, duration=duration, report=report
    )
    return summarise(limit, window.results, window.start, window.stop, inclusive=window.inclusive)


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """What a closed loop ran: every call's result and the measurement window (loop clock).

    Attributes:
        results: The calls completed, and those running when the measurement stopped.
        start: When the window opened (the end of the warm-up).
        stop: When it closed.
        inclusive: Whether a call ending exactly at `start` counts (there was no warm-up).
    """

    results: list[ToolResult]
    start: float
    stop: float
    inclusive: bool


async def closed_loop(
    dispatcher: Dispatcher,
    workload: Sequence[ToolCall],
    *,
    clients: int,
    warmup: int,
    calls: int | None,
    duration: float | None,
    report: Callable[[int, int | None], None] | None,
) -> Window:
    """Run one setting's closed loop: callers each submit a call and wait for it, until the window closes.

    Each call is a batch of its own, so that when the measurement ends the calls still queued can be
    withdrawn without touching those already running at the server. Those are left to finish: they
    ran during the window, and count for the part of their run time that fell inside it.

    Args:
        dispatcher: An open dispatcher with the server registered under the setting being measured.
        workload: The calls to repeat, in order.
        clients: The callers keeping calls offered.
        warmup: Calls completed before the window opens.
        calls: Calls completed inside the window before it closes, or None.
        duration: Seconds the window may last, or None.
        report: Called with (completed, planned) after every completed call.
    """
    source = _repeat(workload)
    finished: list[ToolResult] = []  # completed before the measurement stopped
    tail: list[ToolResult] = []  # running when it stopped
    waiting: dict[PendingCall, Batch] = {}
    planned = None if calls is None else warmup + calls
    started = anyio.current_time()
    window_end = started + duration if warmup == 0 and duration is not None else math.inf
    stop = False

    async def caller() -> None:
        nonlocal stop, window_end
        while not stop:
            batch = dispatcher.batch()
            pending = batch.submit(next(source))
            waiting[pending] = batch
            result = await pending.wait()
            del waiting[pending]
            if stop:
                if result.started_at is not None:
                    tail.append(result)
                return
            finished.append(result)
            done = len(finished)
            if done == warmup and duration is not None:
                window_end = result.finished_at + duration
            if (planned is not None and done >= planned) or result.finished_at >= window_end:
                stop = True
                for queued, its_batch in list(waiting.items()):
                    if queued.started_at is None:
                        its_batch.cancel()
            if report is not None:
                report(done, planned)

    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(caller)
    finished.sort(key=lambda r: r.finished_at)
    window_start = finished[warmup - 1].finished_at if warmup else started
    window_stop = min(finished[-1].finished_at, window_end)
    return Window(results=[*finished, *tail], start=window_start, stop=window_stop, inclusive=not warmup)


def _repeat(workload: Sequence[ToolCall]) -> Iterator[ToolCall]:
    """The workload's calls over and over, each with an id of its own."""
    for number, call in enumerate(itertools.cycle(workload)):
        yield ToolCall(str(number), call.name, call.arguments)


def summarise(
    limit: int, results: Sequence[ToolResult], start: float, stop: float, *, inclusive: bool
) -> SettingResult:
    """The figures of the window from `start` to `stop`.

    Throughput counts each successful call for the share of its run time inside the window, so calls
    that straddle an edge count in part. That keeps the estimate exact whatever the phase of the
    window: completions often come in bursts (calls that started together end together), and a
    count of whole calls between two completions would include part of a burst at one end only.
    The latencies are those of the successful calls that ended inside the window.
    """

    def ended_inside(r: ToolResult) -> bool:
        return (start <= r.finished_at if inclusive else start < r.finished_at) and r.finished_at <= stop

    measured = [r for r in results if ended_inside(r)]
    succeeded = [r for r in measured if r.status is CallStatus.OK]
    failed = [r for r in measured if r.status is not CallStatus.OK]
    elapsed = stop - start
    done = 0.0  # successful calls, in shares of a call
    busy = 0.0  # seconds of calls running, summed over the calls
    for r in results:
        if r.status is not CallStatus.OK or r.started_at is None:
            continue
        inside = min(r.finished_at, stop) - max(r.started_at, start)
        if r.run_time > 0:
            done += max(0.0, inside) / r.run_time
            busy += max(0.0, inside)
        elif ended_inside(r):
            done += 1
    if elapsed > 0:
        throughput, in_flight = done / elapsed, busy / elapsed
    else:
        throughput, in_flight = (math.inf if succeeded else 0.0), math.nan
    runs = [r.run_time for r in succeeded]
    queues = [r.queue_time for r in succeeded]
    return SettingResult(
        limit=limit,
        calls=len(succeeded),
        errors=len(failed),
        elapsed=elapsed,
        throughput=throughput,
        run_p50=_percentile(runs, 50),
        run_p95=_percentile(runs, 95),
        queue_p50=_percentile(queues, 50),
        queue_p95=_percentile(queues, 95),
        in_flight=in_flight,
        error=f"{failed[0].status.value}: {failed[0].error}" if failed else None,
    )


def _percentile(values: Sequence[float], percent: int) -> float:
    """The percentile, interpolated linearly between the closest ranks; NaN without values."""
    if len(values) < 2:
        return values[0] if values else math.nan
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]
