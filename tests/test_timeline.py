"""`dispatcher.timeline`: what ran when and what each call waited for, from real batches on the example server."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.types import ToolAnnotations

from dispatcher import CallEvent, CallStatus, Dispatcher, RetryPolicy, ToolCall, ToolResult
from dispatcher.examples import Workspace
from dispatcher.timeline import Timeline, TimelineRow

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio
COLOURS = {
    CallStatus.OK: "#009E73",
    CallStatus.TOOL_ERROR: "#E69F00",
    CallStatus.FAILED: "#D55E00",
    CallStatus.TIMEOUT: "#CC79A7",
    CallStatus.CANCELLED: "#999999",
    CallStatus.DENIED: "#0072B2",
}
# The real backends, and trio's virtual clock where every time is exact (a busy machine can delay a start
# on a real clock by more than the 20 ms the timeline takes for the event loop's ordinary delay).
BACKENDS = pytest.mark.backends("asyncio", "trio", "trio-mockclock")

LATENCY = 0.05
# One turn: a write, three reads that must see it (the server lets two run at once), a write after them,
# and a tool the model made up.
TURN = [
    ToolCall("c1", "set_note", {"name": "plan", "text": "Tuesday"}),
    ToolCall("c2", "read_note", {"name": "plan"}),
    ToolCall("c3", "search_notes", {"query": "Tuesday"}),
    ToolCall("c4", "read_note", {"name": "plan"}),
    ToolCall("c5", "append_note", {"name": "plan", "text": "confirmed"}),
    ToolCall("c6", "delete_everything", {}),
]


async def _run_turns(*turns: list[ToolCall], **dispatcher: Any) -> tuple[list[list[ToolResult]], list[list[CallEvent]]]:
    """Each turn through a dispatcher over the bundled Workspace (2 calls at once), with its events."""
    events: list[CallEvent] = []
    results, recorded = [], []
    async with (
        Client(Workspace(latency=LATENCY).server) as client,
        Dispatcher(on_event=events.append, **dispatcher) as d,
    ):
        await d.add_mcp_server("notes", client, trusted=True, max_concurrency=2)
        for turn in turns:
            events.clear()
            results.append(await d.dispatch(turn))
            recorded.append(list(events))
    return results, recorded


def _by_id(timeline: Timeline) -> dict[str, TimelineRow]:
    return {row.call.id: row for row in timeline.rows}


@BACKENDS
async def test_events_say_what_each_call_waited_for(virtual_clock: bool) -> None:
    """From events, each wait is named: the write before it, a server's limit, the reads a write waits for."""
    _, (events,) = await _run_turns(TURN)
    rows = _by_id(Timeline.from_events(events))
    assert [row.call.id for row in Timeline.from_events(events).rows] == [call.id for call in TURN]
    assert rows["c1"].exclusive is True
    assert rows["c1"].wait is None or (not virtual_clock and rows["c1"].wait.kind == "unrecorded")
    assert rows["c2"].wait is not None and (rows["c2"].wait.kind, rows["c2"].wait.after) == ("write", ("c1",))
    assert rows["c3"].wait is not None and (rows["c3"].wait.kind, rows["c3"].wait.after) == ("write", ("c1",))
    # c4's turn came when c1 ended, but two reads already held the server's two places.
    c4 = rows["c4"].wait
    assert c4 is not None and c4.kind == "limit" and c4.after[0] == "c1" and c4.after[-1] in ("c2", "c3")
    c5 = rows["c5"].wait
    assert c5 is not None and c5.kind == "writes_alone" and c5.after == ("c4",)
    assert rows["c6"].status is CallStatus.FAILED and rows["c6"].started_at is None and rows["c6"].wait is None
    # The waits are as long as the calls ahead ran: one, two, then three calls of LATENCY.
    assert c4.seconds >= 2 * LATENCY and c5.seconds >= 3 * LATENCY
    if virtual_clock:
        waits = {call_id: row.wait for call_id, row in rows.items() if row.wait is not None}
        assert {call_id: (w.seconds, w.unexplained) for call_id, w in waits.items()} == {
            "c2": (LATENCY, 0.0),
            "c3": (LATENCY, 0.0),
            "c4": (2 * LATENCY, 0.0),
            "c5": (3 * LATENCY, 0.0),
        }


async def test_results_name_the_call_a_start_followed_and_nothing_more() -> None:
    """Results hold no classes or keys: a wait names the call whose end the start followed, as "after"."""
    (results, second), _ = await _run_turns(TURN, [ToolCall("c1", "read_note", {"name": "plan"})])
    timeline = Timeline.from_results(results, second)
    assert [(row.batch, row.call.id) for row in timeline.rows] == [(0, c.id) for c in TURN] + [(1, "c1")]
    rows = {(row.batch, row.call.id): row for row in timeline.rows}
    for call_id in ("c2", "c3", "c4", "c5"):
        wait = rows[0, call_id].wait
        assert wait is not None and wait.kind == "after" and len(wait.after) == 1
    assert rows[0, "c2"].wait.after == ("c1",)  # type: ignore[union-attr]
    assert all(row.exclusive is None and row.keys == () for row in timeline.rows)
    # The second batch started after the first had ended: it waited for nothing.
    assert rows[1, "c1"].wait is None
    assert rows[1, "c1"].queued_at >= max(result.finished_at for result in results)


@BACKENDS
async def test_text_has_an_axis_a_row_per_call_and_letters_by_status(virtual_clock: bool) -> None:
    """The text timeline: a ruler in ms, one row per call with its bar, status letter and wait, a legend."""
    (results,), (events,) = await _run_turns(TURN)
    text = Timeline.from_events(events).text(width=40, color=False)
    lines = text.splitlines()
    assert lines[0].rstrip().endswith(" ms") and lines[1].strip().startswith("|+")
    rows = lines[2:-1]
    assert [line.split()[0] for line in rows] == [call.id for call in TURN]
    bars = [re.search(r"\|(.{40})\|", line) for line in rows]
    assert all(bar is not None for bar in bars)
    c1, c2, *_, c6 = (bar.group(1) for bar in bars if bar is not None)
    assert set(c1.strip()) <= {"-", "o"} and c1.lstrip("-").startswith("o")
    if virtual_clock:
        assert c1 == "o" * 10 + " " * 30  # ran at once, first of four calls of LATENCY
    assert c2.startswith("-") and "o" in c2  # waited, then ran
    assert c6.strip().lstrip("-") == "F"  # never ran: one letter where it ended
    assert "for the write before it (c1)" in rows[1]
    assert lines[-1].strip().startswith("- waiting, o ok")
    # On a terminal the letters are coloured; never in str().
    assert "\x1b[32m" in Timeline.from_events(events).text(color=True)
    assert "\x1b[" not in str(Timeline.from_results(results))


async def test_text_separates_batches_of_a_session() -> None:
    """A timeline of several batches heads each batch's rows, on one time axis."""
    (first, second), _ = await _run_turns(TURN[:2], TURN[2:4])
    lines = Timeline.from_results(first, second).text(color=False).splitlines()
    assert lines[2] == "batch 1" and lines[5] == "batch 2"


@BACKENDS
async def test_approvals_are_waits_of_their_own(virtual_clock: bool) -> None:
    """From events, a call that started when a person approved it waited for the approval (and how long the
    person took); a refused one waited for an approval not given; results alone cannot tell the first apart."""

    async def person(request: Any) -> bool:
        await anyio.sleep(LATENCY)
        return bool(request.call.id == "ok")

    (results,), (events,) = await _run_turns(
        [ToolCall("ok", "delete_note", {"name": "a"}), ToolCall("no", "delete_note", {"name": "b"})],
        approve=person,
    )
    assert [event.kind for event in events if event.call.id == "ok"] == [
        "queued",
        "approval_asked",
        "approval_answered",
        "started",
        "finished",
    ]
    assert [event.kind for event in events if event.call.id == "no"] == [
        "queued",
        "approval_asked",
        "approval_answered",
        "finished",
    ]
    answers = [event for event in events if event.kind == "approval_answered"]
    assert sorted((event.call.id, event.error is None) for event in answers) == [("no", False), ("ok", True)]
    rows = _by_id(Timeline.from_events(events))
    ok, no = rows["ok"].wait, rows["no"].wait
    assert rows["ok"].status is CallStatus.OK and ok is not None and ok.kind == "approved"
    assert rows["no"].status is CallStatus.DENIED and no is not None and no.kind == "approval"
    for wait in (ok, no):
        assert wait.approval == pytest.approx(LATENCY) if virtual_clock else LATENCY * 0.9 <= wait.approval <= 1.0
        assert wait.seconds >= wait.approval
    assert re.fullmatch(r"waited \d+ ms for its approval, which took \d+ ms to come", ok.describe())
    assert no.describe().endswith("for an approval that was not given")
    # Results do not record the approval: the approved call's wait has no cause in them.
    from_results = _by_id(Timeline.from_results(results))
    assert from_results["ok"].wait is not None and from_results["ok"].wait.kind == "unrecorded"
    assert "does not show (an approval" in from_results["ok"].wait.describe()
    assert from_results["no"].wait is not None and from_results["no"].wait.kind == "approval"
    trace = Timeline.from_events(events).chrome_trace()["traceEvents"]
    waits = {event["name"] for event in trace if event.get("cat") == "wait"}
    assert waits == {"waiting: approved", "waiting: approval"}


@pytest.mark.backends("trio-mockclock")
async def test_an_approval_given_before_the_write_it_waits_for_ends() -> None:
    """A call approved while the write before it still runs waited for that write; the approval's share is named."""

    async def person(request: Any) -> bool:
        if request.call.id == "d":
            await anyio.sleep(LATENCY / 5)
        return True

    _, (events,) = await _run_turns(
        [ToolCall("w", "set_note", {"name": "a", "text": "1"}), ToolCall("d", "delete_note", {"name": "a"})],
        approve=person,
    )
    rows = _by_id(Timeline.from_events(events))
    assert rows["w"].wait is None  # approved at once: no wait to speak of
    wait = rows["d"].wait
    assert wait is not None and (wait.kind, wait.after) == ("write", ("w",))
    assert wait.seconds == pytest.approx(LATENCY) and wait.approval == pytest.approx(LATENCY / 5)
    assert wait.describe() == "waited 50 ms for the write before it (w), 10 ms of it for an approval"


@pytest.mark.backends("trio-mockclock")
async def test_retries_are_drawn_where_they_began() -> None:
    """From events, each retry's start is kept and marked in the text; the trace has an instant per retry."""
    events: list[CallEvent] = []
    tries = 0

    async def flaky() -> str:
        """Times out once, then answers in half a second."""
        nonlocal tries
        tries += 1
        await anyio.sleep(10 if tries == 1 else 0.5)
        return "done"

    policy = RetryPolicy(attempts=3, wait_initial=0.5, wait_max=0.5, jitter=False)
    async with Dispatcher(on_event=events.append, call_timeout=1.0, retry=policy) as d:
        d.add_function(flaky, annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
        (result,) = await d.dispatch([ToolCall("r", "flaky", {})])
    assert result.ok and result.attempts == 2
    (row,) = Timeline.from_events(events).rows
    assert row.attempts == 2 and len(row.attempt_starts) == 2
    assert row.attempt_starts[1] - row.attempt_starts[0] == pytest.approx(1.5)
    bar = re.search(r"\|(.{40})\|", Timeline.from_events(events).text(color=False).splitlines()[2])
    assert bar is not None and bar.group(1).count(":") == 1 and bar.group(1).index(":") == 30
    retries = [e for e in Timeline.from_events(events).chrome_trace()["traceEvents"] if e.get("cat") == "retry"]
    assert [(e["name"], e["ts"]) for e in retries] == [("attempt 2", 1.5e6)]


async def test_a_record_taken_mid_batch_draws_unfinished_calls() -> None:
    """Events taken while calls run give rows with no status, drawn up to the end of the record."""
    events: list[CallEvent] = []
    started = anyio.Event()

    async def slow() -> str:
        """Runs until cancelled."""
        started.set()
        await anyio.sleep_forever()
        return ""

    async with Dispatcher(on_event=events.append) as d:
        d.add_function(slow, annotations=ToolAnnotations(read_only_hint=True))
        async with d.batch() as batch:
            pending = batch.submit(ToolCall("s", "slow", {}))
            await started.wait()
            (row,) = Timeline.from_events(list(events)).rows
            pending.cancel()
    assert row.status is None and row.finished_at is None and row.started_at is not None
    assert "unfinished" in Timeline([row]).text(color=False)
    (event,) = [e for e in Timeline([row]).chrome_trace()["traceEvents"] if e["ph"] == "X" and e["cat"] != "wait"]
    assert event["cat"] == "unfinished"


def _check_trace_shape(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The Trace Event Format's JSON object form: what Perfetto and chrome://tracing need of each event."""
    assert set(trace) >= {"traceEvents"} and trace["displayTimeUnit"] in ("ms", "ns")
    events = trace["traceEvents"]
    for event in events:
        assert isinstance(event["name"], str) and event["ph"] in ("X", "i", "M")
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            assert set(event["args"]) in ({"name"}, {"sort_index"})
            continue
        assert isinstance(event["ts"], int | float) and event["ts"] >= 0
        if event["ph"] == "X":
            assert isinstance(event["dur"], int | float) and event["dur"] >= 0
        else:
            assert event["s"] in ("g", "p", "t")
    json.loads(json.dumps(trace))
    return list(events)


@BACKENDS
async def test_chrome_trace_of_a_session(virtual_clock: bool) -> None:
    """A session's trace: one process per batch, one named thread per call, run and wait spans in µs."""
    (first, second), recorded = await _run_turns(TURN, TURN[1:3])
    for timeline in (Timeline.from_results(first, second), Timeline.from_events(*recorded)):
        events = _check_trace_shape(timeline.chrome_trace())
        processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
        assert processes == {1: "batch 1", 2: "batch 2"}
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert list(threads.values()) == [row.label for row in timeline.rows]
        runs = [e for e in events if e["ph"] == "X" and e["cat"] != "wait"]
        assert len(runs) == 7  # every call that ran, in both batches
        c1 = next(e for e in runs if e["args"]["call_id"] == "c1")
        if virtual_clock:  # exact: c1 starts the session and runs its latency
            assert c1["ts"] == pytest.approx(0, abs=1) and c1["dur"] == pytest.approx(LATENCY * 1e6, abs=1)
        else:  # a loaded machine delays a start and stretches a run (seen: 98 ms for 50), never shortens one
            assert c1["ts"] < 2_000_000 and LATENCY * 1e6 * 0.9 <= c1["dur"] < LATENCY * 1e6 + 2_000_000
        waits = [e for e in events if e.get("cat") == "wait"]
        assert {e["args"]["call_id"] for e in waits} >= {"c2", "c3", "c4", "c5"}
        never = [e for e in events if e["ph"] == "i" and e["args"].get("call_id") == "c6"]
        assert [e["cat"] for e in never] == ["failed"]
        # The second batch is on the same clock, after the first (on the virtual one, at the very instant).
        second, first_end = (
            min(e["ts"] for e in runs if e["pid"] == 2),
            max(e["ts"] + e["dur"] for e in runs if e["pid"] == 1),
        )
        assert second > first_end or (virtual_clock and second == first_end)


def test_hostile_labels_cannot_reach_the_terminal_or_break_the_picture() -> None:
    """A model's call id with a terminal escape is written out; a long one is cut; `$` is escaped for the plot."""
    call = ToolCall("x\x1b[2J\x1b]0;pwned\x07" + "y" * 100, "made\nup", {})
    result = ToolResult(call, CallStatus.FAILED, error="unknown tool", queued_at=1.0, finished_at=1.0)
    text = Timeline.from_results([result]).text(color=True)
    assert "\x1b[2J" not in text and "\x07" not in text and "\n" not in text.splitlines()[2]
    assert "\\x1b[2J" in text and len(Timeline.from_results([result]).rows[0].label) == 60
    # A call waiting on it names it in its wait, written out too.
    later = ToolResult(ToolCall("b", "t", {}), CallStatus.OK, queued_at=1.0, started_at=2.0, finished_at=3.0)
    ended = ToolResult(call, CallStatus.OK, queued_at=1.0, started_at=1.0, finished_at=2.0)
    text = Timeline.from_results([ended, later]).text(color=False)
    assert "\x1b" not in text and "\x07" not in text and "until x\\x1b[2J" in text


def test_bad_input_is_a_clear_error() -> None:
    """Items of the wrong kind and a too narrow axis are refused with what to pass instead."""
    with pytest.raises(TypeError, match="from_results takes ToolResult items, got ToolCall"):
        Timeline.from_results([TURN[0]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="from_events takes CallEvent items"):
        Timeline.from_events([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="width must be >= 10"):
        Timeline([]).text(width=3)
    assert Timeline([]).text() == "(no calls)" and len(Timeline([])) == 0


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without matplotlib, plot() raises ImportError naming the `plot` extra, and imports nothing before."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "mcp-dispatcher\[plot\]"'):
        Timeline([]).plot()


# The drawing does not depend on the clock; on a real one, a loaded machine moves the bars until two calls'
# marks touch and read as one band (seen on trio beside other jobs), so it runs on the virtual clock.
@pytest.mark.backends("trio-mockclock")
async def test_plot_draws_a_row_per_call_in_status_colours(tmp_path: Path) -> None:
    """The PNG has the figure's size, a row per call, the waiting grey and the status colours in its pixels."""
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    async def person(request: Any) -> bool:
        return False

    _, (events,) = await _run_turns(TURN, approve=person)
    timeline = Timeline.from_events(events)
    # The refused writes never ran, so the reads of their note are tool errors.
    assert {row.status for row in timeline.rows} == {
        CallStatus.OK,
        CallStatus.TOOL_ERROR,
        CallStatus.DENIED,
        CallStatus.FAILED,
    }
    path = tmp_path / "batch.png"
    figure = timeline.plot(path, title="one turn")
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_yticklabels()] == [row.label for row in timeline.rows]
    pixels = imread(path)
    width, height = figure.get_size_inches() * figure.dpi
    assert pixels.shape[:2] == (round(height), round(width))

    def near(pixel: Any, hex_colour: str) -> bool:
        rgb = [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]
        return all(abs(round(float(c) * 255) - v) <= 3 for c, v in zip(pixel[:3], rgb, strict=True))

    # Inside the axes (not the legend): image rows run top-down, display coordinates bottom-up.
    box = axes.get_window_extent()
    top, bottom = round(pixels.shape[0] - box.y1), round(pixels.shape[0] - box.y0)
    left, right = round(box.x0), round(box.x1)
    inside = [line[left:right:2] for line in pixels[top:bottom]]
    wanted = {status.value: colour for status, colour in COLOURS.items()} | {"waiting": "#DDDDDD"}
    colours = {name: [any(near(p, hex_colour) for p in line) for line in inside] for name, hex_colour in wanted.items()}

    def bands(flags: list[bool]) -> int:
        return sum(1 for i, here in enumerate(flags) if here and (i == 0 or not flags[i - 1]))

    # One band of its colour per call of each status: a run's bar, or the cross of a call that never ran.
    # (Only the statuses present: antialiased grey lines pass through every grey, cancelled's included.)
    for status in {row.status for row in timeline.rows if row.status is not None}:
        assert bands(colours[status.value]) == sum(row.status is status for row in timeline.rows), status
    assert any(colours["waiting"])


def test_the_module_exports_few_names_defined_in_it() -> None:
    """`dispatcher.timeline` exports three names, sorted, each reporting the module as its home."""
    import dispatcher.timeline

    assert dispatcher.timeline.__all__ == ["Timeline", "TimelineRow", "Wait"]
    for name in dispatcher.timeline.__all__:
        assert getattr(dispatcher.timeline, name).__module__ == "dispatcher.timeline"


def test_a_batch_that_took_no_time_is_drawn() -> None:
    """Calls that start and end at the same instant still get their letter, on an axis of 1 ms."""
    calls = [ToolCall(f"c{i}", "t", {}) for i in range(3)]
    results = [
        ToolResult(call, CallStatus.OK, queued_at=5.0, started_at=5.0, finished_at=5.0, attempts=1) for call in calls
    ]
    lines = Timeline.from_results(results).text(color=False).splitlines()
    assert lines[0].split() == ["0", "0.5", "1", "ms"]  # an axis of 1 ms
    assert [line.split("|")[1].strip() for line in lines[2:5]] == ["o", "o", "o"]
    assert all(row.wait is None for row in Timeline.from_results(results).rows)
    trace = _check_trace_shape(Timeline.from_results(results).chrome_trace())
    assert {event["dur"] for event in trace if event["ph"] == "X"} == {0.0}


class _Recorder:
    """Stands in for a matplotlib object: records every call made on it (and on what they return)."""

    def __init__(self, log: list[tuple[str, tuple[Any, ...], dict[str, Any]]], name: str = "") -> None:
        self._log, self._name = log, name

    def __getattr__(self, attribute: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> _Recorder:
            self._log.append((attribute, args, kwargs))
            return _Recorder(self._log, attribute)

        return call


async def test_plot_draws_what_the_rows_say_whatever_the_renderer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without matplotlib to render, the drawing instructions still match the rows: bars, colours, marks, arrows.

    The pixel test above checks the rendered picture where the `plot` extra is installed; this one checks,
    everywhere, what plot() asks matplotlib to draw, through a recording stand-in for its two classes.
    """
    import types

    log: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    figure_module = types.ModuleType("matplotlib.figure")
    figure_module.Figure = lambda **kwargs: _Recorder(log, "figure")  # type: ignore[attr-defined]
    patches = types.ModuleType("matplotlib.patches")
    patches.Patch = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))
    monkeypatch.setitem(sys.modules, "matplotlib.figure", figure_module)
    monkeypatch.setitem(sys.modules, "matplotlib.patches", patches)

    async def person(request: Any) -> bool:
        return False

    _, (events,) = await _run_turns(TURN, approve=person)
    timeline = Timeline.from_events(events)
    timeline.plot("unused.png", title="one turn")
    bars = [(args, kwargs["facecolors"]) for name, args, kwargs in log if name == "broken_barh"]
    ran = [row for row in timeline.rows if row.started_at is not None]
    runs = [(args[1][0] + 0.4, colour) for args, colour in bars if args[1][1] == 0.8]
    # One bar per call that ran, in its status's colour (the reads of a note never written are tool errors).
    assert runs == [(float(timeline.rows.index(row)), COLOURS[row.status]) for row in ran]  # type: ignore[index]
    assert {row.status for row in ran} == {CallStatus.OK, CallStatus.TOOL_ERROR}
    waits = [args[1][0] + 0.3 for args, colour in bars if colour == "#DDDDDD"]
    began = [row.started_at if row.started_at is not None else row.finished_at for row in timeline.rows]
    assert waits == [float(i) for i, row in enumerate(timeline.rows) if (began[i] or 0.0) > row.queued_at]
    marks = [(args[1][0], kwargs["color"]) for name, args, kwargs in log if name == "plot" and kwargs.get("marker")]
    never = [(float(i), row.status) for i, row in enumerate(timeline.rows) if row.started_at is None]
    assert marks == [(y, COLOURS[status]) for y, status in never]  # type: ignore[index]
    arrows = [kwargs for name, _, kwargs in log if name == "annotate"]
    assert len(arrows) == sum(1 for row in timeline.rows if row.wait is not None and row.wait.after)
    (ticks,) = [args for name, args, _ in log if name == "set_yticks"]
    assert list(ticks[1]) == [row.label for row in timeline.rows]
    assert ("savefig", ("unused.png",), {}) in log


async def test_a_wait_on_another_agents_write_is_named_when_both_are_recorded() -> None:
    """Two agents dispatching at once on one dispatcher: a read of one waits for the other's write, and says so."""
    events: list[CallEvent] = []
    results: dict[str, list[ToolResult]] = {}
    write_started = anyio.Event()

    def record(event: CallEvent) -> None:
        events.append(event)
        if event.kind == "started" and event.call.id == "a1":
            write_started.set()

    async with (
        Client(Workspace(latency=LATENCY).server) as client,
        Dispatcher(on_event=record) as d,
    ):
        await d.add_mcp_server("notes", client, trusted=True)

        async def agent(name: str, calls: list[ToolCall]) -> None:
            results[name] = await d.dispatch(calls)

        async with anyio.create_task_group() as group:
            group.start_soon(agent, "a", [ToolCall("a1", "set_note", {"name": "plan", "text": "Tuesday"})])
            await write_started.wait()
            group.start_soon(agent, "b", [ToolCall("b1", "read_note", {"name": "plan"})])
    both = _by_id(Timeline.from_events(events))
    wait = both["b1"].wait
    assert wait is not None and (wait.kind, wait.after) == ("write", ("a1",))
    # Given only its own batch, the read's wait has no recorded cause: the other agent's write is not in it.
    alone = Timeline.from_results(results["b"]).rows[0].wait
    assert alone is None or alone.kind == "unrecorded"
    assert Timeline.from_results(results["a"], results["b"]).rows[1].wait.after == ("a1",)  # type: ignore[union-attr]


@BACKENDS
async def test_a_call_fail_fast_did_not_run_names_the_call_it_depended_on() -> None:
    """depends_on in the rows, the text, the picture (a dashed arrow from its end) and the Chrome trace."""
    workspace = Workspace(latency=LATENCY)
    events: list[CallEvent] = []
    async with Dispatcher(fail_fast=True, on_event=events.append) as d:
        await d.connect("notes", workspace.server, trusted=True)
        results = await d.dispatch(
            [
                ToolCall("w0", "set_note", {"name": "plan", "text": "Tuesday"}),
                ToolCall("w1", "create_note", {"name": "plan", "text": "again"}),  # fails: it exists
                ToolCall("w2", "set_note", {"name": "plan", "text": "after"}),
            ]
        )
    assert results[1].status is CallStatus.TOOL_ERROR and results[2].depends_on == "w1", results
    for timeline in (Timeline.from_results(results), Timeline.from_events(events)):
        rows = _by_id(timeline)
        assert (rows["w1"].depends_on, rows["w2"].depends_on) == (None, "w1")
        line = next(line for line in timeline.text(color=False).splitlines() if line.startswith("w2 "))
        assert "not run: it depended on w1, which did not succeed" in line, line
        trace = timeline.chrome_trace()["traceEvents"]
        w2 = [e for e in trace if e.get("args", {}).get("call_id") == "w2" and e["ph"] != "M"]
        assert w2 and all(e["args"]["depends_on"] == "w1" for e in w2), w2
        assert all("depends_on" not in e.get("args", {}) for e in trace if e.get("args", {}).get("call_id") == "w1")
    if importlib.util.find_spec("matplotlib") is not None:
        from matplotlib.text import Annotation

        figure = Timeline.from_results(results).plot()
        arrows = [a for a in figure.axes[0].texts if isinstance(a, Annotation) and a.arrow_patch is not None]
        dashed = [a for a in arrows if a.arrow_patch is not None and a.arrow_patch.get_linestyle() == "--"]
        assert len(dashed) == 1 and (dashed[0].xyann[1], dashed[0].xy[1]) == (1, 2), arrows  # w1's row to w2's
