"""The fleet benchmark: `python -m benchmarks.fleet [--quick] [--redis-server PATH]` (needs redis-server).

Not part of `python -m benchmarks`: it starts a redis-server and several OS processes.

1. Cost of coordination per call: one dispatcher, an in-process example workspace (zero latency),
   calls dispatched one at a time. Variants, interleaved repetition by repetition: no coordinator,
   `LocalCoordinator` (the same code path: the hook is skipped), and `RedisCoordinator` with a limit
   and with shared state (each call takes and gives back a hold: two script round trips). On asyncio
   (redis.asyncio) and trio (the blocking client in worker threads).
2. A fleet run: PROCESSES processes x AGENTS agents, each agent dispatching CALLS read calls one after
   the other, against one workspace served over streamable HTTP (fixed latency, a ledger of every
   execution), with a fleet-wide limit; against one process running all the agents with the same limit
   as its local per-server cap. Throughput (calls per second over the run), p50/p95 latency per call
   (queued to finished), and the peak concurrency the server saw in its ledger.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import anyio

from dispatcher import Dispatcher, ToolCall
from dispatcher.examples import Workspace
from dispatcher.fleet import FleetServer, LocalCoordinator, RedisCoordinator

from ._measure import Stat, interleave
from ._redis import RedisServer, redis_server_binary
from ._report import Progress

__all__ = ["FULL", "QUICK", "Config", "coordination_cost", "fleet_run", "main"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fleet.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    calls: int = 200
    repeat: int = 10
    backends: tuple[str, ...] = ("asyncio", "trio")
    processes: int = 4
    agents: int = 8
    fleet_calls: int = 25
    limit: int = 8
    latency: float = 0.02


FULL = Config()
QUICK = Config(calls=50, repeat=3, processes=2, agents=4, fleet_calls=5)


# 1. Cost per call ----------------------------------------------------------------------------------


async def _cost(config: Config, url: str) -> dict[str, Stat]:
    workspace = Workspace()
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    variants: dict[str, Any] = {
        "no coordinator": None,
        "LocalCoordinator": LocalCoordinator(),
        "Redis, limit": RedisCoordinator(
            url, namespace=namespace, servers={"ws": FleetServer(limit=16)}, lease_ttl=1.0, recheck=0.2
        ),
        "Redis, shared state": RedisCoordinator(
            # Its writes end at once: no turn to keep beyond their leases.
            url, namespace=namespace + "s", servers={"ws": FleetServer(limit=16, shared_state=True, max_write_time=0)},
            lease_ttl=1.0, recheck=0.2,
        ),
    }  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        runs = {}
        for name, coordinator in variants.items():
            if isinstance(coordinator, RedisCoordinator):
                await stack.enter_async_context(coordinator)
            dispatcher = await stack.enter_async_context(Dispatcher(coordinator=coordinator))
            await dispatcher.connect("ws", workspace.server, trusted=True)
            runs[name] = _sequential(dispatcher, config.calls)
        await anyio.sleep(1.1)  # a fresh Redis grants nothing for one lease_ttl (see docs/fleet.md)
        samples = await interleave(runs, config.repeat, Progress(enabled=False), label="cost")
    return {name: Stat.of([seconds / config.calls for seconds in values]) for name, values in samples.items()}


def _sequential(dispatcher: Dispatcher, calls: int) -> Any:
    async def run() -> float:
        started = time.perf_counter()
        for index in range(calls):
            [result] = await dispatcher.dispatch([ToolCall(str(index), "search_notes", {"query": "x"})])
            assert result.ok, result.error
        return time.perf_counter() - started

    return run


def coordination_cost(config: Config, url: str) -> dict[str, dict[str, Stat]]:
    """Seconds per call of each variant, by backend."""
    return {backend: anyio.run(_cost, config, url, backend=backend) for backend in config.backends}


# 2. A fleet run ------------------------------------------------------------------------------------


async def _worker(spec: dict[str, Any]) -> None:
    coordinator = None
    if spec["redis"] is not None:
        coordinator = RedisCoordinator(
            spec["redis"], namespace=spec["namespace"], servers={"ws": FleetServer(limit=spec["limit"])},
            lease_ttl=2.0, recheck=0.5,
        )  # fmt: skip
    latencies: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        if coordinator is not None:
            await stack.enter_async_context(coordinator)
        dispatcher = await stack.enter_async_context(Dispatcher(max_concurrency=None, coordinator=coordinator))
        local_limit = None if coordinator is not None else spec["limit"]
        await dispatcher.connect("ws", spec["mcp"], trusted=True, max_concurrency=local_limit)

        async def agent(index: int) -> None:
            for call in range(spec["calls"]):
                [result] = await dispatcher.dispatch([ToolCall(f"{index}-{call}", "search_notes", {"query": "x"})])
                assert result.ok, result.error
                assert result.finished_at is not None
                latencies.append(result.finished_at - result.queued_at)

        print("READY", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        started = time.time()
        async with anyio.create_task_group() as tg:
            for index in range(spec["agents"]):
                tg.start_soon(agent, index)
        finished = time.time()
    print(json.dumps({"started": started, "finished": finished, "latencies": latencies}), flush=True)


def _prime(url: str, namespace: str, limit: int) -> None:
    async def take() -> None:
        coordinator = RedisCoordinator(
            url, namespace=namespace, servers={"ws": FleetServer(limit=limit)}, lease_ttl=2.0, recheck=0.5
        )
        async with coordinator, coordinator.hold(server="ws", exclusive=False, on_lost=print):
            pass

    anyio.run(take)


def _peak(ledger: pathlib.Path) -> int:
    running: set[int] = set()
    peak = 0
    for line in ledger.read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "start":
            running.add(record["seq"])
            peak = max(peak, len(running))
        else:
            running.discard(record["seq"])
    return peak


def _one_run(config: Config, redis: str | None, processes: int, agents: int, directory: pathlib.Path) -> dict[str, Any]:
    ledger = directory / f"ledger-{uuid.uuid4().hex[:6]}.jsonl"
    server = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.examples.workspace", "--http", "--port", "0", "--latency",
         str(config.latency), "--ledger", str(ledger)],
        stdout=subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        mcp = server.stdout.readline().decode().strip().split("=", 1)[1]
        namespace = f"bench-{uuid.uuid4().hex[:8]}"
        spec: dict[str, Any] = {
            "redis": redis, "namespace": namespace, "mcp": mcp, "limit": config.limit, "agents": agents,
            "calls": config.fleet_calls,
        }  # fmt: skip
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.fleet", "--worker", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
            )
            for _ in range(processes)
        ]
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline().strip() == b"READY"
        if redis is not None:
            # A fresh namespace grants nothing for one lease_ttl (2 s here): start the clock after it.
            _prime(redis, namespace, config.limit)
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"GO\n")
            worker.stdin.close()
        reports = []
        for worker in workers:
            assert worker.stdout is not None
            out = worker.stdout.read()
            assert worker.wait(600) == 0, "a fleet worker failed"
            worker.stdout.close()
            reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        server.terminate()
        server.communicate(timeout=20)
    latencies = sorted(latency for report in reports for latency in report["latencies"])
    span = max(report["finished"] for report in reports) - min(report["started"] for report in reports)
    return {
        "processes": processes,
        "agents": agents,
        "calls": len(latencies),
        "throughput": len(latencies) / span,
        "p50": statistics.median(latencies),
        "p95": statistics.quantiles(latencies, n=20, method="inclusive")[-1],
        "peak": _peak(ledger),
    }


def fleet_run(config: Config, url: str) -> list[dict[str, Any]]:
    """The fleet against one process with all its agents and the same limit."""
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory)
        return [
            _one_run(config, url, config.processes, config.agents, path),
            _one_run(config, None, 1, config.processes * config.agents, path),
        ]


# The command line ----------------------------------------------------------------------------------


def _table(config: Config, cost: dict[str, dict[str, Stat]], runs: list[dict[str, Any]]) -> str:
    lines = [
        f"Coordination cost: {config.calls} calls one at a time, in-process workspace, zero latency "
        f"(median of {config.repeat} repetitions, interquartile range)",
        "",
        "| backend | variant | µs per call | vs no coordinator |",
        "|---|---|---:|---:|",
    ]
    for backend, stats in cost.items():
        base = stats["no coordinator"].median
        for name, stat in stats.items():
            lines.append(
                f"| {backend} | {name} | {stat.median * 1e6:,.0f} ({stat.q1 * 1e6:,.0f}-{stat.q3 * 1e6:,.0f}) "
                f"| {stat.median / base:.2f}x |"
            )
    lines += [
        "",
        f"Fleet run: read calls of {config.latency * 1000:.0f} ms, limit {config.limit}, "
        f"{config.fleet_calls} calls per agent",
        "",
        "| setup | calls | throughput (calls/s) | p50 latency (ms) | p95 latency (ms) | server peak concurrency |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        setup = (
            f"{run['processes']} processes x {run['agents']} agents, RedisCoordinator limit {config.limit}"
            if run["processes"] > 1
            else f"1 process x {run['agents']} agents, local limit {config.limit}"
        )
        lines.append(
            f"| {setup} | {run['calls']} | {run['throughput']:,.0f} | {run['p50'] * 1000:.1f} | "
            f"{run['p95'] * 1000:.1f} | {run['peak']} |"
        )
    return "\n".join(lines)


def run(config: Config, url: str) -> tuple[dict[str, dict[str, Stat]], list[dict[str, Any]], str]:
    """Both parts against the Redis at `url`; returns the figures and the markdown table."""
    cost = coordination_cost(config, url)
    runs = fleet_run(config, url)
    return cost, runs, _table(config, cost, runs)


def main(argv: list[str] | None = None) -> None:
    """Run the fleet benchmark and print its tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
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
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(binary, pathlib.Path(directory))
        redis.start()
        try:
            cost, runs, table = run(config, redis.url)
        finally:
            redis.stop()
    print(table)
    if not args.no_save:
        figures = {
            "config": {name: getattr(config, name) for name in config.__dataclass_fields__},
            "cost_seconds_per_call": {
                backend: {name: {"median": stat.median, "q1": stat.q1, "q3": stat.q3} for name, stat in stats.items()}
                for backend, stats in cost.items()
            },
            "fleet": runs,
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        }
        RESULTS.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
