"""Closed-loop measurement of one setting of a concurrency limit.

A fixed number of callers each submit a call and wait for its result, then submit the next, so the
dispatcher always has more calls offered than it may run and the limit decides how many are in flight.
After a warm-up, the measurement window runs from the end of the warm-up to the completion of the last
measured call, or the end of a time budget (closed by a timer, even when no call completes):

- throughput: successful calls (OK) per second of the window, each call counted for the share of its
  run time inside the window (see `summarise`);
- run time (`ToolResult.finished_at - started_at`): a started call's time to its result, the server's
  time plus the round trip of the transport, p50 and p95, over the successful calls that ended inside
  the window and those still running when it closed (the cut-off calls, left to finish);
- queue time (`started_at - queued_at`): how long calls waited in the dispatcher for a slot;
- calls in flight: the mean number of calls running during the window, whatever their outcome;
- errors: calls that ended inside the window without success (a tool error, a failure, a timeout).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher._core._calls import CallStatus, ToolCall

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from dispatcher._core._calls import ToolResult
    from dispatcher._dispatcher import Dispatcher
    from dispatcher._driver._batch import Batch, PendingCall

__all__ = ["SettingResult", "Window", "closed_loop", "combine", "summarise"]


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
        in_flight: The mean number of calls running during the window, those that failed included.
        error: The first error among the measured calls, if any.
        error_tool: The tool of the call that gave `error`.
        cut_off: Calls still running when the window closed. They were left to finish, and their run
            and queue times are in the latency figures (leaving them out would drop the slowest calls).
        repeats: The measurements this result combines (see `combine`): its figures are their medians,
            its counts their sums.
        throughput_range: The lowest and highest throughput of those measurements.
        run_p95_range: The lowest and highest p95 run time of those measurements.
        power_range: The lowest and highest of those measurements' power (throughput / median run time,
            each measurement's own), or None for a single measurement: the spread the recommendation
            reads (see `dispatcher.tuning._recommend`).
        cut_off_failed: Those of the `cut_off` calls that then did not succeed (they timed out or failed
            after the window closed).
        partial: The measurement was cut off by the sweep's time budget, or by its stop event (Ctrl-C),
            before its window would have closed: its figures cover the part of the window that ran (and the
            calls running then count as cut off, timed up to that moment).
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
    cut_off: int = 0
    repeats: int = 1
    throughput_range: tuple[float, float] | None = None
    run_p95_range: tuple[float, float] | None = None
    partial: bool = False
    error_tool: str | None = None
    power_range: tuple[float, float] | None = None
    cut_off_failed: int = 0

    @property
    def spread(self) -> float:
        """Half the range of the throughputs measured, as a share of the median (0 for one measurement)."""
        if self.throughput_range is None or not self.throughput > 0 or math.isinf(self.throughput):
            return 0.0
        low, high = self.throughput_range
        return (high - low) / 2 / self.throughput

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
            "cut_off": self.cut_off,
            "cut_off_failed": self.cut_off_failed,
            "repeats": self.repeats,
            "throughput_range": None if self.throughput_range is None else [_finite(v) for v in self.throughput_range],
            "run_p95_range_ms": None if self.run_p95_range is None else [_finite(v * ms) for v in self.run_p95_range],
            "partial": self.partial,
            # Calls/s per second of median run time, as the recommendation reads it.
            "power_range": None if self.power_range is None else [_finite(v) for v in self.power_range],
        }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """What a closed loop ran: every call's result and the measurement window (loop clock).

    Attributes:
        results: The calls completed, and those running when the measurement stopped.
        start: When the window opened (the end of the warm-up).
        stop: When it closed.
        inclusive: Whether a call ending exactly at `start` counts (there was no warm-up).
        abandoned: (queued_at, started_at) of the calls still running when the deadline (or the stop
            event) closed the window: they were cancelled rather than left to finish, so their run time is
            known only to be at least `stop - started_at`.
        partial: The deadline or the stop event closed the window (or ended the warm-up) before it would
            have closed.
        warmup: How many of the first `results` (in the order they ended) were the warm-up, when a count of
            calls opened the window (0 otherwise): the calls after them are measured even when they end at
            the very moment the window opened, as calls rejected at once all do on a virtual clock.
    """

    results: list[ToolResult]
    start: float
    stop: float
    inclusive: bool
    abandoned: tuple[tuple[float, float], ...] = ()
    partial: bool = False
    warmup: int = 0

    def summarise(self, limit: int) -> SettingResult:
        """The figures of the window, measured under the setting `limit` (see `summarise`)."""
        return summarise(
            limit,
            self.results,
            self.start,
            self.stop,
            inclusive=self.inclusive,
            abandoned=self.abandoned,
            partial=self.partial,
            warmup=self.warmup,
        )


async def closed_loop(
    dispatcher: Dispatcher,
    workload: Sequence[ToolCall],
    *,
    clients: int,
    warmup: int,
    calls: int | None,
    duration: float | None,
    report: Callable[[int, int | None], None] | None,
    phase: Callable[[str], None] | None = None,
    deadline: float = math.inf,
    stop: anyio.Event | None = None,
) -> Window:
    """Run one setting's closed loop: callers each submit a call and wait for it, until the window closes.

    Each call is a batch of its own, so that when the measurement ends the calls still queued can be
    withdrawn without touching those already running at the server. Those are left to finish (a write
    is never aborted midway): they ran during the window, count for the part of their run time that
    fell inside it, and are the window's "cut off" calls.

    With a `duration`, a timer closes the window on time even when no call completes (calls slower
    than the window), and the warm-up also ends after `duration` seconds at most.

    Args:
        dispatcher: An open dispatcher with the server registered under the setting being measured.
        workload: The calls to repeat, in order.
        clients: The callers keeping calls offered.
        warmup: Calls completed before the window opens.
        calls: Calls completed inside the window before it closes, or None.
        duration: Seconds the window may last, or None.
        report: Called with (completed, planned) after every completed call (planned: warm-up included).
        phase: Called with "warming up" and "measuring" as the loop enters each.
        deadline: When the sweep's time budget runs out (loop clock). At that moment the window closes
            (the measurement is `partial`) and the calls still running are cancelled instead of left to
            finish: a budget includes the setting in progress.
        stop: An event that, once set (Ctrl-C on the command line), ends the measurement as `deadline` does at
            that moment: the window closes there and is kept, `partial`, with the calls that ended inside it
            counted and those running counted as cut off, rather than the whole measurement being lost.
    """
    source = _repeat(workload)
    finished: list[ToolResult] = []  # completed before the measurement stopped
    tail: list[ToolResult] = []  # running when it stopped: the cut-off calls
    waiting: dict[PendingCall, Batch] = {}
    planned = None if calls is None else warmup + calls
    started = anyio.current_time()
    window_start: float | None = None
    window_stop = math.inf
    closed = False
    before = 0  # calls completed before the window opened
    opened_by_count = closed_by_count = False
    abandoned: list[tuple[float, float]] = []
    partial = False

    def open_window(at: float) -> None:
        nonlocal window_start, before
        window_start, before = at, len(finished)
        if phase is not None:
            phase("measuring")

    def close_window(at: float) -> None:
        nonlocal closed, window_stop
        closed, window_stop = True, at
        for queued, its_batch in list(waiting.items()):
            if queued.started_at is None:
                its_batch.cancel()

    async def caller() -> None:
        nonlocal opened_by_count, closed_by_count
        while not closed:
            batch = dispatcher.batch()
            pending = batch.submit(next(source))
            waiting[pending] = batch
            result = await pending.wait()
            if waiting.pop(pending, None) is None:
                return  # the budget closed the window and counted this call, done before its caller woke
            if closed:
                if result.started_at is not None and result.finished_at > window_stop:
                    tail.append(result)
                elif result.started_at is not None:
                    finished.append(result)
                return
            finished.append(result)
            done = len(finished)
            if window_start is None and done >= warmup:
                opened_by_count = True
                open_window(result.finished_at)
            if calls is not None and window_start is not None and done - before >= calls:
                closed_by_count = True
                close_window(result.finished_at)
            if report is not None:
                report(done, planned)

    async def timer() -> None:
        assert duration is not None
        if window_start is None:
            await anyio.sleep_until(started + duration)
            if window_start is None:
                open_window(anyio.current_time())
        assert window_start is not None
        await anyio.sleep_until(window_start + duration)
        if not closed:
            close_window(window_start + duration)

    async def budget(callers: anyio.CancelScope) -> None:
        nonlocal partial
        if stop is None:
            await anyio.sleep_until(deadline)
        else:
            with anyio.CancelScope(deadline=deadline):
                await stop.wait()
        if not closed:  # the window was still open (or the warm-up running): the measurement is partial
            partial = True
            now = anyio.current_time()
            if window_start is None:
                open_window(now)
            close_window(now)
        for queued in list(waiting):
            if queued.done:  # it ended before its caller woke: a completed call, not a cut-off one
                del waiting[queued]
                result = queued.result()
                if result.started_at is not None:
                    (tail if result.finished_at > window_stop else finished).append(result)
            elif queued.started_at is not None:
                abandoned.append((queued.queued_at, queued.started_at))
        callers.cancel()

    if phase is not None and warmup:
        phase("warming up")
    if not warmup:
        open_window(started)
    async with anyio.create_task_group() as outer:
        if duration is not None:
            outer.start_soon(timer)
        async with anyio.create_task_group() as tg:
            if math.isfinite(deadline) or stop is not None:
                outer.start_soon(budget, tg.cancel_scope)
            for _ in range(clients):
                tg.start_soon(caller)
        outer.cancel_scope.cancel()
    finished.sort(key=lambda r: r.finished_at)
    assert window_start is not None
    # Results are handled in the order the callers wake, which need not be the order the calls ended
    # in: a window opened or closed by a count of calls is placed by the calls' own times.
    if warmup and opened_by_count:
        window_start = finished[warmup - 1].finished_at
    if closed_by_count and not partial:
        window_stop = finished[-1].finished_at
    return Window(
        results=[*finished, *tail],
        start=window_start,
        stop=window_stop,
        inclusive=not warmup,
        abandoned=tuple(abandoned),
        partial=partial,
        warmup=warmup if warmup and opened_by_count else 0,
    )


def _repeat(workload: Sequence[ToolCall]) -> Iterator[ToolCall]:
    """The workload's calls over and over, each with an id of its own."""
    for number, call in enumerate(itertools.cycle(workload)):
        yield ToolCall(str(number), call.name, call.arguments)


def summarise(
    limit: int,
    results: Sequence[ToolResult],
    start: float,
    stop: float,
    *,
    inclusive: bool,
    abandoned: Sequence[tuple[float, float]] = (),
    partial: bool = False,
    warmup: int = 0,
) -> SettingResult:
    """The figures of the window from `start` to `stop`.

    Throughput counts each successful call for the share of its run time inside the window, so calls
    that straddle an edge count in part. That keeps the estimate exact whatever the phase of the
    window: completions often come in bursts (calls that started together end together), and a
    count of whole calls between two completions would include part of a burst at one end only.
    The latencies are those of the successful calls that ended inside the window and of the cut-off
    ones; `abandoned` calls (cancelled at a deadline, as (queued_at, started_at)) count as cut off, with
    the run time they had reached by `stop` (a lower bound) and no share of throughput (their outcome is
    unknown). The first `warmup` results (`Window.warmup`) are the warm-up whatever their time: the
    others count from the window's start on, including those that ended at that very moment.
    """
    warm = {id(r) for r in results[:warmup]}

    def ended_inside(r: ToolResult) -> bool:
        if id(r) in warm:
            return False
        after = start <= r.finished_at if inclusive or warmup else start < r.finished_at
        return after and r.finished_at <= stop

    measured = [r for r in results if ended_inside(r)]
    cut_off = [r for r in results if r.started_at is not None and r.started_at < stop < r.finished_at]
    succeeded = [r for r in measured if r.status is CallStatus.OK]
    failed = [r for r in measured if r.status is not CallStatus.OK]
    elapsed = stop - start
    done = 0.0  # successful calls, in shares of a call
    busy = 0.0  # seconds of calls running, summed over the calls: failed ones held a slot too
    for r in results:
        if r.started_at is None:
            continue
        inside = max(0.0, min(r.finished_at, stop) - max(r.started_at, start))
        busy += inside
        if r.status is not CallStatus.OK:
            continue
        if r.run_time > 0:
            done += inside / r.run_time
        elif ended_inside(r):
            done += 1
    for _, began in abandoned:
        busy += max(0.0, stop - max(began, start))
    if elapsed > 0:
        throughput, in_flight = done / elapsed, busy / elapsed
    else:
        throughput, in_flight = (math.inf if succeeded else 0.0), math.nan
    timed = succeeded + [r for r in cut_off if r.status is CallStatus.OK]
    runs = [r.run_time for r in timed] + [stop - began for _, began in abandoned]
    queues = [r.queue_time for r in timed] + [began - queued for queued, began in abandoned]
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
        cut_off=len(cut_off) + len(abandoned),
        cut_off_failed=sum(r.status is not CallStatus.OK for r in cut_off),
        throughput_range=(throughput, throughput),
        run_p95_range=(_percentile(runs, 95),) * 2,
        partial=partial,
        error_tool=failed[0].call.name if failed else None,
    )


def combine(measurements: Sequence[SettingResult]) -> SettingResult:
    """One result for a setting measured several times: the medians of the figures, the sums of the counts.

    The median rather than the mean: one repeat disturbed by something else on the machine moves it
    least. The ranges keep the lowest and highest of the repeats, for the spread shown beside them.

    Raises:
        ValueError: No measurements, or measurements of different settings.
    """
    if not measurements:
        raise ValueError("combine needs at least one measurement")
    limits = {m.limit for m in measurements}
    if len(limits) != 1:
        raise ValueError(f"combine takes measurements of one setting, got {sorted(limits)}")
    if len(measurements) == 1:
        return measurements[0]

    def median(values: Iterable[float]) -> float:
        known = [v for v in values if not math.isnan(v)]
        return statistics.median(known) if known else math.nan

    throughputs = [m.throughput for m in measurements]
    p95s = [m.run_p95 for m in measurements if not math.isnan(m.run_p95)]
    # Each repeat's own power: its throughput and run time moved together (the machine was busy or idle).
    powers = [m.throughput / m.run_p50 for m in measurements if m.run_p50 > 0 and math.isfinite(m.throughput)]
    first = next((m for m in measurements if m.error is not None), None)
    errors = None if first is None else first.error
    return SettingResult(
        limit=measurements[0].limit,
        calls=sum(m.calls for m in measurements),
        errors=sum(m.errors for m in measurements),
        elapsed=sum(m.elapsed for m in measurements),
        throughput=median(throughputs),
        run_p50=median(m.run_p50 for m in measurements),
        run_p95=median(m.run_p95 for m in measurements),
        queue_p50=median(m.queue_p50 for m in measurements),
        queue_p95=median(m.queue_p95 for m in measurements),
        in_flight=median(m.in_flight for m in measurements),
        error=errors,
        cut_off=sum(m.cut_off for m in measurements),
        cut_off_failed=sum(m.cut_off_failed for m in measurements),
        repeats=sum(m.repeats for m in measurements),
        throughput_range=(min(throughputs), max(throughputs)),
        run_p95_range=(min(p95s), max(p95s)) if p95s else None,
        partial=any(m.partial for m in measurements),
        error_tool=None if first is None else first.error_tool,
        power_range=(min(powers), max(powers)) if powers else None,
    )


def _percentile(values: Sequence[float], percent: int) -> float:
    """The percentile, interpolated linearly between the closest ranks; NaN without values."""
    if len(values) < 2:
        return values[0] if values else math.nan
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]
