"""The windows a fault opens in a fleet: `python -m benchmarks.fleet_windows [--quick] [--repeat N]`.

Not part of `python -m benchmarks`: it starts a redis-server, the example workspace over HTTP and two OS
processes per run (needs redis-server; `.ci/redis` installs it).

Each run: process A takes the write turn of a shared-state server and sends one write; process B has two
writes queued behind it. The workspace is `--uncancellable` (a write runs its whole `WRITE` seconds, whatever
becomes of its client: the worst case), and its ledger stamps every start and end with the machine's
monotonic clock. While A's write is on the server (or, for ``freeze before send``, between A's grant and
its send) a fault strikes:

- ``freeze before send``: A stops itself (SIGSTOP) right after its grant, for `freeze` seconds;
- ``freeze during write``: A is SIGSTOPped while its write runs, for `freeze` seconds;
- ``SIGKILL``: A is killed while its write runs;
- ``Redis pause``: redis-server is SIGSTOPped while A's write runs, for `pause` seconds;
- ``Redis restart``: redis-server is killed and started again empty (no persistence);
- ``FLUSHALL``: Redis' state is flushed.

Three protections: ``lease only`` (no fence, `max_write_time=0`: the turn moves on when the lease ends),
``max_write_time`` (no fence, the turn of a cut-off write kept `BOUND` seconds more than its lease) and
``fenced`` (the workspace's `--fence` mode: a write whose token is stale where it takes effect changes
nothing). Measured from the ledger, over the runs of each cell: how many pairs of writes that took effect
overlapped on the server, the longest such overlap (the window), how many late writes the fence refused,
and how long after the fault B's next write started (the handover).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher import Dispatcher, Effect, ToolCall
from dispatcher.fleet import FleetServer, RedisCoordinator

from ._redis import RedisServer, redis_server_binary

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

__all__ = ["FULL", "QUICK", "Cell", "Config", "main", "measure", "run_cell", "table"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fleet_windows.json"
FENCE = "example.com/fence"
TTL = 0.5
RECHECK = 0.1
WRITE = 2.0
"""Seconds each write runs on the server."""
BOUND = 2.5
"""`max_write_time` of the ``max_write_time`` protection: longer than a write runs."""
FAULTS = ("freeze before send", "freeze during write", "SIGKILL", "Redis pause", "Redis restart", "FLUSHALL")
PROTECTIONS = ("lease only", "max_write_time", "fenced")


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    repeat: int = 3
    pauses: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    """Seconds of each Redis pause and each freeze during a write."""
    faults: tuple[str, ...] = FAULTS
    protections: tuple[str, ...] = PROTECTIONS


FULL = Config()
QUICK = Config(repeat=1, pauses=(1.0,))


@dataclass(frozen=True, slots=True)
class Cell:
    fault: str
    protection: str
    seconds: float | None
    """How long the fault lasts (a pause or a freeze), or None."""

    @property
    def label(self) -> str:
        return self.fault if self.seconds is None else f"{self.fault} {self.seconds:g} s"


def cells(config: Config) -> list[Cell]:
    """The grid: each fault (each duration of the timed ones) under each protection."""
    grid: list[Cell] = []
    for fault in config.faults:
        timed = fault in ("freeze during write", "Redis pause")
        durations: tuple[float | None, ...] = (
            config.pauses if timed else (2 * TTL if fault.startswith("freeze") else None,)
        )
        grid.extend(Cell(fault, protection, seconds) for seconds in durations for protection in config.protections)
    return grid


# One process of a run --------------------------------------------------------------------------------


class _FreezesAfterGrant(RedisCoordinator):
    """A coordinator whose process stops itself (SIGSTOP) right after its first write's grant, saying FROZEN."""

    def __init__(self, *args: Any, freeze: bool, **options: Any) -> None:
        super().__init__(*args, **options)
        self.freeze = freeze

    @contextlib.asynccontextmanager
    async def hold(self, **options: Any) -> AsyncIterator[Any]:
        async with super().hold(**options) as lease:
            if self.freeze and options.get("exclusive"):
                self.freeze = False
                print("FROZEN", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            yield lease


async def _worker(spec: dict[str, Any]) -> None:
    fenced = spec["protection"] == "fenced"
    server = FleetServer(
        shared_state=True,
        fence_meta=FENCE if fenced else None,
        max_write_time=BOUND if spec["protection"] == "max_write_time" else 0.0,
    )
    coordinator = _FreezesAfterGrant(
        spec["redis"], freeze=spec["freeze"], namespace=spec["namespace"], servers={"ws": server},
        lease_ttl=TTL, recheck=RECHECK, timeout=1.0,
    )  # fmt: skip
    results: list[dict[str, Any]] = []
    async with coordinator, Dispatcher(coordinator=coordinator, call_timeout=30.0) as dispatcher:
        await dispatcher.connect("ws", spec["mcp"], trusted=True)
        print("READY", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        for index in range(spec["writes"]):
            name = f"{spec['name']}-{index}"
            for _ in range(100):
                [result] = await dispatcher.dispatch([ToolCall(name, "set_note", {"name": name, "text": "t"})])
                # As an agent would: a write that never ran (no hold while Redis was away) is asked again.
                if result.effect is not Effect.NEVER_RAN or spec["name"] == "a":
                    break
                await anyio.sleep(0.05)
            results.append({"id": name, "status": result.status.value, "effect": result.effect.value})
    print(json.dumps(results), flush=True)


# One run ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    overlaps: int
    """Pairs of writes that both took effect and ran at the same time on the server."""
    window: float
    """The longest of those overlaps, in seconds (0 without one)."""
    refused: int
    """Writes the fence refused where they would have taken effect."""
    handover: float | None
    """Seconds from the fault to the start of B's next write, or None if B wrote nothing after it."""
    cut_off: str
    """What A's write was told (``status/effect``), or ``killed``."""


def measure(records: list[dict[str, Any]], fault_at: float) -> tuple[int, float, int, float | None]:
    """Overlaps, window, refusals and handover, from a ledger's records (see `Run`)."""
    writes: dict[tuple[int, int], dict[str, Any]] = {}
    for record in records:
        key = (record["pid"], record["seq"])
        if record["event"] == "start":
            writes[key] = {"name": record["arguments"]["name"], "start": record["at"], "end": None}
        elif key in writes:
            writes[key].update(end=record["at"], outcome=record["outcome"])
    done = [write for write in writes.values() if write["end"] is not None]
    refused = sum(write["outcome"] == "fenced" for write in done)
    effective = [write for write in done if write["outcome"] != "fenced"]
    overlaps, window = 0, 0.0
    for index, first in enumerate(effective):
        for second in effective[index + 1 :]:
            both = min(first["end"], second["end"]) - max(first["start"], second["start"])
            if both > 0:
                overlaps += 1
                window = max(window, both)
    after = [
        write["start"] for write in writes.values() if write["name"].startswith("b-") and write["start"] >= fault_at
    ]
    return overlaps, window, refused, (min(after) - fault_at if after else None)


@contextlib.contextmanager
def _workspace(directory: pathlib.Path, fenced: bool) -> Iterator[tuple[str, pathlib.Path]]:
    ledger = directory / f"ledger-{uuid.uuid4().hex[:6]}.jsonl"
    options = ["--fence", FENCE] if fenced else []
    server = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.examples.workspace", "--http", "--port", "0", "--latency", str(WRITE),
         "--uncancellable", "--ledger", str(ledger), *options],
        stdout=subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        yield server.stdout.readline().decode().strip().split("=", 1)[1], ledger
    finally:
        server.terminate()
        server.communicate(timeout=20)


def _records(ledger: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


def _until(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)


def run_cell(cell: Cell, redis: RedisServer, directory: pathlib.Path) -> Run:
    """One run of `cell` against `redis` (restarted or flushed by the faults that do so)."""
    with _workspace(directory, cell.protection == "fenced") as (mcp, ledger):
        namespace = f"windows-{uuid.uuid4().hex[:8]}"
        workers: dict[str, subprocess.Popen[bytes]] = {}
        for name, writes in (("a", 1), ("b", 2)):
            spec = {
                "redis": redis.url, "namespace": namespace, "mcp": mcp, "protection": cell.protection, "name": name,
                "writes": writes, "freeze": name == "a" and cell.fault == "freeze before send",
            }  # fmt: skip
            workers[name] = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.fleet_windows", "--worker", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
            )
        a, b = workers["a"], workers["b"]
        try:
            for worker in workers.values():
                assert worker.stdout is not None and worker.stdin is not None
                if worker.stdout.readline().strip() != b"READY":
                    raise RuntimeError("a worker did not start")
            assert a.stdin is not None and a.stdout is not None and b.stdin is not None
            a.stdin.write(b"GO\n")
            a.stdin.flush()
            if cell.fault == "freeze before send":
                if a.stdout.readline().strip() != b"FROZEN":
                    raise RuntimeError("A did not freeze")
            else:
                _until(lambda: any(r["event"] == "start" for r in _records(ledger)), "A's write")
            b.stdin.write(b"GO\n")
            b.stdin.flush()
            time.sleep(0.1)  # B's writes are queued behind A's turn
            fault_at = time.monotonic()
            cut_off = _strike(cell, a, redis)
            outputs = {name: worker.communicate(timeout=120)[0] for name, worker in workers.items()}
        finally:
            for worker in workers.values():
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        if cut_off is None:
            [result] = json.loads(outputs["a"].decode().strip().splitlines()[-1])
            cut_off = f"{result['status']}/{result['effect']}"
        time.sleep(WRITE)  # a write still running on the server ends in the ledger
        overlaps, window, refused, handover = measure(_records(ledger), fault_at)
    return Run(overlaps, window, refused, handover, cut_off)


def _strike(cell: Cell, a: subprocess.Popen[bytes], redis: RedisServer) -> str | None:
    """The fault; returns ``killed`` when A is gone, else None."""
    seconds = cell.seconds or 0.0
    if cell.fault == "SIGKILL":
        a.kill()
        a.wait()
        return "killed"
    if cell.fault.startswith("freeze"):
        if cell.fault == "freeze during write":
            a.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        a.send_signal(signal.SIGCONT)
    elif cell.fault == "Redis pause":
        assert redis.process is not None
        redis.process.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        redis.process.send_signal(signal.SIGCONT)
    elif cell.fault == "Redis restart":
        redis.restart()
    else:
        import redis as redis_py

        client = redis_py.Redis.from_url(redis.url)
        try:
            client.flushall()
        finally:
            client.close()
    return None


# The command line -------------------------------------------------------------------------------------


def table(results: dict[Cell, list[Run]]) -> str:
    """The markdown table of the measured cells."""
    lines = [
        f"Writes of {WRITE:g} s on a server that finishes them whatever happens to their client; lease_ttl={TTL:g} s, "
        f"recheck={RECHECK:g} s, max_write_time={BOUND:g} s where set; counts summed over the runs of each cell.",
        "",
        "| fault | protection | runs | overlapping writes | longest overlap (s) | refused by the fence | "
        "handover after the fault (s) | the cut-off write ended |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for cell, runs in results.items():
        handovers = [run.handover for run in runs if run.handover is not None]
        handover = f"{min(handovers):.2f}-{max(handovers):.2f}" if handovers else "-"
        endings = ", ".join(sorted({run.cut_off for run in runs}))
        lines.append(
            f"| {cell.label} | {cell.protection} | {len(runs)} | {sum(run.overlaps for run in runs)} | "
            f"{max(run.window for run in runs):.2f} | {sum(run.refused for run in runs)} | {handover} | {endings} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the grid and print its table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_windows", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run per cell, one duration (1 s)")
    parser.add_argument("--repeat", type=int, help="runs per cell")
    parser.add_argument("--fault", action="append", choices=FAULTS, help="only this fault (repeatable)")
    parser.add_argument("--no-save", action="store_true", help=f"do not write {RESULTS.relative_to(ROOT)}")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        anyio.run(_worker, json.loads(args.worker))
        return
    binary = redis_server_binary()
    if binary is None:
        parser.error("redis-server is not installed (.ci/redis installs it)")
    config = QUICK if args.quick else FULL
    if args.repeat is not None:
        config = Config(repeat=args.repeat, pauses=config.pauses, faults=config.faults)
    if args.fault:
        config = Config(repeat=config.repeat, pauses=config.pauses, faults=tuple(args.fault))
    results: dict[Cell, list[Run]] = {}
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory)
        redis = RedisServer(binary, path)
        redis.start()
        try:
            for cell in cells(config):
                for _ in range(config.repeat):
                    results.setdefault(cell, []).append(run_cell(cell, redis, path))
                print(table({cell: results[cell]}).splitlines()[-1], file=sys.stderr, flush=True)
        finally:
            redis.stop()
    print(table(results))
    if not args.no_save:
        RESULTS.parent.mkdir(exist_ok=True)
        figures = [
            {"fault": cell.fault, "protection": cell.protection, "seconds": cell.seconds,
             "runs": [dataclasses.asdict(run) for run in runs]}
            for cell, runs in results.items()
        ]  # fmt: skip
        RESULTS.write_text(json.dumps({"write": WRITE, "ttl": TTL, "bound": BOUND, "cells": figures}, indent=2) + "\n")


if __name__ == "__main__":
    main()
