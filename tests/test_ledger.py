"""tests/ledger.py: the one reader of the workspace's ledger file, against the file the workspace writes."""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client

from dispatcher.examples import Workspace
from dispatcher.examples.workspace import _LedgerFile

from .ledger import Entry, Ledger

if TYPE_CHECKING:
    import pathlib

pytestmark = pytest.mark.anyio


def write(path: pathlib.Path, *records: dict[str, Any], torn: str = "") -> None:
    """Append ledger lines as a workspace process writes them, and optionally a line cut short by a kill."""
    with path.open("a") as file:
        for record in records:
            file.write(json.dumps({"at": 0.0, **record}) + "\n")
        file.write(torn)


def start(pid: int, seq: int, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"event": "start", "pid": pid, "seq": seq, "tool": tool, "arguments": arguments}


def end(pid: int, seq: int, outcome: str = "ok") -> dict[str, Any]:
    return {"event": "end", "pid": pid, "seq": seq, "outcome": outcome}


def test_a_missing_ledger_has_no_calls(tmp_path: pathlib.Path) -> None:
    """Before a server has started a call there is no file: no entries, nothing running, a peak of 0."""
    ledger = Ledger(tmp_path / "none.jsonl")
    assert (ledger.entries(), ledger.tools(), ledger.running(), ledger.overlaps(), ledger.peak()) == ([], [], [], [], 0)


def test_entries_are_keyed_by_process_and_sequence(tmp_path: pathlib.Path) -> None:
    """Two processes sharing a file both count from seq 0: their calls stay apart, ends find their starts."""
    path = tmp_path / "ledger.jsonl"
    write(
        path,
        start(10, 0, "read_note", name="a"),
        start(20, 0, "set_note", name="b"),
        end(20, 0),
        end(10, 0, "cancelled"),
    )
    first, second = Ledger(path).entries()
    assert (first.key, first.tool, first.arguments, first.outcome, first.start, first.end) == (
        (10, 0), "read_note", {"name": "a"}, "cancelled", 0, 3
    )  # fmt: skip
    assert (second.key, second.outcome, second.start, second.end) == ((20, 0), "ok", 1, 2)
    assert Ledger(path).tools() == ["read_note", "set_note"]
    assert first.overlaps(second) and second.overlaps(first) and not first.overlaps(first)


def test_a_line_cut_short_by_a_kill_is_skipped_and_its_call_runs_on(tmp_path: pathlib.Path) -> None:
    """A killed process's half-written end line is not read; its call has no end and counts as running."""
    path = tmp_path / "ledger.jsonl"
    write(
        path, start(1, 0, "append_note", name="log"), start(1, 1, "read_note"), end(1, 1), torn='{"event": "end", "pi'
    )
    ledger = Ledger(path)
    assert [entry.key for entry in ledger.running()] == [(1, 0)]
    assert ledger.running(lambda entry: entry.tool == "read_note") == []
    (pair,) = ledger.overlaps()
    assert [entry.key for entry in pair] == [(1, 0), (1, 1)]


def test_overlaps_and_peak_against_a_brute_force_count(tmp_path: pathlib.Path) -> None:
    """On every interleaving of three calls' starts and ends, `overlaps` and `peak` agree with counting
    the calls running at each line."""
    events = [("s", 0), ("e", 0), ("s", 1), ("e", 1), ("s", 2), ("e", 2)]
    seen: set[int] = set()
    for order in itertools.permutations(events):
        if any(order.index(("s", n)) > order.index(("e", n)) for n in range(3)):
            continue
        path = tmp_path / f"{len(seen)}.jsonl"
        write(
            path,
            *(start(1, n, "set_note" if n == 0 else "read_note") if kind == "s" else end(1, n) for kind, n in order),
        )
        ledger = Ledger(path)
        running: set[int] = set()
        peak = 0
        pairs: set[tuple[int, int]] = set()
        writes: set[tuple[int, int]] = set()
        for kind, n in order:
            if kind == "s":
                pairs |= {(other, n) for other in running}
                writes |= {(other, n) for other in running if 0 in (other, n)}
                running.add(n)
                peak = max(peak, len(running))
            else:
                running.discard(n)
        assert ledger.peak() == peak, order
        assert {(a.seq, b.seq) for a, b in ledger.overlaps()} == pairs, order
        assert {(a.seq, b.seq) for a, b in ledger.overlaps(lambda a, b: "set_note" in (a.tool, b.tool))} == writes
        seen.add(peak)
    assert seen == {1, 2, 3}


def test_effective_leaves_out_the_fenced_calls(tmp_path: pathlib.Path) -> None:
    """A write the fenced workspace refused changed nothing: with effective=True it overlaps nothing."""
    path = tmp_path / "ledger.jsonl"
    write(path, start(1, 0, "set_note"), start(1, 1, "set_note"), end(1, 1, "fenced"), end(1, 0))
    ledger = Ledger(path)
    assert (ledger.peak(), len(ledger.overlaps())) == (2, 1)
    assert (ledger.peak(effective=True), ledger.overlaps(effective=True)) == (1, [])


@pytest.mark.backends("trio-mockclock")
async def test_the_reader_agrees_with_the_workspace_that_wrote_the_file(tmp_path: pathlib.Path) -> None:
    """The workspace's own ledger middleware writes the file; the reader finds the calls, their outcomes
    and which overlapped as the workspace's in-memory ledger does, and `wait_for` sees calls as they start."""
    path = tmp_path / "ledger.jsonl"
    workspace = Workspace(latency=1.0)
    workspace.server.middleware.append(_LedgerFile(path))
    ledger = Ledger(path)
    async with Client(workspace.server) as client, anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(client.call_tool, "search_notes", {"query": str(i)})
        third = await ledger.wait_for(3)
        assert len(ledger.running()) == 3 and third.end is None
        await anyio.sleep(2)
        await client.call_tool("read_note", {"name": "missing"})
    entries = ledger.entries()
    memory = workspace.ledger
    assert [(e.seq, e.tool, e.outcome) for e in entries] == [(m.seq, m.tool, m.outcome) for m in memory]
    for a, b in itertools.combinations(range(len(entries)), 2):
        assert entries[a].overlaps(entries[b]) == memory[a].overlaps(memory[b]), (a, b)
    assert ledger.peak() == workspace.max_in_flight == 3
    assert ledger.running() == []
    with pytest.raises(TimeoutError):
        await ledger.wait_for(5, within=1.0)
    assert isinstance(await ledger.wait_for(1, where=lambda e: e.tool == "read_note"), Entry)
