"""What a sweep hands back: the report, and the reading of its measurements into a recommendation and notes.

`tune` (`_sweep`) runs the settings and collects each round's measurement; `conclude` turns them into what
the report says: one result per setting (the medians of its repeats, `_measure.combine`), the recommended
setting with its sentence (`_recommend`), and the notes on errors, drift and a sweep cut short. Which
settings the rule may choose from is decided here: none when no limit can matter (every call runs alone),
and not the setting during which the server stopped answering (its failed calls are the lost connection's,
not the setting's), so that a sweep left with one setting says it has nothing to compare rather than
recommend it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._measure import combine
from ._recommend import CutShort, cut_short_note, drift_note, format_number, recommend

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ._measure import SettingResult
    from ._online import OnlineResult

__all__ = ["Conclusion", "TuneProgress", "TuneReport", "conclude", "failed_entirely", "failed_note"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneReport:
    """A sweep's measurements and the setting it recommends.

    Attributes:
        target: What was tuned against, for people.
        trusted: Whether the server's annotations were trusted.
        knob: "max_concurrency" (the dispatcher-wide limit), "per_server" (`add_mcp_server`'s) or
            "fleet" (`FleetServer.limit`, shared by `processes` processes through Redis).
        workload: A description of the workload.
        concurrent_share: The share of the workload's calls that may run concurrently.
        clients: Callers kept waiting on the dispatcher (the offered concurrency).
        calls: Measured calls per measurement (None: measured for `duration` instead).
        duration: The time budget of each setting's measurement, if any.
        settings: One result per setting, in increasing order.
        recommended: The recommended setting, or None when no setting got a successful answer or no
            limit can matter (no call of the workload may run concurrently).
        best: The setting with the highest throughput, or None likewise.
        explanation: Why the recommended setting (or why none), in a sentence or two.
        notes: Things the reader should know (an untrusted server, failed calls, a narrow range).
        processes: The processes of a fleet sweep, or None.
        repeats: The measurements planned per setting (the repeats done are each result's `repeats`).
        cut_short: Why the sweep ended before measuring everything it planned: "interrupted" (`stop`
            was set, e.g. on Ctrl-C), "max_time" (the time budget ran out) or "server_lost" (the server
            exited or closed the connection; the notes say how); None when it finished.
            The report then holds the settings measured so far.
        online: Where the online limit (`AdaptiveLimit`) settled on the same server and workload, when
            the sweep was asked for it (``online=``), else None.
    """

    target: str
    trusted: bool
    knob: Literal["max_concurrency", "per_server", "fleet"]
    workload: str
    concurrent_share: float
    clients: int
    calls: int | None
    duration: float | None
    settings: tuple[SettingResult, ...]
    recommended: int | None
    best: int | None
    explanation: str
    notes: tuple[str, ...] = ()
    processes: int | None = None
    repeats: int = 1
    cut_short: CutShort | None = None
    online: OnlineResult | None = None

    @property
    def how_to_apply(self) -> str:
        """The code that applies the recommendation."""
        if self.recommended is None:
            return "no recommendation"
        if self.knob == "per_server":
            return f"add_mcp_server(..., max_concurrency={self.recommended})"
        if self.knob == "fleet":
            return f"RedisCoordinator(..., servers={{...: FleetServer(limit={self.recommended})}})"
        return f"Dispatcher(max_concurrency={self.recommended})"

    @property
    def errors(self) -> int:
        """Measured calls that did not succeed, over every setting."""
        return sum(setting.errors for setting in self.settings)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data (what `--json` writes, without the machine description)."""
        return {
            "target": self.target,
            "trusted": self.trusted,
            "knob": self.knob,
            "processes": self.processes,
            "workload": self.workload,
            "concurrent_share": self.concurrent_share,
            "clients": self.clients,
            "calls": self.calls,
            "repeats": self.repeats,
            "cut_short": self.cut_short,
            "duration_s": self.duration,
            "settings": [setting.to_json() for setting in self.settings],
            "recommended": self.recommended,
            "best": self.best,
            "apply": self.how_to_apply,
            "explanation": self.explanation,
            "notes": list(self.notes),
            "online": None if self.online is None else self.online.to_json(),
        }


Phase = Literal["probing", "warming up", "measuring"]


@dataclass(frozen=True, slots=True)
class TuneProgress:
    """Where a sweep is: setting `index` of `total` (from 0), `completed` of its `planned` calls.

    `planned` is None when the setting runs for a time budget rather than a number of calls (and
    counts the warm-up). `repeat` (from 0) of `repeats` is the round: each round measures every setting
    once. `phase` is "probing" (the synthetic workload's tools are tried once, before any setting),
    "warming up" or "measuring".
    """

    limit: int
    index: int
    total: int
    completed: int
    planned: int | None
    repeat: int = 0
    repeats: int = 1
    phase: Phase = "measuring"


@dataclass(frozen=True, slots=True)
class Conclusion:
    """What the measurements say: one result per setting measured, the advice, and the notes it adds."""

    settings: tuple[SettingResult, ...]
    recommended: int | None
    best: int | None
    explanation: str
    notes: tuple[str, ...]


def conclude(
    measured: Mapping[int, Sequence[SettingResult]],
    *,
    share: float,
    tolerance: float,
    planned_top: int,
    synthetic: bool,
    repeats: int,
    cut_short: CutShort | None,
    max_time: float | None,
    lost: str = "",
    lost_during: int | None = None,
    gave_up: str | None = None,
) -> Conclusion:
    """Read a sweep's measurements: combine each setting's rounds, recommend one, and say what to know.

    Args:
        measured: Each setting's measurements, in the order they were made (one per round).
        share: The share of the workload's calls that may run concurrently (0: no limit can matter).
        tolerance: The recommendation's tolerance (`recommend`).
        planned_top: The largest setting the sweep meant to measure.
        synthetic: Whether the workload was generated (the error notes then say to write one).
        repeats: The measurements planned per setting.
        cut_short: Why the sweep ended early, or None.
        max_time: The sweep's time budget, for the note of a sweep it cut short.
        lost: How the server stopped answering, when it did.
        lost_during: The setting measured when the server stopped answering, whose calls then failed: it is
            in the table, and left out of the recommendation.
        gave_up: The sentence of a sweep that stopped on its own (the first settings failed every call).
    """
    results = [combine(runs) for _, runs in sorted(measured.items()) if runs]
    notes = _error_notes(results, synthetic=synthetic)
    if cut_short is not None:
        notes.append(cut_short_note(cut_short, max_time, {k: list(v) for k, v in measured.items()}, repeats, lost=lost))
    eligible = [s for s in results if s.limit != lost_during]
    recommended: int | None = None
    best: int | None = None
    if gave_up is not None:
        explanation = gave_up
    elif not results:
        explanation = "the sweep was cut short before any setting was measured, so there is nothing to recommend"
    elif share == 0:
        low = min(results, key=lambda s: s.throughput)
        high = max(results, key=lambda s: s.throughput)
        explanation = (
            "no limit can matter here, so there is nothing to recommend: every call of the workload runs alone "
            f"(the settings measured {format_number(low.throughput)} to {format_number(high.throughput)} calls/s, "
            "which is noise); see the notes"
        )
    elif cut_short == "server_lost" and _every_call_failed(results):
        # Not the lost connection's doing alone: no setting is left out for it, and none is blamed.
        explanation = _failed_then_lost(results, lost)
    elif cut_short == "server_lost" and len(eligible) < 2:
        explanation = _lost_before_two(eligible, lost_during)
    else:
        recommended, best, explanation = recommend(eligible, tolerance=tolerance, planned_top=planned_top)
        if lost_during is not None:
            explanation += (
                f" {lost_during} is left out: the server stopped answering while it was measured, so its failed "
                "calls are the lost connection's, not the setting's (see the notes)."
            )
        drift = drift_note(measured, writes=share < 1)
        if drift is not None:
            notes.append(drift)
            explanation += " It may not repeat: the server got slower during the sweep (see the notes)."
    return Conclusion(tuple(results), recommended, best, explanation, tuple(notes))


def _every_call_failed(results: Sequence[SettingResult]) -> bool:
    """Whether every setting measured got errors and not one call that succeeded, in its window or after."""
    return bool(results) and all(s.calls == 0 and s.errors > 0 and s.cut_off_failed >= s.cut_off for s in results)


def _failed_then_lost(results: Sequence[SettingResult], lost: str) -> str:
    """Why a sweep whose every call failed, and whose server then stopped answering, recommends nothing."""
    first = results[0]
    tool = f"{first.error_tool}: " if first.error_tool else ""
    where = " and ".join(str(s.limit) for s in results)
    return (
        f"every measured call failed, at {where} ({tool}{first.error}), so there is nothing to recommend; then "
        f"the server stopped answering ({lost}). No setting is to blame for the failures: fix the workload's "
        "calls (or the server) and run again"
    )


def _lost_before_two(eligible: Sequence[SettingResult], lost_during: int | None) -> str:
    """Why a sweep whose server stopped answering recommends nothing: fewer than two settings to compare."""
    during = f" while {lost_during} was measured" if lost_during is not None else ""
    if not eligible:
        return (
            f"the server stopped answering{during}, before any setting was measured whole, so there is nothing to "
            "recommend; see the notes, and run again once the server stays up"
        )
    [only] = eligible
    return (
        f"only {only.limit} was measured ({format_number(only.throughput)} calls/s) before the server stopped "
        f"answering{during}: one setting compares with nothing, so there is nothing to recommend; see the notes, "
        "and run again once the server stays up"
    )


def _error_notes(results: Sequence[SettingResult], *, synthetic: bool) -> list[str]:
    notes = [
        f"at {result.limit}, {result.errors} of {result.calls + result.errors} measured calls did not succeed "
        f"({result.error})"
        for result in results
        if result.errors
    ]
    if notes:
        where = (
            "the generated arguments are a guess; write the calls your agent makes to a --workload file"
            if synthetic
            else "check the workload's calls"
        )
        notes.append(f"failed calls count as errors, not throughput, and no setting is chosen from them; {where}")
    return notes


def failed_entirely(measured: Mapping[int, Sequence[SettingResult]]) -> bool:
    """Whether every setting measured so far got errors and not one successful or cut-off call."""
    runs = [run for results in measured.values() for run in results]
    return bool(runs) and all(run.errors and not run.calls and not run.cut_off for run in runs)


def failed_note(measured: Mapping[int, Sequence[SettingResult]], limits: Sequence[int]) -> str:
    done = [limit for limit in limits if measured[limit]]
    first = measured[done[0]][0]
    tool = f"{first.error_tool}: " if first.error_tool else ""
    return (
        f"every measured call failed at {' and '.join(map(str, done))} ({tool}{first.error}), so there is nothing "
        "to recommend and the sweep stopped there: the other settings would only repeat the error; fix the "
        "workload's calls (or the server) and run again"
    )
