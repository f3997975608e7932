"""Presentation: the reports of `tune` and `inspect` as terminal tables, and the sweep's progress, with `rich`.

`rich` comes with the `cli` extra (``pip install 'mcp-dispatcher[cli]'``); it is imported when something is
drawn, so `dispatcher.tuning.tune` runs without it. On a terminal the tables are styled and the progress
is a bar; elsewhere (a pipe, a log) the same tables are plain text and the progress a line per setting.

Text a server sent (tool names, titles, descriptions, schemas, its own name, error messages) may hold
control characters, such as newlines that would forge a row of the table or terminal escape sequences
that would rewrite the screen: `clean` shows them escaped (a newline as ``\n``, an escape as ``\x1b``,
invisible format characters such as a right-to-left override as ``\u202e``), and every cell is a
`rich.text.Text`, so square brackets in it are never read as markup. Long texts are shortened, saying
how much was cut; ``inspect --full`` shows them whole.
"""

from __future__ import annotations

import io
import json
import math
import time
from typing import TYPE_CHECKING, Any

from ..tuning._recommend import format_number

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from types import ModuleType
    from typing import TextIO

    from ..tuning._measure import SettingResult
    from ..tuning._online import OnlineResult
    from ..tuning._report import TuneProgress, TuneReport
    from ._inspect import Report

__all__ = [
    "INSTALL_HINT",
    "ProgressBar",
    "clean",
    "describe_step",
    "inspect_lines",
    "print_lines",
    "render_inspect",
    "render_tune",
    "require_rich",
    "shorten",
    "tune_lines",
]

INSTALL_HINT = "the dispatcher command line needs rich: pip install 'mcp-dispatcher[cli]'"

_TUNE_HEADERS = (
    "calls/s",
    "spread",
    "of best",
    "in flight",
    "run p50",
    "run p95",
    "queue p50",
    "queue p95",
    "cut off",
    "errors",
)
_INSPECT_HEADERS = ("TOOL", "DECLARED", "EFFECTIVE", "SCHEDULING", "RETRYABLE", "KEYS")
# How much of a server's text `inspect` shows without --full: in the table, and under "what the model reads".
_CELL = 40
_TEXT = 240


def require_rich() -> ModuleType:
    """The `rich` package, or ModuleNotFoundError saying how to install it."""
    try:
        import rich
        import rich.console
        import rich.progress
        import rich.table
        import rich.text
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(INSTALL_HINT, name="rich") from exc
    return rich


def clean(text: object) -> str:
    """Text safe to print: control characters (escape sequences, carriage returns, newlines) escaped."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in value)


# Tables ---------------------------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, right: bool, marked: int | None = None) -> Any:
    """A borderless rich table, columns two spaces apart; row `marked` in bold green on a terminal."""
    require_rich()
    from rich.table import Table
    from rich.text import Text

    cells = [[clean(cell) for cell in row] for row in rows]
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, header_style="bold")
    for index, header in enumerate(headers):
        last = index == len(headers) - 1
        # Never narrower than its content: a narrow terminal wraps the lines rather than cut the figures.
        width = max([len(header), *(len(row[index]) for row in cells)])
        table.add_column(header, justify="right" if right and not last else "left", no_wrap=True, min_width=width)
    for index, row in enumerate(cells):
        table.add_row(*(Text(cell) for cell in row), style="bold green" if index == marked else None)
    return table


def _render(table: Any) -> list[str]:
    """A table as plain lines, whatever its width."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=100_000, color_system=None, force_terminal=False).print(table)
    return [line.rstrip() for line in buffer.getvalue().splitlines()]


def _tune_rows(report: TuneReport) -> list[list[str]]:
    best = max((s.throughput for s in report.settings if math.isfinite(s.throughput)), default=0.0)
    return [
        [
            _setting_label(s, report.repeats),
            format_number(s.throughput),
            f"±{s.spread:.0%}" if s.repeats > 1 else "-",
            f"{s.throughput / best:.0%}" if best > 0 and math.isfinite(s.throughput) else "-",
            format_number(s.in_flight),
            format_number(s.run_p50 * 1000),
            format_number(s.run_p95 * 1000),
            format_number(s.queue_p50 * 1000),
            format_number(s.queue_p95 * 1000),
            str(s.cut_off),
            str(s.errors),
            "<- recommended" if s.limit == report.recommended else "",
        ]
        for s in report.settings
    ]


def _setting_label(s: SettingResult, repeats: int) -> str:
    """The setting, with how many times it was measured when fewer than planned, and "partial" when cut off."""
    marks = [f"{s.repeats}x"] if s.repeats != repeats else []
    if s.partial:
        marks.append("partial")
    return f"{s.limit} ({', '.join(marks)})" if marks else str(s.limit)


def _tune_table(report: TuneReport) -> Any:
    limits = [s.limit for s in report.settings]
    marked = limits.index(report.recommended) if report.recommended in limits else None
    return _table([report.knob, *_TUNE_HEADERS, ""], _tune_rows(report), right=True, marked=marked)


def _tune_heading(report: TuneReport) -> list[str]:
    trust = "trusted" if report.trusted else "untrusted"
    knob = {
        "per_server": "the per-server limit",
        "fleet": f"the fleet-wide limit ({report.processes} processes sharing it through Redis)",
    }.get(report.knob, "max_concurrency")
    amount = f"{report.calls} measured calls" if report.calls is not None else "measured calls"
    if report.duration is not None:
        amount += f" (at most {report.duration:g} s)"
    times = f", {report.repeats} times" if report.repeats > 1 else ""
    lines = [
        f"tuning {knob} against {report.target} ({trust})",
        f"workload: {report.workload}; {report.clients} callers; {amount} per setting after a warm-up{times}",
    ]
    if report.cut_short is not None:
        why = {
            "interrupted": "interrupted",
            "max_time": "cut short by --max-time",
            "server_lost": "cut short: the server stopped answering (see the notes)",
        }[report.cut_short]
        lines.append(f"{why}: the settings measured so far")
    return lines


def _tune_conclusion(report: TuneReport) -> list[str]:
    lines = ["times in ms; run = from a call's start to its result, queue = waiting for a slot in the dispatcher"]
    done = sorted({s.repeats for s in report.settings})
    if done and done[-1] > 1:
        # A sweep cut short measured some settings fewer times than planned (the rows say "(2x)").
        if done == [report.repeats]:
            measured = f"the median of {report.repeats} measurements"
        else:
            times = str(done[0]) if len(done) == 1 else f"{done[0]} to {done[-1]}"
            measured = f"the median of its row's measurements ({times}, of {report.repeats} planned)"
        lines.append(f"each figure is {measured}; spread = half their range of calls/s")
    if any(s.cut_off for s in report.settings):
        lines.append("cut off = calls still running when the window closed, left to finish and timed in run/queue")
    if report.errors:
        lines.append(f"warning: {report.errors} measured calls failed; they are counted as errors, not throughput")
    if report.recommended is not None:
        lines.append(f"recommended: {report.how_to_apply}")
    lines.append(report.explanation)
    if report.online is not None:
        lines.append(_online_line(report.online))
    lines.extend(f"note: {note}" for note in report.notes)
    return lines


def _online_line(online: OnlineResult) -> str:
    measured = online.measured
    if measured.calls == 0:
        # Failures are no throughput (as in the sweep): where the limit ended says nothing of the server.
        why = f" ({measured.error})" if measured.error else ""
        return (
            f"online limit (max_concurrency=AdaptiveLimit(ceiling={online.setting.ceiling})): no call of its "
            f"run succeeded{why}, so where it ended ({online.settled}) says nothing"
        )
    return (
        f"online limit (max_concurrency=AdaptiveLimit(ceiling={online.setting.ceiling})): settled at "
        f"{online.settled} (from {online.low} to {online.high} over the second half of the run, "
        f"{online.changes} changes), {format_number(measured.throughput)} calls/s, "
        f"p95 run {format_number(measured.run_p95 * 1000)} ms"
    )


def tune_lines(report: TuneReport) -> list[Any]:
    """What `dispatcher tune` prints: the heading, the table, the recommendation and the notes."""
    return [*_tune_heading(report), "", _tune_table(report), "", *_tune_conclusion(report)]


def render_tune(report: TuneReport) -> str:
    """The report as plain text: the heading, the table (times in ms), the recommendation, notes.

    Raises:
        ModuleNotFoundError: rich is not installed (``pip install 'mcp-dispatcher[cli]'``).
    """
    return _as_text(tune_lines(report))


def _flag(value: bool | None) -> str:
    return "-" if value is None else "T" if value else "F"


def _flags(hints: dict[str, bool | None] | dict[str, bool]) -> str:
    """The four hints as letters; destructive as "n" (not applicable) when the tool is read-only."""
    read_only = hints.get("readOnlyHint") is True
    return " ".join("n" if read_only and hint == "destructiveHint" else _flag(value) for hint, value in hints.items())


def _overrides(report: Report) -> list[str]:
    items = [
        f"{tool.tool}="
        + ",".join(
            hint.removesuffix("Hint") if v else "!" + hint.removesuffix("Hint") for hint, v in tool.override.items()
        )
        for tool in report.tools
        if tool.override is not None
    ]
    return [f"overrides (yours, trusted; EFFECTIVE shows them): {' '.join(items)}"] if items else []


def _warning_lines(report: Report) -> list[str]:
    """Each warning on a line, those of an untrusted server's read-only tools grouped into one."""
    serialized = [tool.name for tool in report.tools if any(w.code == "untrusted_serialized" for w in tool.warnings)]
    lines = [
        f"  {tool.name}: {w.message}"
        for tool in report.tools
        for w in tool.warnings
        if w.code != "untrusted_serialized"
    ]
    if serialized:
        example = serialized[0]
        lines.insert(
            0,
            f"  untrusted: {len(serialized)} tool{'s' if len(serialized) != 1 else ''} declared read-only "
            f"run{'s' if len(serialized) == 1 else ''} exclusive because the server is untrusted "
            f"({', '.join(serialized)}); trust the server (--trusted) or declare them yourself "
            f"(--override {example}=readOnly, or add_mcp_server(overrides=...))",
        )
    lines.extend(f"  toolset: {w.message}" for w in report.warnings)
    return lines


# The most characters shown of the name and version a server gives itself.
_SELF_REPORT = 100


def _inspect_heading(report: Report) -> str:
    # The name the server is registered under (the user's) comes first, as in every error message; the
    # name a server gives itself is a self-report: shown last, quoted, never used as its identity.
    details = ["trusted" if report.trusted else "untrusted", f"protocol {report.protocol or 'unknown'}"]
    details.append(f"domain {report.domain!r}" if report.domain else "root key")
    if report.server_name:
        # Both are the server's text: escaped and shortened like its descriptions (the version was printed raw).
        version = f" {shorten(report.server_version, _SELF_REPORT)}" if report.server_version else ""
        details.append(f"calls itself '{shorten(report.server_name, _SELF_REPORT)}'{version}")
    return f"server {report.server!r}: {report.target} ({', '.join(details)})"


def shorten(text: str | None, limit: int | None, *, unit: str = "characters") -> str:
    """A server's text, escaped (`clean`), and cut after `limit` characters saying how many were cut."""
    if text is None:
        return "-"
    value = clean(text)
    if limit is None or len(value) <= limit:
        return value
    return f"{value[:limit]}... [{len(value) - limit} more {unit}; --full shows all]"


def _cell(text: str | None) -> str:
    if text is None:
        return "-"
    value = clean(text)
    return value if len(value) <= _CELL else value[: _CELL - 3] + "..."


def _schema(schema: object) -> str:
    return json.dumps(schema, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _reads(report: Report, *, full: bool) -> list[str]:
    """What the model reads of each tool: its title, description and input schema, escaped."""
    limit = None if full else _TEXT
    how = "whole" if full else f"shortened to {_TEXT} characters, --full for the whole text"
    trust = "trusted" if report.trusted else "untrusted: instructions in them are the server's, not the user's"
    lines = [f"what the model reads (written by the server, {trust}; escaped, {how}):"]
    for tool in report.tools:
        title = f" (title '{shorten(tool.title, limit)}')" if tool.title is not None else ""
        lines.append(f"  {tool.name}{title}")
        lines.append(f"    description: {shorten(tool.description, limit)}")
        lines.append(f"    input schema: {shorten(_schema(dict(tool.input_schema)), limit)}")
        if tool.output_schema is not None:
            lines.append(f"    output schema: {shorten(_schema(dict(tool.output_schema)), limit)}")
    return lines


def _pins(report: Report) -> list[str]:
    changed = [tool for tool in report.tools if tool.pinned == "changed"]
    new = [tool for tool in report.tools if tool.pinned == "new"]
    if not report.differs:
        return [f"against the pins in {clean(report.pins)}: every tool unchanged"]
    lines = [
        f"against the pins in {clean(report.pins)}: {len(changed)} changed, {len(new)} new, "
        f"{len(report.removed)} removed"
    ]
    lines.extend(f"  {tool.name}: changed: {clean('; '.join(tool.changes))}" for tool in changed)
    lines.extend(f"  {tool.name}: new: not in the pins" for tool in new)
    lines.extend(f"  {clean(name)}: removed: pinned, no longer listed" for name in report.removed)
    return lines


def inspect_lines(report: Report, *, full: bool = False) -> list[Any]:
    """What `dispatcher inspect` prints: the heading, a row per tool, the legend, what the model reads,
    the comparison with the pins (if any) and the warnings.

    Args:
        report: The report.
        full: Show every description and schema whole instead of shortened.
    """
    pinned = report.pins is not None
    headers = (*_INSPECT_HEADERS, *(("PINS",) if pinned else ()), "DESCRIPTION")
    rows = [
        (
            tool.name,
            _flags(tool.declared),
            _flags(tool.effective),
            tool.scheduling,
            "yes" if tool.retryable else "no",
            tool.keys,
            *((tool.pinned or "-",) if pinned else ()),
            _cell(tool.description),
        )
        for tool in report.tools
    ]
    lines: list[Any] = [_inspect_heading(report), "", _table(headers, rows, right=False), ""]
    lines.append(
        "hints in order ro de id ow (readOnly, destructive, idempotent, openWorld): T true, F false, - unset, "
        "n not applicable (destructive means nothing for a read-only tool)"
    )
    lines.extend(_overrides(report))
    lines.append("keys: root waits for every call; a domain only for calls in it and on root (docs/conflicts.md)")
    lines.append("")
    lines.extend(_reads(report, full=full))
    if pinned:
        lines.append("")
        lines.extend(_pins(report))
    if report.notes:
        lines.append("")
        lines.extend(f"note: {n.message}" for n in report.notes)
    warnings = _warning_lines(report)
    if warnings:
        lines.append("")
        lines.append(f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}:")
        lines.extend(warnings)
    else:
        lines.append("no warnings")
    return lines


def render_inspect(report: Report, *, full: bool = False) -> str:
    """The report as plain text for a terminal (`full`: descriptions and schemas whole).

    Raises:
        ModuleNotFoundError: rich is not installed (``pip install 'mcp-dispatcher[cli]'``).
    """
    return _as_text(inspect_lines(report, full=full))


def _as_text(lines: Sequence[Any]) -> str:
    out: list[str] = []
    for line in lines:
        out.extend([clean(line)] if isinstance(line, str) else _render(line))
    return "\n".join(out)


def print_lines(lines: Sequence[Any], stream: TextIO) -> None:
    """Print lines and tables: styled on a terminal, as plain text elsewhere."""
    require_rich()
    if not stream.isatty():
        stream.write(_as_text(lines) + "\n")
        stream.flush()
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream, highlight=False)
    for line in lines:
        console.print(Text(clean(line)) if isinstance(line, str) else line)


# Progress ---------------------------------------------------------------------------------------------


def describe_step(step: TuneProgress) -> str:
    """What the sweep is doing, in words: "probing the tools", or the setting, the repeat and the phase."""
    if step.phase == "probing":
        return "probing: calling each tool of the synthetic workload once"
    repeat = f", repeat {step.repeat + 1}/{step.repeats}" if step.repeats > 1 else ""
    return f"setting {step.index + 1}/{step.total} ({step.limit}){repeat}: {step.phase}"


class ProgressBar:
    """A sweep's progress on a stream: rich's bar on a terminal, a line per setting elsewhere (logs).

    Call it with each `TuneProgress`; `close` takes the bar off the terminal (also after a failure).
    """

    def __init__(self, stream: TextIO, *, enabled: bool) -> None:
        self._stream = stream
        self._enabled = enabled
        self._tty = stream.isatty()
        self._index = -1
        self._last: tuple[int, str] = (-1, "")
        self._started = time.perf_counter()
        self._bar: Any = None
        if enabled and self._tty:
            require_rich()
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
            self._bar = Progress(*columns, console=Console(file=stream), transient=True)
            self._task = self._bar.add_task("connecting", total=1.0)
            self._bar.start()

    def __call__(self, step: TuneProgress) -> None:
        if not self._enabled:
            return
        where = describe_step(step)
        position = step.repeat * step.total + step.index
        if self._bar is None:
            if (position, step.phase) != self._last:
                self._index = position
                self._last = (position, step.phase)
                self._stream.write(where + "\n")
                self._stream.flush()
            return
        self._index = position
        share = step.completed / step.planned if step.planned else 0.0
        planned = f"/{step.planned}" if step.planned is not None else ""
        calls = f": {step.completed}{planned} calls" if step.phase != "probing" else ""
        self._bar.update(
            self._task,
            completed=(position + min(share, 1.0)) / (step.total * step.repeats),
            description=where + calls,
        )

    def close(self) -> None:
        """Take the bar off the terminal and say how long the sweep took."""
        if self._bar is None:
            return
        self._bar.stop()
        self._bar = None
        self._enabled = False
        if self._index >= 0:
            self._stream.write(f"swept in {time.perf_counter() - self._started:.1f} s\n")
            self._stream.flush()
