"""`tune --online`: the online limit (`AdaptiveLimit`) run against the same server and workload as the sweep.

The sweep measures fixed settings; this runs the same closed loop (`closed_loop`: the same callers, the same
calls) once more with the server's limit left to `AdaptiveLimit`, records the limit every time a call ends
(`CallEvent.limit`), and reports where it settles: the median of the limit over the second half of the
run (the first half is the limit finding its way from where it starts), with the lowest and highest it
took there, beside the throughput and run time the run measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher._dispatcher import Dispatcher

from ._measure import SettingResult, closed_loop, summarise

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from mcp.types import ToolAnnotations

    from dispatcher._core._calls import ToolCall
    from dispatcher._core._limit_setting import AdaptiveLimit
    from dispatcher._driver._observe import CallEvent

__all__ = ["OnlineResult", "measure_online"]

# How many times the sweep's calls per setting the online run measures: the limit needs rounds to settle.
ROUNDS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineResult:
    """Where the online limit settled against the sweep's server and workload.

    Attributes:
        setting: The `AdaptiveLimit` that ran (its floor, ceiling and factors).
        settled: The median of the limit over the second half of the run.
        low: The lowest limit over the second half.
        high: The highest limit over the second half.
        changes: How often the limit moved during the whole run.
        trace: ``(seconds from the start, limit)`` at every change, the start included.
        measured: The run's throughput, run and queue times, as a sweep setting's (its `limit` is `settled`).
    """

    setting: AdaptiveLimit
    settled: int
    low: int
    high: int
    changes: int
    trace: tuple[tuple[float, int], ...]
    measured: SettingResult

    def to_json(self) -> dict[str, Any]:
        """The result as JSON data (in `TuneReport.to_json`)."""
        setting = self.setting
        return {
            "setting": {
                "floor": setting.floor,
                "ceiling": setting.ceiling,
                "initial": setting.start,
                "tolerance": setting.tolerance,
                "backoff": setting.backoff,
            },
            "settled": self.settled,
            "low": self.low,
            "high": self.high,
            "changes": self.changes,
            "trace": [{"t": at, "limit": limit} for at, limit in self.trace],
            "measured": self.measured.to_json(),
        }


async def measure_online(
    client: Any,
    workload: Sequence[ToolCall],
    *,
    setting: AdaptiveLimit,
    server: str,
    trusted: bool,
    overrides: Mapping[str, ToolAnnotations] | None,
    clients: int,
    calls: int | None,
    duration: float | None,
    call_timeout: float | None,
) -> OnlineResult:
    """Run the workload's closed loop once under `setting` and summarise the limit's course."""
    limits: list[tuple[float, int]] = []

    def on_event(event: CallEvent) -> None:
        if event.kind == "finished" and event.limit is not None:
            limits.append((event.time, event.limit))

    async with Dispatcher(max_concurrency=None, call_timeout=call_timeout, retry=None, on_event=on_event) as dispatcher:
        await dispatcher.add_mcp_server(server, client, trusted=trusted, max_concurrency=setting, overrides=overrides)
        begun = anyio.current_time()
        window = await closed_loop(
            dispatcher,
            workload,
            clients=clients,
            warmup=0,
            calls=None if calls is None else ROUNDS * calls,
            duration=None if duration is None else ROUNDS * duration,
            report=None,
        )
    trace = [(0.0, setting.start)]
    for at, limit in limits:
        if limit != trace[-1][1]:
            trace.append((at - begun, limit))
    late = [limit for _, limit in limits[len(limits) // 2 :]] or [setting.start]
    settled = round(statistics.median(late))
    measured = summarise(settled, window.results, window.start, window.stop, inclusive=window.inclusive)
    return OnlineResult(
        setting=setting,
        settled=settled,
        low=min(late),
        high=max(late),
        changes=len(trace) - 1,
        trace=tuple(trace),
        measured=measured,
    )
