"""What each test costs: its wall time and the CPU it spent, per test file and for the costliest tests.

An opt-in pytest plugin, loaded by name (no conftest loads it)::

    python -m pytest -q -n 4 --dist worksteal -p tests.cpu_report --cpu-report /tmp/test-cpu.txt
    DISPATCHER_CPU_REPORT=/tmp/test-cpu.txt python -m pytest -q -p tests.cpu_report tests/test_tune.py

For every test (its setup, call and teardown together, so a module- or session-scoped fixture is paid by
the first test that uses it) it records:

- ``wall``: the test's wall time;
- ``self``: the CPU of the pytest process running it (``getrusage(RUSAGE_SELF)``, user plus system, every
  thread of it), an xdist worker's or the single process's;
- ``children``: the CPU of that process's children reaped during the test (``RUSAGE_CHILDREN``): the
  stdio servers, subprocesses, command-line runs and redis-servers the test started and waited for, and
  whatever those reaped of their own (a ``dispatcher tune --fleet`` run's processes);
- ``forked``: the CPU of the children of tests/forkserver.py's zygote that it reaped during the test.
  Those processes (``forkserver.params``, ``spawn``, ``http_workspace``) are the zygote's children, not
  the worker's, so their CPU is in no ``RUSAGE_CHILDREN`` of the worker until the zygote itself ends at
  the end of the session. The plugin reads it from the zygote's ``/proc/<pid>/stat`` (its ``cutime`` and
  ``cstime``, the CPU of its reaped children, at the kernel's clock tick, 10 ms); the zygote is found
  among the worker's children by its command line. A forked child still running when its test ends
  (none should) is counted in the test during which it ends.

Each pytest process appends one JSON line per test to ``<report>.parts/<worker>.jsonl`` (and one line of
its totals at the end of its session: its whole CPU, collection and start-up included, and its zygote's
own CPU); the xdist controller (or the single process) aggregates them into ``<report>`` at the end of the
session. ``python -m tests.cpu_report <report>.parts [--out PATH] [--top N]`` aggregates a directory
again, e.g. from a run that was interrupted. The report's first line gives the run's wall time, its
tests' summed CPU and the 1-minute load average sampled at the end of each test (min, median, max); then
a table per test file sorted by CPU, then the costliest tests.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator, Iterable

ENV = "DISPATCHER_CPU_REPORT"
"""The environment variable that gives the report's path when ``--cpu-report`` does not."""

TOP = 40
"""How many of the costliest tests the report lists."""

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cpu_report", "wall time and CPU per test (tests/cpu_report.py)")
    group.addoption(
        "--cpu-report",
        dest="cpu_report",
        default=None,
        metavar="PATH",
        help=f"write a table of each test file's and the costliest tests' wall time and CPU to PATH (or ${ENV})",
    )


def _report_path(config: pytest.Config) -> pathlib.Path | None:
    path = config.getoption("cpu_report") or os.environ.get(ENV)
    return pathlib.Path(path).resolve() if path else None


def parts_of(report: pathlib.Path) -> pathlib.Path:
    """The directory where each pytest process writes its lines for `report`."""
    return report.with_name(report.name + ".parts")


# Measuring, in each pytest process. ---------------------------------------------------------------------


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _children_of_self() -> Iterable[int]:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as file:
                listed = file.read().split()
        except OSError:
            continue
        yield from map(int, listed)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (the 3rd field is index 0), or None."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


class Zygote:
    """tests/forkserver.py's zygote among this process's children, and the CPU it and its children spent."""

    def __init__(self) -> None:
        self.pid: int | None = None

    def find(self) -> int | None:
        if self.pid is not None and _stat(self.pid) is not None:
            return self.pid
        self.pid = None
        for pid in _children_of_self():  # each time: a child between fork and exec has pytest's command line
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as file:
                    argv = file.read().split(b"\0")
            except OSError:
                continue
            if any(arg.endswith(b"forkserver.py") for arg in argv) and b"zygote" in argv:
                self.pid = pid
                return pid
        return None

    def cpu(self) -> tuple[float, float]:
        """The zygote's own CPU and its reaped children's, in seconds (zeros before it starts)."""
        pid = self.find()
        fields = _stat(pid) if pid is not None else None
        if fields is None:
            return 0.0, 0.0
        utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
        return (utime + stime) / _TICK, (cutime + cstime) / _TICK


class Recorder:
    """Writes a JSON line for each test this process runs."""

    def __init__(self, path: pathlib.Path, worker: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a", buffering=1)
        self.worker = worker
        self.zygote = Zygote()
        self.zygote_base: tuple[float, float] | None = None

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")

    def forked_cpu(self) -> float:
        own, children = self.zygote.cpu()
        if self.zygote_base is None and self.zygote.pid is not None:
            self.zygote_base = (own, children)
        return children

    def close(self) -> None:
        own, children = self.zygote.cpu()
        base_own, base_children = self.zygote_base or (0.0, 0.0)
        self.write(
            {
                "kind": "session",
                "worker": self.worker,
                "self": _cpu(resource.getrusage(resource.RUSAGE_SELF)),
                "children": _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)),
                "zygote_own": own,
                "zygote_own_since_first_test": own - base_own,
                "forked": children - base_children,
            }
        )
        self.file.close()


_RECORDER = pytest.StashKey[Recorder]()
_STARTED = pytest.StashKey[float]()


def _worker_id(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["workerid"])


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    report = _report_path(config)
    if report is None:
        return
    parts = parts_of(report)
    if _worker_id(config) is None:  # the controller, or the only process: a fresh directory, before any worker starts
        shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir(parents=True)
        config.stash[_STARTED] = time.monotonic()


def _recorder(config: pytest.Config) -> Recorder | None:
    """This process's recorder, opened at its first test (an xdist controller runs none, so has none)."""
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None:
        report = _report_path(config)
        if report is None:
            return None
        worker = _worker_id(config) or "main"
        recorder = config.stash[_RECORDER] = Recorder(parts_of(report) / f"{worker}.jsonl", worker)
    return recorder


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    recorder = _recorder(item.config)
    if recorder is None:
        return (yield)
    forked = recorder.forked_cpu()
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    try:
        return (yield)
    finally:
        wall = time.perf_counter() - wall
        own_after, children_after = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        recorder.write(
            {
                "kind": "test",
                "nodeid": item.nodeid,
                "file": item.nodeid.split("::", 1)[0],
                "worker": recorder.worker,
                "wall": wall,
                "self": _cpu(own_after) - _cpu(own),
                "children": _cpu(children_after) - _cpu(children),
                "forked": recorder.forked_cpu() - forked,
                "load": os.getloadavg()[0],
            }
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    recorder = config.stash.get(_RECORDER, None)
    if recorder is not None:
        recorder.close()
    report = _report_path(config)
    if report is None or _worker_id(config) is not None:
        return
    wall = time.monotonic() - config.stash.get(_STARTED, time.monotonic())
    report.write_text(render(parts_of(report), wall=wall))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = _report_path(config)
    if report is not None and _worker_id(config) is None:
        terminalreporter.write_line(f"cpu report: {report}")


# Aggregating. -----------------------------------------------------------------------------------------


def load(parts: pathlib.Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The test records and the session records of every ``*.jsonl`` file in `parts`."""
    tests: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    for path in sorted(parts.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut off by an interrupted run
            (sessions if record.get("kind") == "session" else tests).append(record)
    return tests, sessions


def _cost(row: dict[str, Any]) -> float:
    return float(row["self"] + row["children"] + row["forked"])


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    left = {0}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(headers), "  ".join("-" * w for w in widths), *(line(r).rstrip() for r in rows)]


def render(parts: pathlib.Path, *, wall: float | None = None, top: int = TOP) -> str:
    """The report of the records in `parts`."""
    tests, sessions = load(parts)
    loads = [float(t["load"]) for t in tests if "load" in t]
    by_file: dict[str, dict[str, Any]] = {}
    for t in tests:
        row = by_file.setdefault(t["file"], {"tests": 0, "wall": 0.0, "self": 0.0, "children": 0.0, "forked": 0.0})
        row["tests"] += 1
        for key in ("wall", "self", "children", "forked"):
            row[key] += t[key]
    total = {key: sum(float(t[key]) for t in tests) for key in ("wall", "self", "children", "forked")}
    workers = sorted({str(t["worker"]) for t in tests})
    head = [
        "load average (1 min, sampled at each test's end): "
        + (f"min {min(loads):.1f}, median {statistics.median(loads):.1f}, max {max(loads):.1f}" if loads else "none")
        + f"; {len(tests)} tests on {len(workers)} process(es)"
        + (f"; session wall {wall:.0f} s" if wall is not None else ""),
        f"tests' CPU: {_cost(total):.0f} s (self {total['self']:.0f}, children {total['children']:.0f}, "
        f"forked {total['forked']:.0f}); tests' summed wall {total['wall']:.0f} s",
    ]
    if sessions:
        whole = sum(float(s["self"]) + float(s["children"]) for s in sessions)
        zygotes = sum(float(s["zygote_own"]) for s in sessions)
        late = sum(float(s["forked"]) for s in sessions) - total["forked"]
        head.append(
            f"pytest processes' whole CPU (collection and start-up included): {whole:.0f} s, their zygotes' "
            f"own {zygotes:.0f} s; forked CPU outside any test {max(late, 0.0):.0f} s"
        )
    head += [
        "columns: wall = the test's wall time (setup, call, teardown); self = the pytest worker's CPU; children =",
        "its reaped children's (subprocesses, redis-server...); forked = tests/forkserver.py's forked children's;",
        "cpu = self + children + forked. Seconds.",
        "",
    ]
    file_rows = sorted(by_file.items(), key=lambda item: -_cost(item[1]))
    lines = [*head, f"Per test file ({len(file_rows)}), by CPU:", ""]
    lines += _table(
        ["file", "tests", "wall s", "self CPU s", "children CPU s", "forked CPU s", "cpu s"],
        [
            [name, str(r["tests"]), f"{r['wall']:.1f}", f"{r['self']:.1f}", f"{r['children']:.1f}",
             f"{r['forked']:.1f}", f"{_cost(r):.1f}"]
            for name, r in file_rows
        ],
    )  # fmt: skip
    costliest = sorted(tests, key=lambda t: -_cost(t))[:top]
    lines += ["", f"The {len(costliest)} costliest tests, by CPU:", ""]
    lines += _table(
        ["test", "wall s", "self CPU s", "children CPU s", "forked CPU s", "cpu s"],
        [
            [t["nodeid"], f"{t['wall']:.2f}", f"{t['self']:.2f}", f"{t['children']:.2f}", f"{t['forked']:.2f}",
             f"{_cost(t):.2f}"]
            for t in costliest
        ],
    )  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cpu_report", description="Aggregate a CPU report.")
    parser.add_argument("parts", type=pathlib.Path, help="the <report>.parts directory a run wrote")
    parser.add_argument("--out", type=pathlib.Path, help="write the report there (default: standard output)")
    parser.add_argument("--top", type=int, default=TOP, help=f"how many costliest tests to list ({TOP})")
    args = parser.parse_args(argv)
    text = render(args.parts, top=args.top)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
