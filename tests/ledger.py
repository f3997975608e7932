"""The one reader of the ledger a workspace process writes (``--ledger PATH``), for the tests.

`dispatcher.examples.workspace --ledger PATH` appends a JSON line as each tool call starts and as it ends
(``{"event": "start", "pid", "at", "seq", "tool", "arguments"}``, ``{"event": "end", "pid", "at", "seq",
"outcome"}``), unbuffered, so a killed process leaves every line it wrote and several processes (restarts, a
fleet's server, two stdio servers) may share one file. An entry is keyed by ``(pid, seq)``: ``seq`` counts
calls within one process only. The order of the lines is the order of the events (each is one ``O_APPEND``
write), so line numbers order starts and ends across processes without trusting the ``at`` clock.

`Ledger` reads the file again on each question, so a test can ask while the server runs:

- `entries()`: every call, in the order the calls started; `tools()`: their tool names;
- `running()`: the calls that started and have not ended (a write still open when a process was frozen);
- `await wait_for(count)`: until `count` calls (that match a predicate) have started, polling the file;
- `overlaps(conflict)`: each pair of calls that ran at once and conflict (a write beside anything);
- `peak()`: the most calls that ran at once.

A call the fenced workspace refused as it took effect (outcome ``fenced``) changed nothing; `overlaps`
and `peak` leave it out when asked (``effective=True``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable


@dataclass
class Entry:
    """One tool call a workspace process recorded: where its start and end lines are in the file."""

    pid: int
    seq: int
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    outcome: str | None = None
    start: int = 0
    """The line number of its start."""
    end: int | None = None
    """The line number of its end; None while it runs (or if its process was killed during it)."""

    @property
    def key(self) -> tuple[int, int]:
        """``(pid, seq)``: unique across the processes that share a ledger."""
        return (self.pid, self.seq)

    def overlaps(self, other: Entry) -> bool:
        """Whether the two calls ran at once (one started before the other ended); a call left open runs on."""
        mine = self.end if self.end is not None else float("inf")
        theirs = other.end if other.end is not None else float("inf")
        return self.key != other.key and self.start < theirs and other.start < mine


def _any(first: Entry, second: Entry) -> bool:
    return True


class Ledger:
    """The ledger file at `path`, read back by the test (missing means no call has started)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def entries(self) -> list[Entry]:
        """Every recorded call in the order the calls started."""
        if not self.path.exists():
            return []
        entries: dict[tuple[int, int], Entry] = {}
        for number, line in enumerate(self.path.read_text().splitlines()):
            if not line.endswith("}"):
                continue  # a line cut short by a kill
            record = json.loads(line)
            key = (record["pid"], record["seq"])
            if record["event"] == "start":
                entries[key] = Entry(key[0], key[1], record["tool"], record["arguments"] or {}, start=number)
            elif key in entries:
                entries[key].outcome = record["outcome"]
                entries[key].end = number
        return sorted(entries.values(), key=lambda entry: entry.start)

    def tools(self) -> list[str]:
        """The tool of each recorded call, in the order the calls started."""
        return [entry.tool for entry in self.entries()]

    def running(self, where: Callable[[Entry], bool] = lambda entry: True) -> list[Entry]:
        """The calls (that match `where`) that started and have not ended."""
        return [entry for entry in self.entries() if entry.end is None and where(entry)]

    async def wait_for(
        self, count: int, within: float = 30.0, where: Callable[[Entry], bool] = lambda entry: True
    ) -> Entry:
        """Wait (up to `within` seconds, on the event loop's clock) until `count` calls matching `where`
        have started; return the `count`-th of them."""
        with anyio.fail_after(within):
            while True:
                entries = [entry for entry in self.entries() if where(entry)]
                if len(entries) >= count:
                    return entries[count - 1]
                await anyio.sleep(0.01)

    def overlaps(
        self, conflict: Callable[[Entry, Entry], bool] = _any, *, effective: bool = False
    ) -> list[tuple[Entry, Entry]]:
        """Each pair of calls that ran at once and `conflict`, as (earlier, later) by start.

        With `effective`, a call the fenced workspace refused (outcome ``fenced``) is left out.
        """
        entries = [entry for entry in self.entries() if not (effective and entry.outcome == "fenced")]
        return [
            (earlier, later)
            for index, later in enumerate(entries)
            for earlier in entries[:index]
            if earlier.overlaps(later) and conflict(earlier, later)
        ]

    def peak(self, *, effective: bool = False) -> int:
        """The most calls that ran at once (with `effective`, leaving out the fenced ones)."""
        entries = [entry for entry in self.entries() if not (effective and entry.outcome == "fenced")]
        events = sorted(
            [(entry.start, 1) for entry in entries] + [(entry.end, -1) for entry in entries if entry.end is not None]
        )
        peak = running = 0
        for _, change in events:
            running += change
            peak = max(peak, running)
        return peak
