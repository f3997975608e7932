"""`tune`: sweep a concurrency limit against a real server and recommend a setting.

For each setting of the limit (`Dispatcher(max_concurrency=...)`, or the per-server limit of
`add_mcp_server`), a fresh dispatcher runs the same workload on one shared connection, so what changes
between settings is the limit and nothing else. Each setting is measured `repeats` times, in rounds
over the settings, by a closed loop of callers (`_measure`), and the repeats are combined into medians
with their range; the report (`_report`) reads them: the recommendation (`_recommend`) is the knee, where
throughput per unit of run time peaks: past it, more calls in flight only make each call slower. A time
budget or a stop event ends the sweep early with the settings measured so far. When no call of the
workload may run concurrently (an untrusted server, a workload of writes), no limit can matter, and
nothing is recommended.

With `fleet` (a Redis URL), the limit swept is a fleet-wide one: each setting is measured by `processes`
processes, each a dispatcher of its own sharing `FleetServer(limit=setting)` through Redis, with the
closed loop split across them (`_fleet`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
from mcp.types import ToolAnnotations

from dispatcher._core import _checks as checks
from dispatcher._core._annotations import HINTS
from dispatcher._core._errors import ConfigurationError, DispatcherError, ServerConnectionError
from dispatcher._core._limit_setting import AdaptiveLimit
from dispatcher._dispatcher import Dispatcher
from dispatcher._mcp._failures import innermost

from ._connection import LOST, connected, describe_target, lost_connection
from ._fleet import check_redis, fleet_measure
from ._measure import closed_loop
from ._online import measure_online
from ._recommend import TOLERANCE, CutShort
from ._report import Phase, TuneProgress, TuneReport, conclude, failed_entirely, failed_note
from ._workloads import resolve_workload, tool_change

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from dispatcher._core._calls import ToolCall
    from dispatcher._core._catalog import ToolEntry

    from ._connection import Target
    from ._measure import SettingResult
    from ._online import OnlineResult
    from ._workloads import Synthetic

__all__ = ["DEFAULT_REPEATS", "DEFAULT_SETTINGS", "TuneProgress", "TuneReport", "tune"]

# Seconds past `max_time` the sweep may take to close up (cancel the calls of the setting cut off, close the
# dispatcher) before it is cancelled outright.
_GRACE = 2.0

# The most processes a fleet sweep starts: each is a Python interpreter of its own on this machine.
_MAX_PROCESSES = 256

DEFAULT_SETTINGS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
"""The settings swept when none are given."""

DEFAULT_REPEATS = 3
"""Measurements per setting: three give a median and a spread, and the median shrugs off one bad run."""
# More would only make a sweep longer than anyone waits.
_MAX_REPEATS = 20
# The largest setting (and count of callers) swept: the closed loop runs as many callers as the largest
# setting and warms each setting up with two calls a slot, so a setting of 1e20 never ends (and its
# callers fill the memory).
_MAX_SETTING = 10_000


async def tune(
    target: Target,
    workload: Sequence[ToolCall] | Synthetic,
    settings: Sequence[int] = DEFAULT_SETTINGS,
    *,
    trusted: bool = False,
    per_server: bool = False,
    calls: int | None = 100,
    duration: float | None = None,
    warmup: int | None = None,
    clients: int | None = None,
    call_timeout: float | None = 60.0,
    tolerance: float = TOLERANCE,
    server: str = "server",
    mode: Literal["auto", "legacy"] = "auto",
    connect_timeout: float | None = 30.0,
    seed: int = 0,
    progress: Callable[[TuneProgress], object] | None = None,
    fleet: str | None = None,
    processes: int = 2,
    repeats: int = DEFAULT_REPEATS,
    max_time: float | None = None,
    stop: anyio.Event | None = None,
    overrides: Mapping[str, ToolAnnotations] | None = None,
    online: bool | AdaptiveLimit = False,
) -> TuneReport:
    """Run a workload under each setting of a concurrency limit and recommend one.

    One connection serves every setting; each measurement gets a fresh `Dispatcher` (no retries) with
    the server added through `add_mcp_server`. Throughput counts successful calls only; calls that fail
    are counted as errors, and a note says so. Each setting is measured `repeats` times, in rounds
    (every setting once, then every setting again), so that a disturbance of the machine or a server
    warming up falls on every setting alike rather than on the ones measured last; each result holds
    the medians of its repeats and their range.

    Args:
        target: An entered `mcp.Client` (you own it), anything `mcp.Client` connects to (an in-process
            `MCPServer` or `Server`, a `StdioServerParameters`, or a streamable HTTP URL), or a function
            that returns a new, unentered `mcp.Client`.
        workload: The calls to repeat, in order (their ids are replaced), or "reads" / "mixed" for a
            synthetic workload built from the server's tools (see `synthetic_workload`).
        settings: The limits to try.
        trusted: Whether to believe the server's annotations. Untrusted, every call runs alone, no
            limit can matter, and nothing is recommended.
        per_server: Sweep the per-server limit (`add_mcp_server(max_concurrency=...)`, with no
            dispatcher-wide limit) instead of `Dispatcher(max_concurrency=...)`.
        calls: Measured calls per measurement (each repeat), after the warm-up; None to measure for
            `duration` only.
        duration: Seconds each setting's measurement may last (whichever of the two ends first).
        warmup: Calls completed before measuring; None: two per slot of the setting being measured.
        clients: Callers kept waiting on the dispatcher; None: the largest setting.
        call_timeout: The dispatcher's `call_timeout`.
        tolerance: The share of the best throughput the recommended setting may give up.
        server: The name the server is registered under.
        mode: The protocol negotiation when `tune` connects ("auto" or "legacy").
        connect_timeout: Seconds to connect (when `tune` connects), or None.
        seed: The seed of the synthetic mixed workload.
        progress: Called after every completed call with a `TuneProgress` (in a fleet sweep, once a
            setting is done).
        fleet: A Redis URL: sweep the fleet-wide limit (`FleetServer(limit=...)`) with `processes`
            processes sharing it, each a dispatcher of its own connected to `target`, which must be a
            streamable HTTP URL. Needs the `fleet` extra.
        processes: The processes of a fleet sweep; the callers, warm-up and calls are split among them.
        repeats: The measurements of each setting (>= 1).
        max_time: Seconds the whole sweep may take (probing included), or None. When it runs out, the
            measurement under way closes its window there (kept, marked partial) and the report holds the
            settings measured so far, with `cut_short` "max_time".
        overrides: Your own annotations for some of the server's tools, as `add_mcp_server(overrides=...)`
            takes them (trusted even for an untrusted server): measure what declaring a tool read-only
            would do before writing it into code.
        stop: An event that ends the sweep early when set (the command line sets it on Ctrl-C): as with
            `max_time`, with `cut_short` "interrupted". The measurement under way closes its window there and
            is kept, marked partial (its calls so far counted, those running counted as cut off), unless the
            setting was measured whole in an earlier round; in a fleet sweep it is abandoned.
        online: After the sweep, run the same closed loop once more with the per-server limit left to
            an `AdaptiveLimit` (True: ``AdaptiveLimit(ceiling=<the largest setting>)``), for `ROUNDS`
            times the calls (or duration) of one measurement, and report where it settles
            (`TuneReport.online`). Not for a fleet sweep.

    Returns:
        The measurements and the recommendation.

    Raises:
        ConfigurationError: An argument is invalid, the workload names tools the server lacks, or every
            generated call of a synthetic workload failed.
        ServerConnectionError: The server could not be reached.
    """
    limits = _check_settings(settings)
    if isinstance(workload, str) and workload not in ("reads", "mixed"):
        raise ConfigurationError(f"the synthetic workload is 'reads' or 'mixed', got {workload!r}")
    if calls is None and duration is None:
        raise ConfigurationError("give calls, duration or both: each setting needs a way to end")
    checks.whole("calls", calls, none="measuring for a duration only")
    checks.seconds("duration", duration, none="measuring a count of calls only")
    checks.whole("warmup", warmup, minimum=0, none="two calls per slot")
    checks.whole("clients", clients, maximum=_MAX_SETTING, none="as many as the largest setting")
    if not 0 <= tolerance < 1:
        raise ConfigurationError(f"tolerance must be in [0, 1), got {tolerance!r}")
    checks.whole("repeats", repeats, maximum=_MAX_REPEATS)
    checks.seconds("max_time", max_time, none="no time budget")
    callers = clients if clients is not None else limits[-1]
    if fleet is not None:
        if not isinstance(target, str) or not target.startswith(("http://", "https://")):
            raise ConfigurationError(
                "a fleet sweep needs the server's streamable HTTP URL: every process of the fleet connects to it"
            )
        if per_server:
            raise ConfigurationError("a fleet sweep tunes the fleet-wide limit; per_server does not apply")
        if overrides:
            raise ConfigurationError("a fleet sweep does not take overrides yet; sweep without --fleet to try them")
        if online is not False:
            raise ConfigurationError("a fleet sweep does not run the online limit; sweep without --fleet for --online")
        checks.whole("processes", processes, maximum=_MAX_PROCESSES, hint="each is a Python process")
        callers = max(callers, processes)
        await check_redis(fleet, connect_timeout or 30.0)
    notes: list[str] = []
    measured: dict[int, list[SettingResult]] = {limit: [] for limit in limits}
    failure: DispatcherError | None = None
    cut_short: CutShort | None = None
    lost = ""  # how the server stopped answering, when it did mid-sweep
    listed: list[ToolEntry] = []  # the server's tools as the last setting found them
    pattern: list[ToolCall] = []  # the workload's calls, repeated by each setting
    description = ""
    share = 0.0
    settled: OnlineResult | None = None
    online_cut = False  # the online run was under way when the sweep was stopped or ran out of time
    gave_up: str | None = None  # why the sweep stopped early on its own: the first settings failed every call
    last: int | None = None  # the setting measured last: when the server was lost, the one it was lost during
    # While a setting is measured in this process, the stop event closes its window (kept as partial) instead
    # of cancelling the sweep: Ctrl-C during the first setting left an empty table.
    measuring = False

    def report_to(limit: int, index: int, repeat: int) -> tuple[Callable[[int, int | None], None] | None, Any]:
        if progress is None:
            return None, None
        where = functools.partial(TuneProgress, limit, index, len(limits), repeat=repeat, repeats=repeats)
        warm = 2 * limit if warmup is None else warmup
        state: dict[str, Any] = {
            "phase": "measuring",
            "completed": 0,
            "planned": None if calls is None else warm + calls,
        }

        def on_call(completed: int, planned: int | None) -> None:
            state["completed"], state["planned"] = completed, planned
            progress(where(completed, planned, phase=state["phase"]))

        def on_phase(phase: str) -> None:
            state["phase"] = phase
            progress(where(state["completed"], state["planned"], phase=cast("Phase", phase)))

        return on_call, on_phase

    async def sweep(client: Any, deadline: float) -> None:
        nonlocal pattern, description, share, failure, settled, cut_short, gave_up, lost, listed, last, measuring
        nonlocal online_cut
        for repeat in range(repeats):
            for index, limit in enumerate(limits):
                if stop is not None and stop.is_set():
                    cut_short = "interrupted"
                    return
                if anyio.current_time() >= deadline:
                    cut_short = "max_time"
                    return
                async with Dispatcher(
                    max_concurrency=None if per_server else limit, call_timeout=call_timeout, retry=None
                ) as dispatcher:
                    # Raised once out of the task groups (the dispatcher's and the client's), which would wrap it.
                    try:
                        entries = await dispatcher.add_mcp_server(
                            server,
                            client,
                            trusted=trusted,
                            max_concurrency=limit if per_server else None,
                            overrides=overrides,
                        )
                        if not pattern:
                            if progress is not None and isinstance(workload, str):
                                progress(TuneProgress(limit, index, len(limits), 0, None, 0, repeats, "probing"))
                            with anyio.CancelScope(deadline=deadline) as probing:
                                pattern, description = await resolve_workload(
                                    dispatcher, workload, _as_declared(entries, overrides or {}), seed=seed, notes=notes
                                )
                            if probing.cancelled_caught:
                                pattern, cut_short = [], "max_time"
                                return
                            by_name = {entry.name: entry for entry in entries}
                            share = sum(by_name[call.name].concurrent for call in pattern) / len(pattern)
                            notes.extend(_workload_notes(share, trusted, callers, limits))
                        change = tool_change(listed or entries, entries, pattern, limit)
                        listed = list(entries)
                        if change is not None:
                            notes.append(change)
                        on_call, on_phase = report_to(limit, index, repeat)
                        warm = 2 * limit if warmup is None else warmup
                        if fleet is not None:
                            assert isinstance(target, str)
                            result = await fleet_measure(
                                target,
                                pattern,
                                redis=fleet,
                                processes=processes,
                                limit=limit,
                                clients=callers,
                                warmup=warm,
                                calls=calls,
                                duration=duration,
                                trusted=trusted,
                                server=server,
                                mode=mode,
                                call_timeout=call_timeout,
                                connect_timeout=connect_timeout,
                                deadline=deadline,
                            )
                            if on_call is not None:
                                on_call(calls or 1, calls)
                        else:
                            measuring = True
                            try:
                                window = await closed_loop(
                                    dispatcher,
                                    pattern,
                                    clients=callers,
                                    warmup=warm,
                                    calls=calls,
                                    duration=duration,
                                    report=on_call,
                                    phase=on_phase,
                                    deadline=deadline,
                                    stop=stop,
                                )
                            finally:
                                measuring = False
                            result = window.summarise(limit)
                        if result.partial:
                            cut_short = "interrupted" if stop is not None and stop.is_set() else "max_time"
                            # A part of a window counts only for a setting measured in no other round, and
                            # only when a call ended in it (one stopped as it opened measured nothing).
                            if not measured[limit] and result.elapsed > 0 and result.calls + result.errors > 0:
                                measured[limit].append(result)
                            return
                        measured[limit].append(result)
                        last = limit
                        if repeat == 0 and index == min(1, len(limits) - 1) and failed_entirely(measured):
                            # The first settings failed every call: the rest would only repeat the error.
                            gave_up = failed_note(measured, limits)
                            return
                    except DispatcherError as exc:
                        failure = exc
                    except LOST as exc:  # the server exited or closed the connection: keep what was measured
                        cut_short, lost = "server_lost", f"{innermost(exc)}, before measuring {limit}"
                        return
                if failure is not None:
                    return
        stopped = stop is not None and stop.is_set()
        # The online run was asked for: stopped before it or during it, its result is missing (not "nothing is").
        online_cut = online is not False and bool(pattern) and share > 0
        if online_cut and anyio.current_time() < deadline and not stopped:
            settled = await measure_online(
                client,
                pattern,
                setting=online if isinstance(online, AdaptiveLimit) else AdaptiveLimit(ceiling=limits[-1]),
                server=server,
                trusted=trusted,
                overrides=overrides,
                clients=callers,
                calls=calls,
                duration=duration,
                call_timeout=call_timeout,
            )
            online_cut = False
        elif online_cut and not stopped:
            cut_short = "max_time"  # the budget ran out before the online run could start

    # The budget counts from here: connecting and probing are part of it. The measurement under way when
    # it runs out is cut off there (and kept, marked partial); closing up gets `_GRACE` seconds more.
    deadline = math.inf if max_time is None else anyio.current_time() + max_time
    interrupted = False
    with anyio.CancelScope(deadline=deadline + _GRACE) as budget:
        try:
            async with connected(target, mode=mode, connect_timeout=connect_timeout) as client:
                async with anyio.create_task_group() as tg:

                    async def watch() -> None:
                        nonlocal interrupted
                        assert stop is not None
                        await stop.wait()
                        interrupted = True
                        if not measuring:  # a measurement closes its own window on the event, and is kept
                            tg.cancel_scope.cancel()

                    if stop is not None:
                        tg.start_soon(watch)
                    await sweep(client, deadline)
                    tg.cancel_scope.cancel()
        except Exception as exc:  # the client's own tasks failed with the transport (an HTTP server gone)
            lost = lost_connection(exc) or ""
            if not lost:
                raise
            cut_short = "server_lost"
    if budget.cancelled_caught:
        cut_short = "max_time"
    if interrupted and cut_short is None:
        cut_short = "interrupted"
    if not online_cut and all(len(measured[limit]) == repeats and not measured[limit][-1].partial for limit in limits):
        # Stopped while closing up after the last measurement: nothing is missing (unless the online run was
        # cut off: its result is).
        cut_short = None
    if lost and not any(measured.values()):
        failure = ServerConnectionError(f"the server stopped answering before any setting was measured: {lost}")
    if failure is not None:
        raise failure
    if not pattern:
        # Cut short before the workload was known (while probing): nothing was measured.
        description = f"synthetic {workload}" if isinstance(workload, str) else f"{len(workload)} calls"
    # The calls of the setting measured when the server stopped answering failed with the connection.
    lost_during = last if last is not None and measured[last] and measured[last][-1].errors else None
    verdict = conclude(
        measured,
        share=share,
        tolerance=tolerance,
        planned_top=limits[-1],
        synthetic=isinstance(workload, str),
        repeats=repeats,
        cut_short=cut_short,
        max_time=max_time,
        lost=lost,
        lost_during=lost_during if cut_short == "server_lost" else None,
        gave_up=gave_up,
    )
    return TuneReport(
        target=describe_target(target),
        trusted=trusted,
        knob="fleet" if fleet is not None else "per_server" if per_server else "max_concurrency",
        workload=description,
        concurrent_share=share,
        clients=callers,
        calls=calls,
        duration=duration,
        settings=verdict.settings,
        recommended=verdict.recommended,
        best=verdict.best,
        explanation=verdict.explanation,
        notes=(*notes, *verdict.notes),
        processes=processes if fleet is not None else None,
        repeats=repeats,
        cut_short=cut_short,
        online=settled,
    )


def _as_declared(entries: Sequence[ToolEntry], overrides: Mapping[str, ToolAnnotations]) -> list[ToolEntry]:
    """The entries with the user's overrides laid over what the server declares.

    A synthetic workload picks tools by what is declared about them; the user's own declaration counts
    first, so that `--override search=readOnly` on a server that declares nothing makes search a read.
    """
    if not overrides:
        return list(entries)
    merged = []
    for entry in entries:
        override = overrides.get(entry.tool)
        if override is None:
            merged.append(entry)
            continue
        declared = entry.declared_annotations
        hints = {
            attr: getattr(override, attr) if getattr(override, attr) is not None else getattr(declared, attr, None)
            for _, attr in HINTS
        }
        merged.append(replace(entry, declared_annotations=ToolAnnotations.model_validate(hints)))
    return merged


def _check_settings(settings: Sequence[int]) -> list[int]:
    if not settings:
        raise ConfigurationError("settings is empty; give at least one limit to try, e.g. (1, 2, 4, 8)")
    bad = [s for s in settings if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if bad:
        raise ConfigurationError(f"every setting must be an int >= 1, got {bad}")
    huge = [s for s in settings if s > _MAX_SETTING]
    if huge:
        raise ConfigurationError(
            f"every setting must be at most {_MAX_SETTING} (as many callers run as the largest), got {huge}"
        )
    twice = sorted({s for s in settings if list(settings).count(s) > 1})
    if twice:
        # Dropping one would hide a typo (1, 2, 2, 4 for 1, 2, 3, 4): the sweep would not measure what was meant.
        raise ConfigurationError(f"settings lists {twice} more than once; give each limit once, e.g. (1, 2, 4, 8)")
    return sorted(settings)


def _workload_notes(share: float, trusted: bool, clients: int, limits: Sequence[int]) -> list[str]:
    notes = []
    if share == 0:
        why = (
            "the server is untrusted, so every call runs alone; pass --trusted (trusted=True) if you trust its hints"
            if not trusted
            else "no call of the workload is to a read-only tool, so every call runs alone"
        )
        notes.append(f"no limit can matter here: {why}")
    elif share < 1:
        notes.append(
            f"{1 - share:.0%} of the workload's calls run alone (not read-only), which caps what concurrency can gain"
        )
    beyond = [limit for limit in limits if limit > clients]
    if beyond:
        notes.append(f"only {clients} callers offer calls, so settings above it ({beyond}) cannot run more at once")
    return notes
