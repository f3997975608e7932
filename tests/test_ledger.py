"""tests/ledger.py, the one reader of the workspace's ledger file: what it parses, and the overlaps it sees."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from dispatcher.examples import Workspace
from dispatcher.examples.workspace import _LedgerFile

from .ledger import Ledger, concurrent, overlaps, peak

if TYPE_CHECKING:
    import pathlib

pytestmark = pytest.mark.anyio


def write(path: pathlib.Path, *records: dict[str, Any], cut: str = "") -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records) + cut)


def start(pid: int, seq: int, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"event": "start", "pid": pid, "seq": seq, "tool": tool, "arguments": arguments or None}


def end(pid: int, seq: int, outcome: str = "ok") -> dict[str, Any]:
    return {"event": "end", "pid": pid, "seq": seq, "outcome": outcome}


def test_entries_pair_starts_with_ends_and_skip_a_line_cut_by_a_kill(tmp_path: pathlib.Path) -> None:
    """Each call is one entry with its outcome and the lines that opened and closed it; a torn last line is skipped."""
    path = tmp_path / "ledger.jsonl"
    assert Ledger(path).entries() == []
    write(path, start(1, 0, "read", name="a"), start(1, 1, "write"), end(1, 0), cut='{"event": "end", "pid": 1')
    first, second = Ledger(path).entries()
    assert (first.tool, first.arguments, first.outcome, first.start, first.end) == ("read", {"name": "a"}, "ok", 0, 2)
    assert (second.tool, second.arguments, second.outcome, second.end) == ("write", {}, None, None)
    assert Ledger(path).tools() == ["read", "write"]
    assert Ledger(path).running() == [second]


def test_overlaps_and_peak_count_what_ran_at_once(tmp_path: pathlib.Path) -> None:
    """Two reads overlap each other (peak 2, no exclusive overlap); a write started under a read is one overlap."""
    path = tmp_path / "ledger.jsonl"
    write(path, start(1, 0, "read"), start(1, 1, "read"), end(1, 0), end(1, 1), start(1, 2, "write"), end(1, 2))
    entries = Ledger(path).entries()
    assert peak(entries) == 2
    assert overlaps(entries, lambda entry: entry.tool == "write") == 0
    write(path, start(1, 0, "read"), start(1, 1, "write"), end(1, 1), end(1, 0), start(1, 2, "read"), end(1, 2))
    entries = Ledger(path).entries()
    assert overlaps(entries, lambda entry: entry.tool == "write") == 1, "the oracle misses a write under a read"
    assert [len(running) for _, running in concurrent(entries)] == [0, 1, 0]
    assert peak([]) == 0


def test_a_call_of_a_dead_process_ends_when_the_next_process_starts_one(tmp_path: pathlib.Path) -> None:
    """A process killed mid-call never writes the end line: its calls overlap nothing of the process after it."""
    path = tmp_path / "ledger.jsonl"
    write(path, start(1, 0, "write"), start(2, 0, "write"), start(2, 1, "read"), end(2, 1), end(2, 0))
    entries = Ledger(path).entries()
    assert [(entry.pid, len(running)) for entry, running in concurrent(entries)] == [(1, 0), (2, 0), (2, 1)]
    assert peak(entries) == 2


async def test_the_reader_reads_what_the_workspace_writes(tmp_path: pathlib.Path) -> None:
    """The workspace's own ledger middleware, run on a real call, writes what the reader parses."""
    from mcp import Client

    path = tmp_path / "ledger.jsonl"
    workspace = Workspace()
    workspace.server.middleware.append(_LedgerFile(path))
    async with Client(workspace.server) as client:
        await client.call_tool("set_note", {"name": "a", "text": "x"})
        await client.call_tool("read_note", {"name": "missing"})
    entries = Ledger(path).entries()
    assert [(entry.tool, entry.outcome) for entry in entries] == [("set_note", "ok"), ("read_note", "tool_error")]
    assert entries[0].arguments == {"name": "a", "text": "x"}
    assert Ledger(path).running() == []
