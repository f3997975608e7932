"""The ledger file a workspace process writes (``python -m dispatcher.examples.workspace --ledger PATH``), read back.

The workspace appends a JSON line as each tool call starts and as it ends (``dispatcher/examples/workspace.py``,
``_LedgerFile``), unbuffered, so a killed process leaves every line it wrote and successive processes (a
restart) may share a file. This is the one reader of that file in the tests: what the server really ran,
in which order and with what overlap, as the oracle of tests that must not trust the client's own account.

Line numbers order the events: ``entry.start`` and ``entry.end`` are the numbers of the lines that opened and
closed a call. A file is only ever shared by processes that run one after another, so a call of a process
that died is taken to have ended when a later process starts one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable, Iterable, Iterator


@dataclass
class LedgerEntry:
    """One tool call a workspace process recorded: its start, and its end unless it is still running."""

    pid: int
    seq: int
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    outcome: str | None = None
    """``ok``, ``tool_error``, ``error``, ``cancelled`` or ``fenced``; None while it runs (or if its process died)."""
    start: int = 0
    end: int | None = None


class Ledger:
    """The ledger file at `path` (which need not exist yet), read afresh by each method."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def entries(self) -> list[LedgerEntry]:
        """Every recorded call in the order the calls started (a line cut short by a kill is skipped)."""
        if not self.path.exists():
            return []
        entries: dict[tuple[int, int], LedgerEntry] = {}
        for number, line in enumerate(self.path.read_text().splitlines()):
            if not line.endswith("}"):
                continue
            record = json.loads(line)
            key = (record["pid"], record["seq"])
            if record["event"] == "start":
                entries[key] = LedgerEntry(
                    record["pid"], record["seq"], record["tool"], record["arguments"] or {}, start=number
                )
            elif key in entries:
                entries[key].outcome = record["outcome"]
                entries[key].end = number
        return sorted(entries.values(), key=lambda entry: entry.start)

    def tools(self) -> list[str]:
        """The tools the server started, in order."""
        return [entry.tool for entry in self.entries()]

    def running(self) -> list[LedgerEntry]:
        """The calls started and not (yet) ended."""
        return [entry for entry in self.entries() if entry.end is None]

    async def wait_for(self, count: int, within: float = 30.0) -> LedgerEntry:
        """Wait (up to `within` seconds) until `count` calls have started; return the last of them."""
        with anyio.fail_after(within):
            while True:
                entries = self.entries()
                if len(entries) >= count:
                    return entries[count - 1]
                await anyio.sleep(0.01)


def concurrent(entries: Iterable[LedgerEntry]) -> Iterator[tuple[LedgerEntry, list[LedgerEntry]]]:
    """Each entry, with the entries of `entries` still running on the server when it started.

    Leave out of `entries` what should count as never having run (a ``fenced`` write changed nothing).
    """
    entries = list(entries)
    starts = [(entry.start, entry) for entry in entries]
    ends = [(entry.end, entry) for entry in entries if entry.end is not None]
    events = sorted(starts + ends, key=lambda event: event[0])
    running: dict[tuple[int, int], LedgerEntry] = {}
    for line, entry in events:
        key = (entry.pid, entry.seq)
        if line == entry.end:
            running.pop(key, None)
            continue
        for gone in [k for k, other in running.items() if other.pid != entry.pid]:
            del running[gone]  # the calls of an earlier process ended when it died
        yield entry, list(running.values())
        running[key] = entry


def peak(entries: Iterable[LedgerEntry]) -> int:
    """The most calls that ran at once."""
    return max((1 + len(others) for _, others in concurrent(entries)), default=0)


def overlaps(entries: Iterable[LedgerEntry], exclusive: Callable[[LedgerEntry], bool]) -> int:
    """How many calls started while another ran, one of the two exclusive."""
    return sum(
        1 for entry, others in concurrent(entries) if others and (exclusive(entry) or any(map(exclusive, others)))
    )
