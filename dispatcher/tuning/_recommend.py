"""The recommendation: the knee, where more calls in flight stop buying throughput and start costing latency.

A pure function of the measurements (`recommend`), with the sentence that explains the choice, and the
number formats that sentence and the tables share.

The rule reads throughput and latency together, through Kleinrock's "power": throughput divided by the
median run time. Below a server's knee, a larger setting raises throughput at the same run time, so power
grows; past it, throughput stays flat while each call waits longer inside the server, so power falls. The
recommended setting is the smallest whose power is within `tolerance` of the highest, or within the
spread of its repeats: one of its repeats reached that (`SettingResult.power_range`). A knee above a
smaller setting is believed only when it stands out of that smaller setting's spread. Two cases read
differently:

- throughput flat across the range (the smallest setting already gets within 10% of the best, or one
  of its repeats reached the best's median) while run time grows: no setting matters here; the smallest
  is kept, and no wider range is suggested;
- power still growing at the largest setting, throughput too, by more than the noise of the measurements
  (the range of the repeats, and at least the 1/sqrt(n) of counting n calls, `_bounds`): the knee lies
  beyond the range, so try a wider one. A gain inside that noise (one measurement of a few calls) asks for
  more calls or repeats instead: it is no evidence of a knee beyond.

Choosing from power rather than from throughput alone is what keeps the advice stable: throughput keeps
creeping up past the knee (each round trip leaves a slot idle, and calls beyond the knee hide it), so
"the smallest setting within 5% of the best throughput" lands one or two settings above the knee on one
run and on it the next; run time doubles with every setting past the knee, which no noise hides.

The medians alone were not enough on a loaded machine: against mcp-server-git (load 6 to 12 on two cores,
repeats scattering by +-30%), one run's median power at 2 came out low (one slow round), 4 took the peak,
and three runs recommended 2, 1 and 4. The repeats at 1 had reached 4's power all along; reading the
spread, the same measurements give 2, 1 and 1.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Literal, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ._measure import SettingResult

__all__ = ["TOLERANCE", "CutShort", "cut_short_note", "drift_note", "format_ms", "format_number", "power", "recommend"]

CutShort: TypeAlias = Literal["interrupted", "max_time", "server_lost"]
"""Why a sweep ended early: Ctrl-C (`stop`), the time budget, or the server that stopped answering."""

TOLERANCE = 0.05
"""A setting is good enough when its power (throughput / run time) is within this share of the best."""

# Throughput within this share of the best (or within the measurements' spread) counts as flat.
_FLAT = 0.1


def power(setting: SettingResult) -> float:
    """Throughput divided by the median run time: highest at the knee (0 without a run time)."""
    if not setting.run_p50 > 0 or math.isinf(setting.throughput):
        return 0.0
    return setting.throughput / setting.run_p50


# A setting whose share of failed calls exceeds the smallest share of any setting by more than this fails
# because of the concurrency (a server answering 429 or -32000 above some number of calls in flight).
_OVERLOAD = 0.05


def _failed_share(setting: SettingResult) -> float:
    ended = setting.calls + setting.errors
    return setting.errors / ended if ended else 0.0


def recommend(
    settings: Sequence[SettingResult], *, tolerance: float = TOLERANCE, planned_top: int | None = None
) -> tuple[int | None, int | None, str]:
    """The knee of the measurements, the setting with the best throughput, and why (see `_recommend`).

    Settings where more calls failed than at the one with the fewest failures (by more than 5% of the calls)
    are left out: the server rejects calls there (429, -32000 above some concurrency), and the calls that
    it still answers, answered as fast as ever, would otherwise make such a setting look best.
    """
    ended = [s for s in settings if s.calls + s.errors > 0]
    least = min((_failed_share(s) for s in ended), default=0.0)
    rejected = [s for s in ended if _failed_share(s) > least + _OVERLOAD]
    if not rejected:
        return _recommend(settings, tolerance=tolerance, planned_top=planned_top)
    kept = [s for s in settings if s not in rejected]
    fails_above = max(s.limit for s in rejected) > max((s.limit for s in kept if s.calls > 0), default=0)
    recommended, best, explanation = _recommend(
        kept, tolerance=tolerance, planned_top=None if fails_above else planned_top, fails_above=fails_above
    )
    shares = ", ".join(f"{_failed_share(s):.0%} at {s.limit}" for s in sorted(rejected, key=lambda s: s.limit))
    return (
        recommended,
        best,
        f"{explanation} Left out: the settings where more calls failed ({shares}, against {least:.0%} at the "
        "setting with the fewest), as calls do when a server rejects those above some concurrency.",
    )


def _recommend(
    settings: Sequence[SettingResult],
    *,
    tolerance: float = TOLERANCE,
    planned_top: int | None = None,
    fails_above: bool = False,
) -> tuple[int | None, int | None, str]:
    """The knee of the measurements, the setting with the best throughput, and why.

    Throughput counts successful calls only, so a setting whose calls all failed is never chosen.

    Args:
        settings: The measurements, one per setting (any order).
        tolerance: The share of the highest power (throughput / median run time) a setting may give up.
        planned_top: The largest setting the sweep meant to measure; when it is larger than the largest
            measured (a sweep cut short), the explanation says so instead of asking for a wider range.

    Returns:
        The recommended setting, the best one (highest throughput), and a sentence or two that explain
        the choice. Both settings are None when no setting got a single successful answer.
    """
    ordered = sorted(settings, key=lambda s: s.limit)
    measured = [s for s in ordered if s.calls > 0 and s.throughput > 0]
    if not measured:
        running = [s for s in ordered if s.cut_off]
        if running and not any(s.errors for s in ordered) and all(s.cut_off_failed >= s.cut_off for s in running):
            # Not slower than the window: the calls it cut off never succeeded after it either.
            return (
                None,
                None,
                f"no call finished inside the measurement window, and none of the {sum(s.cut_off for s in running)} "
                "calls still running when it closed succeeded afterwards (they timed out, at --call-timeout, or "
                "failed): the server does not answer these calls, so there is nothing to recommend, and a larger "
                "--duration would not help",
            )
        if running and not any(s.errors for s in ordered):
            # Calls slower than the window: every one was still running when it closed.
            slowest = max((s.run_p95 for s in running if not math.isnan(s.run_p95)), default=math.nan)
            took = f" (they ran for {format_ms(slowest)} and more)" if not math.isnan(slowest) else ""
            longer = f" of at least {math.ceil(3 * slowest)} s" if not math.isnan(slowest) else ""
            return (
                None,
                None,
                f"no call finished inside the measurement window: the calls take longer than the window{took}, "
                f"so there is nothing to recommend yet; give a larger --duration{longer} (or none, to measure a "
                "count of calls)",
            )
        return (
            None,
            None,
            "no setting got a successful answer from the server, so there is nothing to recommend; see the errors",
        )
    best = max(measured, key=lambda s: s.throughput)
    top, low = measured[-1], measured[0]
    if len(measured) == 1:
        # One setting compares with nothing: it is the one known to work, not a knee.
        head = f"only {top.limit} was measured ({_rate(top)}), so there is no knee to find"
        if planned_top is not None and planned_top > top.limit:
            return top.limit, top.limit, f"{head}: the sweep stopped before the other settings; give it more time."
        if fails_above:
            return top.limit, top.limit, f"{head}: at the larger settings calls fail."
        return top.limit, top.limit, f"{head}: measure more than one setting to compare them."
    summit = max(measured, key=power)
    peak = power(summit)
    chosen = next((s for s in measured if _reaches(s, (1 - tolerance) * peak)), low) if peak > 0 else low
    if len(measured) > 1 and _flat(low, best):
        latency = (
            f"while each call's p95 run time grows from {format_ms(low.run_p95)} to {format_ms(top.run_p95)}"
            if top.run_p95 > 1.1 * low.run_p95
            else f"and each call's p95 run time stays near {format_ms(low.run_p95)}"
        )
        return (
            low.limit,
            best.limit,
            f"no setting matters here: throughput stays at {_between(measured)} calls/s from {low.limit} to "
            f"{top.limit} (within the spread of "
            f"the measurements) {latency}; the server (or this machine) does not run more calls at once any "
            f"faster. {low.limit}, the smallest setting, keeps calls fastest.",
        )
    if chosen is top and len(measured) > 1:
        before = measured[-2]
        gain = top.throughput / before.throughput - 1 if before.throughput > 0 else math.inf
        head = f"{top.limit} gives the best throughput ({_rate(top)}), {_percent(gain)} more than {before.limit}"
        if planned_top is not None and planned_top > top.limit:
            return top.limit, best.limit, f"{head}; the sweep stopped before the larger settings were measured."
        if fails_above:
            return top.limit, best.limit, f"{head}; it is the largest setting at which calls do not fail."
        if gain > _FLAT and _bounds(top)[0] > _bounds(before)[1]:
            return (
                top.limit,
                best.limit,
                f"{head}; it is the largest setting tried and throughput was still growing, so try a wider range.",
            )
        if gain > _FLAT:
            # A gain inside the noise is no evidence the knee lies beyond the range: say how to tell instead.
            return (
                top.limit,
                best.limit,
                f"{head}; it is the largest setting tried, but that gain is within the noise of these measurements "
                f"({_sample(before, top)}), so it is no evidence that the knee lies beyond {top.limit}: measure "
                "again with more --calls or --repeats to tell.",
            )
        return top.limit, best.limit, f"{head}; it is the largest setting tried."
    if chosen.throughput < (1 - tolerance) * best.throughput:
        # The knee is well below the best throughput: say what the rest would cost, and let the user choose.
        speed = best.run_p50 / chosen.run_p50 if chosen.run_p50 > 0 else math.inf
        most = (
            "the most throughput per unit of run time"
            if chosen is summit
            else f"as much throughput per unit of run time as {summit.limit}, within the spread of its repeats"
        )
        return (
            chosen.limit,
            best.limit,
            f"{chosen.limit} is the knee: {most} ({_rate(chosen)} at a median "
            f"run time of {format_ms(chosen.run_p50)}); {best.limit} gives "
            f"{_percent(best.throughput / chosen.throughput - 1)} more ({_rate(best)}) with each call taking "
            f"{speed:.1f}x as long ({format_ms(best.run_p50)}): set it instead if throughput matters more to you "
            "than each call's latency.",
        )
    if chosen is best:
        head = f"{chosen.limit} gives the best throughput ({_rate(best)})"
    else:
        share = chosen.throughput / best.throughput
        # 99.7% printed as "100% of the best" would read as a contradiction.
        amount = "the best throughput to within 1%" if share >= 0.995 else f"{share:.0%} of the best throughput"
        head = f"{chosen.limit} gives {amount} ({_rate(best)} at {best.limit})"
    if chosen is top:
        return chosen.limit, best.limit, head + "."
    gain = best.throughput / chosen.throughput - 1
    same = chosen.throughput >= 0.995 * best.throughput
    # A sweep cut short speaks only of the settings it measured, and says the rest were not.
    stopped = planned_top is not None and planned_top > top.limit
    upto = f"up to {top.limit}{', measured only in part' if top.partial else ''}"
    if top.run_p95 > 1.1 * chosen.run_p95:
        more = "without more throughput" if same else f"for at most {_percent(gain)} more throughput"
        return (
            chosen.limit,
            best.limit,
            f"{head}; beyond it, each call's p95 run time grows from {format_ms(chosen.run_p95)} to "
            f"{format_ms(top.run_p95)} (at {top.limit}) {more}"
            + ("; the sweep stopped before the larger settings were measured." if stopped else "."),
        )
    more = "no more throughput" if same else f"at most {_percent(gain)} more throughput"
    if stopped:
        return (
            chosen.limit,
            best.limit,
            f"{head}; the settings above it ({upto}) give {more}, and the sweep stopped before the larger "
            "settings were measured.",
        )
    return chosen.limit, best.limit, f"{head}; larger settings give {more}."


def _reaches(setting: SettingResult, level: float) -> bool:
    """Whether a setting's power reaches `level`: its median, or one of its repeats (within its spread)."""
    if power(setting) >= level:
        return True
    return setting.power_range is not None and setting.power_range[1] >= level


def _bounds(setting: SettingResult) -> tuple[float, float]:
    """The throughputs a setting's measurements leave room for: its repeats' range, widened to counting noise.

    A window of n calls resolves throughput to about 1/sqrt(n) of it (calls end at random moments), so one
    measurement of 3 calls is no narrower than +-58% whatever its range says: with a single measurement the
    range is one point, and the noise is not zero but unknown. The count is a measurement's (the median of
    repeats is read as one).
    """
    low, high = setting.throughput_range or (setting.throughput, setting.throughput)
    per_measurement = setting.calls / max(1, setting.repeats)
    noise = setting.throughput / math.sqrt(per_measurement) if per_measurement >= 1 else math.inf
    return min(low, setting.throughput - noise), max(high, setting.throughput + noise)


def _sample(*settings: SettingResult) -> str:
    """How much the figures of these settings rest on: calls per measurement, and measurements."""
    fewest = min(setting.calls / max(1, setting.repeats) for setting in settings)
    repeats = min(setting.repeats for setting in settings)
    calls = f"{fewest:.0f} call{'s' if round(fewest) != 1 else ''} a measurement"
    return f"{calls}, {'one measurement' if repeats == 1 else f'{repeats} measurements'} a setting"


def _flat(low: SettingResult, best: SettingResult) -> bool:
    """Whether the smallest setting's throughput is as good as the best's, given the spread of both."""
    if best.throughput <= (1 + _FLAT) * low.throughput:
        return True
    # The difference is within the noise when one of the smallest setting's repeats reached the best's median.
    # Overlapping ranges alone are not enough: on a shared machine one repeat that ran while the machine was
    # idle stretches a range (mcp-server-time measured 77 to 249 calls/s at 1, and 325 at 16), and a curve
    # that grows fourfold would read as flat.
    if low.throughput_range is None:
        return False
    return low.throughput_range[1] >= best.throughput


def _between(measured: Sequence[SettingResult]) -> str:
    """The range of the settings' throughputs ("96.0 to 108"), the lowest first, wherever each was measured."""
    lowest = format_number(min(s.throughput for s in measured))
    highest = format_number(max(s.throughput for s in measured))
    return lowest if lowest == highest else f"{lowest} to {highest}"


def _rate(setting: SettingResult) -> str:
    return f"{format_number(setting.throughput)} calls/s"


def _percent(share: float) -> str:
    return "infinitely" if math.isinf(share) else f"{share:.0%}"


def format_ms(seconds: float) -> str:
    """Seconds as milliseconds, e.g. "50.0 ms"."""
    return f"{format_number(seconds * 1000)} ms"


def format_number(value: float) -> str:
    """A figure with three significant digits or so; "-" for NaN."""
    if math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# Run time at one setting that grew by more than this from the first round to the last, in every round, on
# most settings, says the server changed under the sweep.
_DRIFT = 1.5


def drift_note(rounds: Mapping[int, Sequence[SettingResult]], *, writes: bool) -> str | None:
    """A note when the same setting got slower round after round: the server's state changes under the sweep.

    A server that keeps state its calls add to (server-memory's knowledge graph, a file every write appends
    to and every read parses whole) answers the same call more slowly each time: repeats drift instead of
    scattering, the knee moves from run to run, and no sweep's advice can repeat. None when no drift shows.

    Args:
        rounds: Each setting's measurements, in the order they were made (one per round).
        writes: Whether the workload has writes (calls that may change the server's state).
    """
    grew = []
    for limit, runs in sorted(rounds.items()):
        times = [run.run_p50 for run in runs if not math.isnan(run.run_p50) and run.run_p50 > 0]
        if len(times) < 2:
            continue
        rising = all(later > earlier for earlier, later in itertools.pairwise(times))
        grew.append((limit, times[0], times[-1], rising and times[-1] > _DRIFT * times[0]))
    if len(grew) < 2 or sum(drifted for *_, drifted in grew) * 2 <= len(grew):
        return None
    limit, first, last, _ = next(g for g in grew if g[3])
    cause = (
        "its writes accumulate state (each one leaves something every later call has to read)"
        if writes
        else "its state grows or changes between calls (another client, or data that accumulates)"
    )
    return (
        f"the same setting got slower round after round (at {limit}, median run time {format_ms(first)} -> "
        f"{format_ms(last)}): the server changed under the sweep, likely because {cause}, so this advice may not "
        "repeat; measure against a fresh server (its store emptied) with read-only calls"
    )


def cut_short_note(
    why: CutShort,
    max_time: float | None,
    measured: dict[int, list[SettingResult]],
    repeats: int,
    *,
    lost: str = "",
) -> str:
    """What a sweep cut short holds, and why it stopped (`lost`: how the server stopped answering)."""
    if why == "server_lost":
        cause = f"cut short: the server stopped answering ({lost}), so the settings after it were not measured"
    else:
        cause = "interrupted" if why == "interrupted" else f"cut short by the time budget ({max_time or 0:g} s)"
    done = [limit for limit, runs in measured.items() if runs]
    missing = [limit for limit, runs in measured.items() if not runs]
    fewer = [limit for limit, runs in measured.items() if runs and len(runs) < repeats]
    parts = [f"{cause}: the table holds the {len(done)} of {len(measured)} settings measured so far"]
    if missing:
        parts.append(f"not measured: {missing}")
    if fewer:
        parts.append(f"measured fewer than {repeats} times: {fewer}")
    return "; ".join(parts)
