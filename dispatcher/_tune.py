"""`dispatcher tune`: sweep a concurrency limit against a real server and recommend a setting.

For each setting of the limit (`Dispatcher(max_concurrency=...)`, or the per-server limit of
`add_mcp_server`), a fresh dispatcher runs the same workload on one shared connection, so what changes
between settings is the limit and nothing else. The load is a closed loop: a fixed number of callers
(by default the largest setting) each submit a call and wait for its result, then submit the next, so
the dispatcher always has more calls offered than it may run and the limit decides how many are in
flight. After a warm-up (two calls per slot of the limit: the first round fills the pipeline, the
second lets calls that started together drift apart as they do in steady state), the measurement
window runs from the end of the warm-up to the completion of the last measured call:

- throughput: answered calls (OK or TOOL_ERROR) per second of the window, each call counted for the
  share of its run time inside the window (see `_summarise`);
- run time (`ToolResult.finished_at - started_at`): a started call's time to its result, the server's
  time plus the round trip of the transport, p50 and p95;
- queue time (`started_at - queued_at`): how long calls waited in the dispatcher for a slot;
- calls in flight: the mean number of calls running during the window.

The recommendation (`recommend`, a pure function of the measurements) is the smallest setting whose
throughput is within 5% of the best: past it, more calls in flight only make each call slower.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib.metadata
import itertools
import json
import math
import os
import platform
import random
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

import anyio
from mcp import Client, StdioServerParameters

from ._calls import CallStatus, ToolCall
from ._dispatcher import Dispatcher
from ._errors import ConfigurationError, DispatcherError, ServerConnectionError

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence

    from mcp.server import Server
    from mcp.server.mcpserver import MCPServer

    from ._batch import Batch, PendingCall
    from ._calls import ToolResult
    from ._catalog import ToolEntry

__all__ = [
    "DEFAULT_SETTINGS",
    "SettingResult",
    "TuneProgress",
    "TuneReport",
    "add_parser",
    "doubling",
    "load_workload",
    "recommend",
    "render_table",
    "synthetic_workload",
    "tune",
]

DEFAULT_SETTINGS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
"""The settings swept when none are given."""

TOLERANCE = 0.05
"""A setting is good enough when its throughput is within this share of the best."""

_ANSWERED = (CallStatus.OK, CallStatus.TOOL_ERROR)
# The share of reads in the synthetic mixed workload, as in the benchmark suite's mixed turns.
_MIXED_READ_SHARE = 0.7
_SYNTHETIC_LENGTH = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingResult:
    """What one setting of the limit measured. Times are in seconds.

    Attributes:
        limit: The setting.
        calls: Answered calls (OK or TOOL_ERROR) that ended inside the window.
        errors: Calls ending inside the window that failed, timed out or were cancelled.
        elapsed: The measurement window.
        throughput: Answered calls per second of the window, each counted for the share of its run
            time inside the window.
        run_p50: The median run time of the answered calls (`finished_at - started_at`).
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


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneReport:
    """A sweep's measurements and the setting it recommends.

    Attributes:
        target: What was tuned against, for people.
        trusted: Whether the server's annotations were trusted.
        knob: "max_concurrency" (the dispatcher-wide limit) or "per_server" (`add_mcp_server`'s).
        workload: A description of the workload.
        concurrent_share: The share of the workload's calls that may run concurrently.
        clients: Callers kept waiting on the dispatcher (the offered concurrency).
        calls: Measured calls per setting (None: measured for `duration` instead).
        duration: The time budget of each setting's measurement, if any.
        settings: One result per setting, in increasing order.
        recommended: The recommended setting, or None when no setting got an answer.
        best: The setting with the highest throughput, or None likewise.
        explanation: Why the recommended setting, in a sentence or two.
        notes: Things the reader should know (an untrusted server, errors, a narrow range).
    """

    target: str
    trusted: bool
    knob: Literal["max_concurrency", "per_server"]
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

    @property
    def how_to_apply(self) -> str:
        """The code that applies the recommendation."""
        if self.recommended is None:
            return "no recommendation"
        if self.knob == "per_server":
            return f"add_mcp_server(..., max_concurrency={self.recommended})"
        return f"Dispatcher(max_concurrency={self.recommended})"

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data (what `--json` writes, without the machine description)."""
        return {
            "target": self.target,
            "trusted": self.trusted,
            "knob": self.knob,
            "workload": self.workload,
            "concurrent_share": self.concurrent_share,
            "clients": self.clients,
            "calls": self.calls,
            "duration_s": self.duration,
            "settings": [setting.to_json() for setting in self.settings],
            "recommended": self.recommended,
            "best": self.best,
            "apply": self.how_to_apply,
            "explanation": self.explanation,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class TuneProgress:
    """Where a sweep is: setting `index` of `total` (from 0), `completed` of its `planned` calls.

    `planned` is None when the setting runs for a time budget rather than a number of calls.
    """

    limit: int
    index: int
    total: int
    completed: int
    planned: int | None


# The recommendation -----------------------------------------------------------------------------


def recommend(settings: Sequence[SettingResult], *, tolerance: float = TOLERANCE) -> tuple[int | None, int | None, str]:
    """The smallest setting whose throughput is within `tolerance` of the best, and why.

    Args:
        settings: The measurements, one per setting (any order).
        tolerance: The share of the best throughput a setting may give up.

    Returns:
        The recommended setting, the best one, and a sentence or two that explain the choice. Both
        settings are None when no setting got a single answer.
    """
    ordered = sorted(settings, key=lambda s: s.limit)
    measured = [s for s in ordered if s.calls > 0 and s.throughput > 0]
    if not measured:
        return None, None, "no setting got an answer from the server, so there is nothing to recommend; see the errors"
    best = max(measured, key=lambda s: s.throughput)
    chosen = next(s for s in measured if s.throughput >= (1 - tolerance) * best.throughput)
    top = measured[-1]
    if chosen is best:
        if chosen is top and len(measured) > 1:
            before = measured[-2]
            gain = best.throughput / before.throughput - 1 if before.throughput > 0 else math.inf
            return (
                chosen.limit,
                best.limit,
                f"{chosen.limit} gives the best throughput ({_rate(best)}), {_percent(gain)} more than "
                f"{before.limit}; it is the largest setting tried and throughput was still growing, so try a "
                "wider range.",
            )
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
    if top.run_p95 > 1.1 * chosen.run_p95:
        more = "without more throughput" if same else f"for at most {_percent(gain)} more throughput"
        return (
            chosen.limit,
            best.limit,
            f"{head}; beyond it, each call's p95 run time grows from {_ms(chosen.run_p95)} to "
            f"{_ms(top.run_p95)} (at {top.limit}) {more}.",
        )
    more = "no more throughput" if same else f"at most {_percent(gain)} more throughput"
    return chosen.limit, best.limit, f"{head}; larger settings give {more}."


def _rate(setting: SettingResult) -> str:
    return f"{_number(setting.throughput)} calls/s"


def _percent(share: float) -> str:
    return "infinitely" if math.isinf(share) else f"{share:.0%}"


def _ms(seconds: float) -> str:
    return f"{_number(seconds * 1000)} ms"


def _number(value: float) -> str:
    if math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


# Workloads --------------------------------------------------------------------------------------


def load_workload(lines: Iterable[str], *, source: str = "workload") -> list[ToolCall]:
    """Parse a JSONL workload: one JSON object per line, ``{"name": ..., "arguments": {...}}``.

    An "id" is accepted and ignored: the calls are repeated, so each gets a fresh id. Blank lines are
    skipped.

    Raises:
        ConfigurationError: A line is not such an object, or there are no calls.
    """
    calls: list[ToolCall] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ConfigurationError(f"{where}: not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise ConfigurationError(f"{where}: expected a JSON object with a name, got {type(item).__name__}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f'{where}: "name" must be a tool name, got {name!r}')
        arguments = item.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ConfigurationError(f'{where}: "arguments" must be a JSON object, got {type(arguments).__name__}')
        unknown = sorted(set(item) - {"name", "arguments", "id"})
        if unknown:
            raise ConfigurationError(f"{where}: unknown keys {unknown}; a call has name, arguments and id")
        calls.append(ToolCall(str(len(calls)), name, arguments))
    if not calls:
        raise ConfigurationError(f"{source} has no calls; write one JSON object per line")
    return calls


def synthetic_workload(
    entries: Sequence[ToolEntry], kind: Literal["reads", "mixed"], *, seed: int = 0
) -> list[ToolCall]:
    """A workload built from a server's own tools, with arguments generated from their input schemas.

    Reads are the tools declared read-only; open-world ones (declared `openWorldHint: true`) are left
    out, so that a load test never sends generated requests to third parties. "mixed" adds the tools
    declared additive (not read-only, `destructiveHint: false`, not open-world) for about 30% of the
    calls, chosen with `random.Random(seed)`; tools that may destroy or overwrite are never called.
    Tools are taken by what the server declares, whether it is trusted or not: trust decides how the
    calls are scheduled, not which are safe to generate.

    Raises:
        ConfigurationError: The server declares no suitable tool.
    """
    if kind not in ("reads", "mixed"):
        raise ConfigurationError(f"the synthetic workload is 'reads' or 'mixed', got {kind!r}")
    reads, writes = [], []
    for entry in entries:
        declared = entry.declared_annotations
        if declared is None or declared.open_world_hint is True:
            continue
        if declared.read_only_hint is True:
            reads.append(entry)
        elif declared.destructive_hint is False:
            writes.append(entry)
    if not reads:
        raise ConfigurationError(
            "the server declares no read-only, closed-world tool (readOnlyHint true, openWorldHint not true) "
            "for a synthetic workload; write a --workload file instead"
        )
    if kind == "mixed" and not writes:
        raise ConfigurationError(
            "the server declares no additive tool (readOnlyHint false, destructiveHint false, openWorldHint not "
            "true) for a mixed synthetic workload; use --synthetic reads or a --workload file"
        )
    rng = random.Random(seed)
    calls: list[ToolCall] = []
    for index in range(_SYNTHETIC_LENGTH):
        if kind == "mixed" and rng.random() >= _MIXED_READ_SHARE:
            entry = writes[index % len(writes)]
        else:
            entry = reads[index % len(reads)]
        calls.append(ToolCall(str(index), entry.name, _arguments(entry.input_schema, index)))
    return calls


def _declared_read_only(entry: ToolEntry) -> bool:
    return entry.declared_annotations is not None and entry.declared_annotations.read_only_hint is True


def _arguments(schema: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Arguments for the required properties of an object schema."""
    value = _example(schema, index, schema, depth=0)
    return value if isinstance(value, dict) else {}


def _example(schema: Any, index: int, root: Mapping[str, Any], *, depth: int) -> Any:
    """A value that fits `schema`, varied by `index` (a best effort: the server validates)."""
    if not isinstance(schema, dict) or depth > 8:
        return f"tune-{index}"
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return _example(target, index, root, depth=depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[index % len(enum)]
    if "default" in schema:
        return schema["default"]
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        return examples[index % len(examples)]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list):
            usable = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            if usable:
                return _example(usable[0], index, root, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        return {
            name: _example(properties.get(name, {}), index, root, depth=depth + 1)
            for name in required
            if isinstance(name, str)
        }
    if kind == "array":
        count = schema.get("minItems", 0)
        count = count if isinstance(count, int) else 0
        return [_example(schema.get("items", {}), index, root, depth=depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        low = low if isinstance(low, int | float) else 0
        high = schema.get("maximum", schema.get("exclusiveMaximum", low + 10))
        high = high if isinstance(high, int | float) else low + 10
        value = low + index % max(1, int(high - low))
        if schema.get("exclusiveMinimum") is not None and value <= low:
            value = low + 1
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _string(schema, index)


def _string(schema: Mapping[str, Any], index: int) -> str:
    fmt = schema.get("format")
    formats = {
        "uri": "https://example.com/",
        "url": "https://example.com/",
        "email": "tune@example.com",
        "date-time": "2026-01-01T00:00:00Z",
        "date": "2026-01-01",
        "time": "00:00:00Z",
        "uuid": "00000000-0000-4000-8000-000000000000",
    }
    text = formats.get(fmt, f"tune-{index % 16}") if isinstance(fmt, str) else f"tune-{index % 16}"
    low = schema.get("minLength")
    high = schema.get("maxLength")
    if isinstance(low, int) and len(text) < low:
        text = text + "x" * (low - len(text))
    if isinstance(high, int) and len(text) > high:
        text = text[: max(high, 0)]
    return text


# The sweep --------------------------------------------------------------------------------------


async def tune(
    target: Client | MCPServer[Any] | Server[Any] | StdioServerParameters | str,
    workload: Sequence[ToolCall] | Literal["reads", "mixed"],
    settings: Sequence[int] = DEFAULT_SETTINGS,
    *,
    trusted: bool = False,
    per_server: bool = False,
    calls: int | None = 200,
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
) -> TuneReport:
    """Run a workload under each setting of a concurrency limit and recommend one.

    One connection serves every setting; each setting gets a fresh `Dispatcher` (no retries) with the
    server added through `add_mcp_server`. See the module docstring for what is measured.

    Args:
        target: An entered `mcp.Client` (you own it), or anything `mcp.Client` connects to: an
            in-process `MCPServer` or `Server`, a `StdioServerParameters`, or a streamable HTTP URL.
        workload: The calls to repeat, in order (their ids are replaced), or "reads" / "mixed" for a
            synthetic workload built from the server's tools (see `synthetic_workload`).
        settings: The limits to try.
        trusted: Whether to believe the server's annotations. Untrusted, every call runs alone and no
            limit can matter.
        per_server: Sweep the per-server limit (`add_mcp_server(max_concurrency=...)`, with no
            dispatcher-wide limit) instead of `Dispatcher(max_concurrency=...)`.
        calls: Measured calls per setting, after the warm-up; None to measure for `duration` only.
        duration: Seconds each setting's measurement may last (whichever of the two ends first).
        warmup: Calls completed before measuring; None: two per slot of the setting being measured.
        clients: Callers kept waiting on the dispatcher; None: the largest setting.
        call_timeout: The dispatcher's `call_timeout`.
        tolerance: The share of the best throughput the recommended setting may give up.
        server: The name the server is registered under.
        mode: The protocol negotiation when `tune` connects ("auto" or "legacy").
        connect_timeout: Seconds to connect (when `tune` connects), or None.
        seed: The seed of the synthetic mixed workload.
        progress: Called after every completed call with a `TuneProgress`.

    Returns:
        The measurements and the recommendation.

    Raises:
        ConfigurationError: An argument is invalid, or the workload names tools the server lacks.
        ServerConnectionError: The server could not be reached.
    """
    limits = _check_settings(settings)
    if isinstance(workload, str) and workload not in ("reads", "mixed"):
        raise ConfigurationError(f"the synthetic workload is 'reads' or 'mixed', got {workload!r}")
    if calls is None and duration is None:
        raise ConfigurationError("give calls, duration or both: each setting needs a way to end")
    if calls is not None and (not isinstance(calls, int) or isinstance(calls, bool) or calls < 1):
        raise ConfigurationError(f"calls must be an int >= 1 or None, got {calls!r}")
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise ConfigurationError(f"duration must be a positive number of seconds or None, got {duration!r}")
    if warmup is not None and (not isinstance(warmup, int) or warmup < 0):
        raise ConfigurationError(f"warmup must be an int >= 0 or None, got {warmup!r}")
    if clients is not None and (not isinstance(clients, int) or clients < 1):
        raise ConfigurationError(f"clients must be an int >= 1 or None, got {clients!r}")
    if not 0 <= tolerance < 1:
        raise ConfigurationError(f"tolerance must be in [0, 1), got {tolerance!r}")
    callers = clients if clients is not None else limits[-1]
    notes: list[str] = []
    results: list[SettingResult] = []
    failure: DispatcherError | None = None
    async with _connected(target, mode=mode, connect_timeout=connect_timeout) as client:
        pattern: list[ToolCall] = []  # the workload's calls, repeated by each setting
        description = ""
        share = 0.0
        for index, limit in enumerate(limits):
            async with Dispatcher(
                max_concurrency=None if per_server else limit, call_timeout=call_timeout, retry=None
            ) as dispatcher:
                # Raised once out of the task groups (the dispatcher's and the client's), which would wrap it.
                try:
                    entries = await dispatcher.add_mcp_server(
                        server, client, trusted=trusted, max_concurrency=limit if per_server else None
                    )
                    if index == 0:
                        pattern, description = await _resolve_workload(dispatcher, workload, entries, seed, notes)
                        by_name = {entry.name: entry for entry in entries}
                        share = sum(by_name[call.name].concurrent for call in pattern) / len(pattern)
                        notes.extend(_workload_notes(share, trusted, callers, limits))
                    report = (
                        None
                        if progress is None
                        else functools.partial(_report_progress, progress, limit, index, len(limits))
                    )
                    results.append(
                        await _measure(
                            dispatcher,
                            pattern,
                            limit=limit,
                            clients=callers,
                            warmup=2 * limit if warmup is None else warmup,
                            calls=calls,
                            duration=duration,
                            report=report,
                        )
                    )
                except DispatcherError as exc:
                    failure = exc
            if failure is not None:
                break
    if failure is not None:
        raise failure
    for result in results:
        if result.errors:
            total = result.calls + result.errors
            notes.append(
                f"at {result.limit}, {result.errors} of {total} measured calls did not succeed ({result.error})"
            )
    recommended, best, explanation = recommend(results, tolerance=tolerance)
    return TuneReport(
        target=_describe_target(target),
        trusted=trusted,
        knob="per_server" if per_server else "max_concurrency",
        workload=description,
        concurrent_share=share,
        clients=callers,
        calls=calls,
        duration=duration,
        settings=tuple(results),
        recommended=recommended,
        best=best,
        explanation=explanation,
        notes=tuple(notes),
    )


def _report_progress(
    progress: Callable[[TuneProgress], object], limit: int, index: int, total: int, completed: int, planned: int | None
) -> None:
    progress(TuneProgress(limit, index, total, completed, planned))


def _check_settings(settings: Sequence[int]) -> list[int]:
    if not settings:
        raise ConfigurationError("settings is empty; give at least one limit to try, e.g. (1, 2, 4, 8)")
    bad = [s for s in settings if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if bad:
        raise ConfigurationError(f"every setting must be an int >= 1, got {bad}")
    return sorted(set(settings))


async def _resolve_workload(
    dispatcher: Dispatcher,
    workload: Sequence[ToolCall] | Literal["reads", "mixed"],
    entries: Sequence[ToolEntry],
    seed: int,
    notes: list[str],
) -> tuple[list[ToolCall], str]:
    if isinstance(workload, str):
        entries = await _probe(dispatcher, entries, workload, seed, notes)
        calls = synthetic_workload(entries, workload, seed=seed)
        tools = ", ".join(dict.fromkeys(call.name for call in calls))
        return calls, f"synthetic {workload} ({tools})"
    calls = list(workload)
    if not calls:
        raise ConfigurationError("the workload has no calls")
    known = {entry.name for entry in entries} | {entry.tool for entry in entries}
    unknown = sorted({call.name for call in calls} - known)
    if unknown:
        raise ConfigurationError(
            f"the workload calls tools the server does not offer: {unknown}; it offers "
            f"{sorted(entry.name for entry in entries)}"
        )
    names = {entry.tool: entry.name for entry in entries}
    calls = [ToolCall(call.id, names.get(call.name, call.name), call.arguments) for call in calls]
    return calls, f"{len(calls)} calls of {', '.join(dict.fromkeys(call.name for call in calls))}"


async def _probe(
    dispatcher: Dispatcher, entries: Sequence[ToolEntry], kind: Literal["reads", "mixed"], seed: int, notes: list[str]
) -> list[ToolEntry]:
    """Call each tool a synthetic workload would use once; keep those that answer with success.

    Generated arguments are a guess (a note named "tune-0" may not exist), so a tool that answers
    with an error is kept only when no tool of its kind (read or write) succeeds, and a tool whose
    call fails outright is left out.
    """
    first = {call.name: call for call in reversed(synthetic_workload(entries, kind, seed=seed))}
    probes = [ToolCall(f"probe-{number}", call.name, call.arguments) for number, call in enumerate(first.values())]
    results = {result.tool: result for result in await dispatcher.dispatch(probes)}
    by_name = {entry.name: entry for entry in entries}
    keep: set[str] = set()
    for is_read in (True, False):
        group = [name for name in first if _declared_read_only(by_name[name]) is is_read]
        ok = [name for name in group if results[name].status is CallStatus.OK]
        answered = [name for name in group if results[name].status in _ANSWERED]
        keep.update(ok or answered)
        notes.extend(
            f"the synthetic workload leaves out {name}: its generated call got {results[name].error}"
            for name in group
            if name not in keep
        )
    kept = [entry for entry in entries if entry.name in keep or entry.name not in first]
    if not any(name in keep for name in first):
        raise ConfigurationError(
            "no tool answered the synthetic workload's generated calls; write a --workload file instead ("
            + "; ".join(f"{name}: {result.error}" for name, result in results.items())
            + ")"
        )
    return kept


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


async def _measure(
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
    """Run one setting's closed loop and summarise its measurement window.

    Each call is a batch of its own, so that when the measurement ends the calls still queued can be
    withdrawn without touching those already running at the server. Those are left to finish: they
    ran during the window, and count for the part of their run time that fell inside it.
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
    return _summarise(limit, [*finished, *tail], window_start, window_stop, inclusive=not warmup)


def _repeat(workload: Sequence[ToolCall]) -> Iterator[ToolCall]:
    """The workload's calls over and over, each with an id of its own."""
    for number, call in enumerate(itertools.cycle(workload)):
        yield ToolCall(str(number), call.name, call.arguments)


def _summarise(
    limit: int, results: Sequence[ToolResult], start: float, stop: float, *, inclusive: bool
) -> SettingResult:
    """The figures of the window from `start` to `stop`.

    Throughput counts each answered call for the share of its run time inside the window, so calls
    that straddle an edge count in part. That keeps the estimate exact whatever the phase of the
    window: completions often come in bursts (calls that started together end together), and a
    count of whole calls between two completions would include part of a burst at one end only.
    The latencies are those of the calls that ended inside the window.
    """

    def ended_inside(r: ToolResult) -> bool:
        return (start <= r.finished_at if inclusive else start < r.finished_at) and r.finished_at <= stop

    measured = [r for r in results if ended_inside(r)]
    answered = [r for r in measured if r.status in _ANSWERED]
    failed = [r for r in measured if r.status not in _ANSWERED]
    elapsed = stop - start
    done = 0.0  # answered calls, in shares of a call
    busy = 0.0  # seconds of calls running, summed over the calls
    for r in results:
        if r.status not in _ANSWERED or r.started_at is None:
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
        throughput, in_flight = (math.inf if answered else 0.0), math.nan
    runs = sorted(r.run_time for r in answered)
    queues = sorted(r.queue_time for r in answered)
    return SettingResult(
        limit=limit,
        calls=len(answered),
        errors=len(failed),
        elapsed=elapsed,
        throughput=throughput,
        run_p50=_percentile(runs, 0.5),
        run_p95=_percentile(runs, 0.95),
        queue_p50=_percentile(queues, 0.5),
        queue_p95=_percentile(queues, 0.95),
        in_flight=in_flight,
        error=f"{failed[0].status.value}: {failed[0].error}" if failed else None,
    )


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated linearly between the closest ranks."""
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@contextlib.asynccontextmanager
async def _connected(
    target: Client | MCPServer[Any] | Server[Any] | StdioServerParameters | str,
    *,
    mode: Literal["auto", "legacy"],
    connect_timeout: float | None,
) -> AsyncIterator[Client]:
    """The caller's entered client, or a client connected to `target` for the whole sweep."""
    if isinstance(target, Client):
        yield target
        return
    try:
        client = Client(target, mode=mode)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot connect to {target!r}: {exc}") from None
    description = _describe_target(target)
    connected = False
    deadline = math.inf if connect_timeout is None else anyio.current_time() + connect_timeout
    try:
        # One scope around the whole session: its deadline bounds connecting, and is lifted once
        # connected (a scope cannot end while the client it encloses is still open).
        with anyio.CancelScope(deadline=deadline) as scope:
            async with client:
                scope.deadline = math.inf
                connected = True
                yield client
    except Exception as exc:
        if connected:
            raise
        raise ServerConnectionError(f"could not connect to {description}: {_innermost(exc)}") from exc
    if scope.cancelled_caught and not connected:
        raise ServerConnectionError(f"could not connect to {description} within {connect_timeout} s")


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _describe_target(target: object) -> str:
    if isinstance(target, Client):
        return "an entered mcp.Client"
    if isinstance(target, StdioServerParameters):
        return shlex.join([target.command, *target.args])
    if isinstance(target, str):
        return target
    return f"in-process {type(target).__name__}"


# Output -----------------------------------------------------------------------------------------

_HEADERS = ("calls/s", "of best", "in flight", "run p50", "run p95", "queue p50", "queue p95", "errors")


def _rows(report: TuneReport) -> list[list[str]]:
    best = max((s.throughput for s in report.settings if math.isfinite(s.throughput)), default=0.0)
    return [
        [
            str(s.limit),
            _number(s.throughput),
            f"{s.throughput / best:.0%}" if best > 0 and math.isfinite(s.throughput) else "-",
            _number(s.in_flight),
            _number(s.run_p50 * 1000),
            _number(s.run_p95 * 1000),
            _number(s.queue_p50 * 1000),
            _number(s.queue_p95 * 1000),
            str(s.errors),
            "<- recommended" if s.limit == report.recommended else "",
        ]
        for s in report.settings
    ]


def _heading(report: TuneReport) -> list[str]:
    trust = "trusted" if report.trusted else "untrusted"
    knob = "the per-server limit" if report.knob == "per_server" else "max_concurrency"
    amount = f"{report.calls} measured calls" if report.calls is not None else "measured calls"
    if report.duration is not None:
        amount += f" (at most {report.duration:g} s)"
    return [
        f"tuning {knob} against {report.target} ({trust})",
        f"workload: {report.workload}; {report.clients} callers; {amount} per setting after a warm-up",
    ]


def render_table(report: TuneReport) -> str:
    """The report as plain text: the heading, the table (times in ms), the recommendation, notes."""
    headers = [report.knob, *_HEADERS, ""]
    rows = _rows(report)
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(w) if i < len(cells) - 1 else cell for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    lines = [*_heading(report), "", line(headers), *(line(row) for row in rows), ""]
    lines.extend(_conclusion(report))
    return "\n".join(lines)


def _conclusion(report: TuneReport) -> list[str]:
    lines = ["times in ms; run = from a call's start to its result, queue = waiting for a slot in the dispatcher"]
    if report.recommended is not None:
        lines.append(f"recommended: {report.how_to_apply}")
    lines.append(report.explanation)
    lines.extend(f"note: {note}" for note in report.notes)
    return lines


def _print_rich(report: TuneReport, stream: TextIO) -> bool:
    """Print the report with rich on a terminal; False when rich is missing or it is not a terminal."""
    if not stream.isatty():
        return False
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return False
    console = Console(file=stream)
    for text in _heading(report):
        console.print(text, highlight=False)
    table = Table()
    for header in (report.knob, *_HEADERS):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("")
    for row in _rows(report):
        style = "bold green" if row[-1] else None
        table.add_row(*row, style=style)
    console.print(table)
    for text in _conclusion(report):
        console.print(text, highlight=False)
    return True


def machine_info() -> dict[str, Any]:
    """The machine and versions a sweep ran on, for the JSON file."""

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": {name: version(name) for name in ("dispatcher", "mcp", "anyio", "trio")},
    }


def save_plot(report: TuneReport, path: Path) -> None:
    """Draw throughput and p50/p95 run time against the setting into a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limits = [s.limit for s in report.settings]
    positions = list(range(len(limits)))
    fig, left = plt.subplots(figsize=(7, 4.5))
    left.plot(positions, [s.throughput for s in report.settings], "o-", color="tab:blue", label="throughput")
    left.set_xticks(positions, [str(limit) for limit in limits])
    left.set_xlabel(report.knob)
    left.set_ylabel("throughput (calls/s)", color="tab:blue")
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(positions, [s.run_p50 * 1000 for s in report.settings], "s--", color="tab:orange", label="run p50")
    right.plot(positions, [s.run_p95 * 1000 for s in report.settings], "^:", color="tab:red", label="run p95")
    right.set_ylabel("run time per call (ms)", color="tab:red")
    right.set_ylim(bottom=0)
    if report.recommended is not None:
        left.axvline(limits.index(report.recommended), color="tab:green", alpha=0.5, label="recommended")
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    # On the twin axes, drawn last, so that no line crosses the legend.
    right.legend(handles=handles, loc="upper left")
    left.grid(True, alpha=0.3)
    left.set_title(f"{report.target}"[:80], fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# The command ------------------------------------------------------------------------------------


def doubling(start: int, stop: int) -> list[int]:
    """The settings start, 2*start, 4*start, ... up to stop (stop included even off the sequence).

    Raises:
        ConfigurationError: start < 1 or stop < start.
    """
    if start < 1 or stop < start:
        raise ConfigurationError(f"--from must be >= 1 and --to >= --from, got {start} and {stop}")
    limits = []
    value = start
    while value < stop:
        limits.append(value)
        value *= 2
    limits.append(stop)
    return limits


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the `tune` subcommand."""
    parser = subparsers.add_parser(
        "tune",
        help="sweep max_concurrency against an MCP server and recommend a setting",
        description=(
            "Run a workload against an MCP server under each setting of max_concurrency (or of the per-server "
            "limit), measure throughput and p50/p95 latency, and recommend the smallest setting within 5%% of "
            "the best throughput."
        ),
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--stdio", metavar="CMD", help='launch the server as a subprocess, e.g. "npx -y some-server"')
    where.add_argument("--url", help="the URL of a streamable HTTP endpoint")
    parser.add_argument("--trusted", action="store_true", help="trust the server's annotations (default: untrusted)")
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument(
        "--workload", type=Path, metavar="FILE", help='JSONL: one {"name": ..., "arguments": {...}} a line'
    )
    load.add_argument(
        "--synthetic",
        choices=("reads", "mixed"),
        help="calls of the server's own read-only (and additive) tools",
    )
    sweep = parser.add_argument_group("the sweep")
    sweep.add_argument("--range", metavar="A,B,...", help="the settings to try (default: 1,2,4,8,16,32,64)")
    sweep.add_argument("--from", dest="start", type=int, metavar="N", help="double from N ...")
    sweep.add_argument("--to", dest="stop", type=int, metavar="M", help="... up to M")
    sweep.add_argument(
        "--per-server", action="store_true", help="sweep the per-server limit instead of the dispatcher-wide one"
    )
    sweep.add_argument("--calls", type=int, default=None, metavar="N", help="measured calls per setting (default 200)")
    sweep.add_argument("--duration", type=float, metavar="S", help="measure each setting for at most S seconds")
    sweep.add_argument("--warmup", type=int, metavar="N", help="calls before measuring (default: twice the setting)")
    sweep.add_argument("--clients", type=int, metavar="N", help="callers offering calls (default: the largest setting)")
    sweep.add_argument("--call-timeout", type=float, default=60.0, metavar="S", help="per call (default 60)")
    sweep.add_argument("--seed", type=int, default=0, help="seed of the synthetic mixed workload")
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="PATH", help="write the report as JSON")
    out.add_argument("--plot", type=Path, metavar="PATH", help="draw a PNG plot (needs matplotlib)")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    conn = parser.add_argument_group("connection")
    conn.add_argument("--mode", choices=("auto", "legacy"), default="auto", help="protocol negotiation")
    conn.add_argument("--name", default="server", help="the name to register the server under")
    conn.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="for --stdio (repeatable)")
    conn.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds to connect")
    parser.set_defaults(handler=_run)


class _Bar:
    """A progress bar on stderr: rich's on a terminal when it is installed, else rewritten plain text on a
    terminal, and a line per setting elsewhere (logs)."""

    def __init__(self, stream: TextIO, *, enabled: bool) -> None:
        self._stream = stream
        self._enabled = enabled
        self._tty = stream.isatty()
        self._last = (-1, -1)
        self._started = time.perf_counter()
        self._rich: Any = None
        if enabled and self._tty:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
            except ImportError:
                pass
            else:
                columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
                self._rich = Progress(*columns, console=Console(file=stream), auto_refresh=False, transient=True)
                self._task = self._rich.add_task("connecting", total=1.0)
                self._rich.start()

    def __call__(self, step: TuneProgress) -> None:
        if not self._enabled:
            return
        if not self._tty:
            if step.index != self._last[0]:
                self._last = (step.index, 0)
                self._stream.write(f"setting {step.index + 1}/{step.total}: {step.limit} ...\n")
                self._stream.flush()
            return
        share = step.completed / step.planned if step.planned else 0.0
        overall = (step.index + min(share, 1.0)) / step.total
        key = (step.index, int(overall * 200))
        if key == self._last:
            return
        self._last = key
        planned = f"/{step.planned}" if step.planned is not None else ""
        where = f"setting {step.index + 1}/{step.total} ({step.limit}): {step.completed}{planned} calls"
        if self._rich is not None:
            self._rich.update(self._task, completed=overall, description=where)
            self._rich.refresh()
            return
        filled = int(overall * 30)
        self._stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {overall:4.0%}  {where} ")
        self._stream.flush()

    def close(self) -> None:
        """Take the bar off the terminal (also after a failure or an interrupt)."""
        if not (self._enabled and self._tty):
            return
        if self._rich is not None:
            self._rich.stop()
        else:
            self._stream.write(f"\r{' ' * 100}\r")
        if self._last[0] >= 0:
            self._stream.write(f"swept in {time.perf_counter() - self._started:.1f} s\n")
        self._stream.flush()


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The command's options for the JSON file; of --env only the names, as values may be secrets."""
    options = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    del options["handler"]
    options["env"] = [item.partition("=")[0] for item in args.env]
    return options


def _fail(message: str, status: int = 2) -> int:
    print(f"dispatcher tune: {message}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace) -> int:
    target: StdioServerParameters | str
    if args.stdio is not None:
        command = shlex.split(args.stdio)
        if not command:
            return _fail("--stdio needs a command")
        env: dict[str, str] = {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                return _fail(f"--env takes KEY=VALUE, got {item!r}")
            env[key] = value
        target = StdioServerParameters(command=command[0], args=command[1:], env=env or None)
    else:
        target = args.url
    try:
        if args.range is not None and (args.start is not None or args.stop is not None):
            return _fail("give either --range or --from/--to, not both")
        if args.range is not None:
            try:
                settings = [int(part) for part in args.range.split(",") if part.strip()]
            except ValueError:
                return _fail(f"--range takes integers separated by commas, got {args.range!r}")
        elif args.start is not None or args.stop is not None:
            settings = doubling(args.start or 1, args.stop or 64)
        else:
            settings = list(DEFAULT_SETTINGS)
        workload: list[ToolCall] | Literal["reads", "mixed"]
        if args.workload is not None:
            try:
                text = args.workload.read_text(encoding="utf-8")
            except OSError as exc:
                return _fail(f"cannot read the workload: {exc}")
            workload = load_workload(text.splitlines(), source=str(args.workload))
        else:
            workload = args.synthetic
    except ConfigurationError as exc:
        return _fail(str(exc))
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "dispatcher tune: --plot needs matplotlib (pip install 'dispatcher[plot]'); "
                "the sweep runs, but no plot will be drawn",
                file=sys.stderr,
            )
            args.plot = None
    bar = _Bar(sys.stderr, enabled=not args.quiet)
    run = functools.partial(
        tune,
        target,
        workload,
        settings,
        trusted=args.trusted,
        per_server=args.per_server,
        calls=args.calls if args.calls is not None or args.duration is not None else 200,
        duration=args.duration,
        warmup=args.warmup,
        clients=args.clients,
        call_timeout=args.call_timeout if args.call_timeout > 0 else None,
        server=args.name,
        mode=args.mode,
        connect_timeout=args.timeout if args.timeout > 0 else None,
        seed=args.seed,
        progress=bar,
    )
    try:
        report = anyio.run(run)
    except ConfigurationError as exc:
        return _fail(str(exc))
    except DispatcherError as exc:
        return _fail(str(exc), 1)
    finally:
        bar.close()
    if not _print_rich(report, sys.stdout):
        print(render_table(report))
    if args.json is not None:
        document = {
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "options": _options(args),
            **report.to_json(),
            "machine": machine_info(),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    if args.plot is not None:
        save_plot(report, args.plot)
    return 0
