"""A fleet of OS processes, each with its own dispatcher, against one instrumented MCP server and one Redis.

The server is the example workspace over streamable HTTP with `--ledger`: it appends a line as each tool
call starts and ends, so the ledger shows what really overlapped on the server. The fleet shares one
server, `ws`, with a limit and shared state (writes alone, reads together).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from subprocess import PIPE
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from dispatcher.fleet import CoordinationError, FleetServer, RedisCoordinator
from tests import forkserver
from tests.fleet.conftest import FENCE
from tests.ledger import Entry, Ledger

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Iterator

    from benchmarks._redis import RedisServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 3
WRITES = frozenset({"set_note", "create_note", "append_note", "delete_note"})


@dataclass
class Overlaps:
    peak: int
    write_overlaps: int
    calls: int


def _write_beside(first: Entry, second: Entry) -> bool:
    return first.tool in WRITES or second.tool in WRITES


def read_ledger(path: pathlib.Path) -> Overlaps:
    """The server's peak concurrency and how many times a write overlapped another call, from its ledger.

    A write the fenced workspace refused where it would have taken effect (outcome ``fenced``) changed
    nothing, so it overlaps nothing.
    """
    ledger = Ledger(path)
    calls = sum(entry.outcome != "fenced" for entry in ledger.entries())
    return Overlaps(ledger.peak(effective=True), len(ledger.overlaps(_write_beside, effective=True)), calls)


def spawn(config: dict[str, Any]) -> subprocess.Popen[bytes]:
    """A fleet process, forked from tests/forkserver.py's zygote: its pid is its own, so signals reach it."""
    return forkserver.spawn([sys.executable, "-m", "tests.fleet.agent", json.dumps(config)], cwd=ROOT, stdout=PIPE)


# The fleet's workspace fixtures (tests/fleet/conftest.py), overridden here by forked ones.
@pytest.fixture
def workspace(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """The example workspace over HTTP with a ledger; yields its URL and the ledger's path."""
    yield from forkserver.http_workspace(tmp_path)


@pytest.fixture
def fenced_workspace(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """The same workspace in its fenced mode: writes with a stale token in _meta[FENCE] are refused."""
    yield from forkserver.http_workspace(tmp_path, "--fence", FENCE, "--latency", "0.06")


@pytest.fixture
def slow_workspace(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """The workspace with 0.2 s calls: a flush or a freeze finds writes in flight."""
    yield from forkserver.http_workspace(tmp_path, "--latency", "0.2")


def fleet_configs(
    tmp_path: pathlib.Path, mcp: str, redis: str | None, namespace: str, *, processes: int, rounds: int
) -> list[dict[str, Any]]:
    # Processes alternate between the two anyio backends: one fleet, both ways of talking to Redis.
    return [
        {
            "redis": redis,
            "namespace": namespace,
            "mcp": mcp,
            "limit": LIMIT,
            "shared_state": True,
            "agents": 4,
            "rounds": rounds,
            "backend": ("asyncio", "trio")[index % 2],
            "name": f"p{index}",
            "out": str(tmp_path / f"results-{index}.json"),
        }
        for index in range(processes)
    ]


def wait_all(processes: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
    for process in processes:
        try:
            assert process.wait(timeout) == 0, f"a fleet process exited with {process.returncode}"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


def results_of(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for config in configs:
        with open(config["out"]) as file:
            results.extend(json.load(file))
    return results


def expected_ids(configs: list[dict[str, Any]]) -> list[str]:
    return sorted(
        f"{config['name']}-{agent}-{round_}-{suffix}"
        for config in configs
        for agent in range(config["agents"])
        for round_ in range(config["rounds"])
        for suffix in ("r1", "w", "r2")
    )


def test_a_fleet_never_exceeds_the_shared_limit_and_writes_never_overlap(
    tmp_path: pathlib.Path, redis_server: RedisServer, namespace: str, workspace: tuple[str, pathlib.Path]
) -> None:
    """Three processes (asyncio and trio) x 4 agents: at most LIMIT calls on the server, every write alone."""
    mcp, ledger = workspace
    configs = fleet_configs(tmp_path, mcp, redis_server.url, namespace, processes=3, rounds=3)
    wait_all([spawn(config) for config in configs])
    results = results_of(configs)
    assert sorted(result["id"] for result in results) == expected_ids(configs), "a call lost its result"
    assert [result for result in results if result["status"] != "ok"] == []
    seen = read_ledger(ledger)
    assert seen.calls == len(results)
    assert seen.peak <= LIMIT, f"{seen.peak} calls ran at once on the server; the fleet limit is {LIMIT}"
    assert seen.write_overlaps == 0, f"a write overlapped another call {seen.write_overlaps} times"


def test_without_the_coordinator_the_same_fleet_breaks_both_rules(
    tmp_path: pathlib.Path, namespace: str, workspace: tuple[str, pathlib.Path]
) -> None:
    """The oracle: the same three processes with no coordinator exceed the limit or overlap writes."""
    mcp, ledger = workspace
    configs = fleet_configs(tmp_path, mcp, None, namespace, processes=3, rounds=3)
    wait_all([spawn(config) for config in configs])
    assert len(results_of(configs)) == len(expected_ids(configs))
    seen = read_ledger(ledger)
    assert seen.peak > LIMIT or seen.write_overlaps > 0, "the checks cannot tell a fleet without coordination"


def test_a_fleet_overlaps_writes_on_different_keys_and_never_on_the_same_key(
    tmp_path: pathlib.Path, redis_server: RedisServer, namespace: str, workspace: tuple[str, pathlib.Path]
) -> None:
    """Three processes writing notes k0 and k1 (keyed by name): same-note writes never overlap, k0 and k1 do."""
    mcp, ledger = workspace
    configs = fleet_configs(tmp_path, mcp, redis_server.url, namespace, processes=3, rounds=4)
    for config in configs:
        config.update(mode="keyed", limit=None)
    wait_all([spawn(config) for config in configs])
    results = results_of(configs)
    assert len(results) == 3 * 4 * 4
    assert [result for result in results if result["status"] != "ok"] == []
    pairs = Ledger(ledger).overlaps()
    same = sum(a.arguments["name"] == b.arguments["name"] for a, b in pairs)
    different = len(pairs) - same
    assert same == 0, f"writes of one note overlapped {same} times across the fleet"
    assert different > 0, "writes of different notes never overlapped: the fleet held the whole server"


def test_redis_restarted_mid_run_loses_no_result_and_runs_nothing_unguarded(
    tmp_path: pathlib.Path, redis_server: RedisServer, namespace: str, workspace: tuple[str, pathlib.Path]
) -> None:
    """Redis killed and restarted empty mid-run: one result per call, and the rules held on the server."""
    mcp, ledger = workspace
    configs = fleet_configs(tmp_path, mcp, redis_server.url, namespace, processes=2, rounds=8)
    processes = [spawn(config) for config in configs]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"READY"
    deadline = time.monotonic() + 60
    while not ledger.exists() or len(ledger.read_text().splitlines()) < 20:
        assert time.monotonic() < deadline, "the fleet made no progress"
        time.sleep(0.05)
    redis_server.restart()
    wait_all(processes)
    results = results_of(configs)
    assert sorted(result["id"] for result in results) == expected_ids(configs), "a call lost its result"
    for result in results:
        # A call whose hold was lost after its request left is a TIMEOUT of unknown effect, never FAILED.
        assert result["status"] in ("ok", "failed", "timeout"), result
        if result["status"] != "ok":
            assert "fleet hold" in result["error"] or "Redis" in result["error"], result
    seen = read_ledger(ledger)
    assert seen.peak <= LIMIT, f"{seen.peak} calls ran at once on the server; the fleet limit is {LIMIT}"
    assert seen.write_overlaps == 0, f"a write overlapped another call {seen.write_overlaps} times"


def test_a_sigkilled_process_loses_its_hold_within_the_lease_bound(
    redis_server: RedisServer, namespace: str, anyio_backend_name: str
) -> None:
    """A process killed while holding a shared-state server frees it within lease_ttl + recheck (+ slack)."""
    ttl, recheck = 1.0, 0.2
    holder = spawn(
        {"mode": "hold", "redis": redis_server.url, "namespace": namespace, "shared_state": True, "ttl": ttl,
         "recheck": recheck, "backend": anyio_backend_name}
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"HELD"
        servers = {"ws": FleetServer(shared_state=True, max_write_time=0)}

        async def blocked_then_recovered() -> float:
            busy = RedisCoordinator(
                redis_server.url, namespace=namespace, servers=servers, lease_ttl=ttl, recheck=recheck, wait_timeout=1.0
            )
            async with busy:
                with pytest.raises(CoordinationError, match="within wait_timeout"):
                    async with busy.hold(server="ws", exclusive=False, on_lost=print):
                        pass
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            killed = anyio.current_time()
            fleet = RedisCoordinator(
                redis_server.url, namespace=namespace, servers=servers, lease_ttl=ttl, recheck=recheck
            )
            async with fleet, fleet.hold(server="ws", exclusive=True, on_lost=print):
                return anyio.current_time() - killed

        recovered = anyio.run(blocked_then_recovered, backend=anyio_backend_name)
        # The bound is ttl + recheck; the slack absorbs a loaded machine, not a missing recovery.
        assert recovered < ttl + recheck + 5.0, f"the killed process's hold blocked the fleet for {recovered:.1f}s"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def frozen_fleet(
    tmp_path: pathlib.Path, mcp: str, redis: str, namespace: str, backend: str, **options: Any
) -> tuple[list[dict[str, Any]], list[subprocess.Popen[bytes]]]:
    """Two processes on `backend`; the first stops itself (SIGSTOP) right after its second write's grant.

    The other has more to do, so it is still writing when the first resumes.
    """
    configs = fleet_configs(tmp_path, mcp, redis, namespace, processes=2, rounds=4)
    for index, config in enumerate(configs):
        config.update(backend=backend, agents=2, ttl=0.5, recheck=0.1, **options)
        if index == 0:
            config["freeze_after"] = 2
        else:
            config["rounds"] = 16
    processes = [spawn(config) for config in configs]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"READY"
    return configs, processes


def thaw_after(process: subprocess.Popen[bytes], seconds: float) -> None:
    """Wait until `process` froze itself, let the fleet run `seconds` without it, then resume it."""
    assert process.stdout is not None
    assert process.stdout.readline().strip() == b"FROZEN"
    time.sleep(seconds)  # the lease (0.5 s) ends and the other process takes the server meanwhile
    process.send_signal(signal.SIGCONT)


def test_a_holder_frozen_between_grant_and_send_never_writes_beside_the_next_one(
    tmp_path: pathlib.Path,
    redis_server: RedisServer,
    namespace: str,
    fenced_workspace: tuple[str, pathlib.Path],
    anyio_backend_name: str,
) -> None:
    """SIGSTOP for 3 ttl right after a grant: its call is given up before the send; 0 overlapping writes."""
    mcp, ledger = fenced_workspace

    configs, processes = frozen_fleet(tmp_path, mcp, redis_server.url, namespace, anyio_backend_name, fence=FENCE)
    thaw_after(processes[0], 1.0)
    wait_all(processes, timeout=60)
    results = results_of(configs)
    assert sorted(result["id"] for result in results) == expected_ids(configs), "a call lost its result"
    lost = [result for result in results if result["status"] != "ok"]
    assert lost and all("fleet hold" in result["error"] for result in lost), lost
    seen = read_ledger(ledger)
    assert seen.write_overlaps == 0, f"a write overlapped another call {seen.write_overlaps} times"


def test_a_late_write_that_got_past_the_holder_is_refused_by_the_fenced_server(
    tmp_path: pathlib.Path,
    redis_server: RedisServer,
    namespace: str,
    fenced_workspace: tuple[str, pathlib.Path],
    anyio_backend_name: str,
) -> None:
    """The holder never learns its lease ended (unchecked): its late write is refused by the token alone."""
    mcp, ledger = fenced_workspace

    configs, processes = frozen_fleet(
        tmp_path, mcp, redis_server.url, namespace, anyio_backend_name, fence=FENCE, unchecked=True
    )
    thaw_after(processes[0], 1.0)
    wait_all(processes, timeout=60)
    results = results_of(configs)
    assert sorted(result["id"] for result in results) == expected_ids(configs), "a call lost its result"
    refused = [result for result in results if result["status"] != "ok"]
    assert refused and all("fencing token" in result["error"] for result in refused), refused
    seen = read_ledger(ledger)
    assert seen.write_overlaps == 0, f"a write overlapped another call {seen.write_overlaps} times"


@pytest.mark.skipif(
    not os.environ.get("DISPATCHER_STRESS"),
    reason="a race on the real clock (the other process must still be writing when the frozen one resumes), "
    "which a loaded machine can lose: run it with make stress (DISPATCHER_STRESS=1)",
)
def test_the_oracle_an_unchecked_holder_on_an_unfenced_server_overlaps_writes(
    tmp_path: pathlib.Path,
    redis_server: RedisServer,
    namespace: str,
    workspace: tuple[str, pathlib.Path],
    anyio_backend_name: str,
) -> None:
    """Neither the check nor a fence: the late write reaches the server, and the ledger shows it overlapping."""
    mcp, ledger = workspace
    configs, processes = frozen_fleet(tmp_path, mcp, redis_server.url, namespace, anyio_backend_name, unchecked=True)
    thaw_after(processes[0], 1.0)
    wait_all(processes, timeout=60)
    # The frozen process's write started after the other process had been granted the server.
    assert read_ledger(ledger).calls == len(results_of(configs))
    assert any(entry.tool in WRITES for entry in Ledger(ledger).entries())
    assert read_ledger(ledger).write_overlaps > 0, "the checks cannot tell a late, unfenced write"


def open_write(ledger: pathlib.Path, by: str = "") -> bool:
    """Whether the ledger shows a write that started and has not ended (of a note whose name starts with `by`)."""
    return bool(Ledger(ledger).running(lambda e: e.tool in WRITES and e.arguments["name"].startswith(by)))


def test_repeated_flushalls_never_let_two_writes_overlap(
    tmp_path: pathlib.Path, redis_server: RedisServer, namespace: str, slow_workspace: tuple[str, pathlib.Path]
) -> None:
    """FLUSHALL four times, each while a write runs (seeded pauses): one result per call, 0 overlapping writes."""
    import random

    import redis as redis_py

    mcp, ledger = slow_workspace
    configs = fleet_configs(tmp_path, mcp, redis_server.url, namespace, processes=2, rounds=4)
    for config in configs:
        config.update(agents=3, ttl=0.5, recheck=0.1)
    processes = [spawn(config) for config in configs]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"READY"
    rng = random.Random(24)
    client = redis_py.Redis.from_url(redis_server.url)
    try:
        for _ in range(4):
            time.sleep(rng.uniform(0.2, 0.6))
            deadline = time.monotonic() + 10
            while not open_write(ledger) and time.monotonic() < deadline:
                time.sleep(0.005)
            client.flushall()  # under a write in flight: its hold is gone from Redis
    finally:
        client.close()
    wait_all(processes, timeout=90)
    results = results_of(configs)
    assert sorted(result["id"] for result in results) == expected_ids(configs), "a call lost its result"
    for result in results:
        # A call whose hold was lost after its request left is a TIMEOUT of unknown effect, never FAILED.
        assert result["status"] in ("ok", "failed", "timeout"), result
        if result["status"] != "ok":
            assert "fleet hold" in result["error"] or "Redis" in result["error"], result
    seen = read_ledger(ledger)
    assert seen.peak <= LIMIT, f"{seen.peak} calls ran at once on the server; the fleet limit is {LIMIT}"
    assert seen.write_overlaps == 0, f"a write overlapped another call {seen.write_overlaps} times"


# A write cut off mid-run (issue 24, point 4) ------------------------------------------------------------

WRITE = 1.0
"""Seconds each write runs on the uncancellable workspace, cancelled or not, its client alive or not."""
BOUND = 1.5
"""`max_write_time` where the test keeps a write's turn: longer than a write runs."""


def cut_off_write(
    tmp_path: pathlib.Path,
    redis: RedisServer,
    namespace: str,
    backend: str,
    fault: str,
    *,
    fenced: bool,
    max_write_time: float | None,
) -> tuple[Overlaps, list[dict[str, Any]]]:
    """Two processes writing to a workspace that finishes every write it started; `fault` strikes the first one's.

    ``kill``: the holder is SIGKILLed; ``freeze``: it is SIGSTOPped for 3 ttl; ``pause``: redis-server is
    SIGSTOPped for 0.8 s. The second process has writes queued behind it. Returns the ledger's overlaps and
    the results of the processes that lived.
    """
    options = ["--latency", str(WRITE), "--uncancellable", *(["--fence", FENCE] if fenced else [])]
    with contextlib.contextmanager(forkserver.http_workspace)(tmp_path, *options) as (mcp, ledger):
        configs = fleet_configs(tmp_path, mcp, redis.url, namespace, processes=2, rounds=1)
        for index, config in enumerate(configs):
            config.update(
                mode="writes",
                agents=1,
                rounds=(1, 2)[index],
                backend=(backend, "trio" if backend == "asyncio" else "asyncio")[index],
                ttl=0.5,
                recheck=0.1,
                # A Redis request may take 5 s, not the agent's 1 s: on a loaded machine a slower one fails the
                # queued call with a Redis error, which the checks below rightly refuse but which is no overlap.
                timeout=5.0,
                max_write_time=max_write_time,
                fence=FENCE if fenced else None,
            )
        processes = [spawn(config) for config in configs]
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == b"READY"
        deadline = time.monotonic() + 60
        while not open_write(ledger, "p0-"):
            assert time.monotonic() < deadline, "the first process never wrote"
            time.sleep(0.005)
        holder = processes[0]
        if fault == "kill":
            holder.kill()
            holder.wait(10)
            assert holder.stdout is not None
            holder.stdout.close()
            processes, configs = processes[1:], configs[1:]
        elif fault == "freeze":
            holder.send_signal(signal.SIGSTOP)
            time.sleep(1.5)
            holder.send_signal(signal.SIGCONT)
        else:
            assert redis.process is not None
            redis.process.send_signal(signal.SIGSTOP)
            time.sleep(0.8)
            redis.process.send_signal(signal.SIGCONT)
        wait_all(processes, timeout=60)
        return read_ledger(ledger), results_of(configs)


# SIGKILL of the holder runs in every form; its freeze and a pause of redis-server, a few seconds of real
# processes each, in the long form (make stress).
CUT_OFF_FAULTS = [
    "kill",
    *(
        pytest.param(fault, marks=pytest.mark.skipif(not os.environ.get("DISPATCHER_STRESS"), reason="make stress"))
        for fault in ("freeze", "pause")
    ),
]


@pytest.mark.parametrize("fault", CUT_OFF_FAULTS)
def test_a_write_cut_off_mid_run_never_runs_beside_the_next_one(
    tmp_path: pathlib.Path, redis_server: RedisServer, namespace: str, anyio_backend_name: str, fault: str
) -> None:
    """Holder killed or frozen, or Redis paused, mid-write on a server that finishes it: 0 overlapping writes.

    The holder runs on the test's backend: on asyncio the server is unfenced and `max_write_time` keeps the
    write's turn; on trio the server is fenced and `max_write_time` is its default for a fenced server (0):
    the late write is refused where it would take effect.
    """
    fenced = anyio_backend_name == "trio"
    seen, results = cut_off_write(
        tmp_path,
        redis_server,
        namespace,
        anyio_backend_name,
        fault,
        fenced=fenced,
        max_write_time=None if fenced else BOUND,
    )
    assert seen.write_overlaps == 0, f"a write overlapped another call {seen.write_overlaps} times"
    assert seen.calls >= 2, "the fault struck no write with another queued behind it"
    for result in results:
        if result["id"].startswith("p0-"):
            # Given up or not, the cut-off write may have run: never FAILED.
            assert result["status"] == "ok" or (result["status"], result["effect"]) == ("timeout", "unknown"), result
        else:
            # A loaded machine may answer a grant too late to trust its lease: that call never ran.
            late = result["status"] == "failed" and "too late to trust" in (result["error"] or "")
            assert result["status"] == "ok" or (late and result["effect"] == "never_ran"), result


@pytest.mark.parametrize("fault", CUT_OFF_FAULTS)
def test_the_oracle_without_max_write_time_or_a_fence_a_cut_off_write_overlaps_the_next(
    tmp_path: pathlib.Path, redis_server: RedisServer, namespace: str, fault: str
) -> None:
    """max_write_time=0 and no fence: the same cut-off write runs beside the next one (so the test above can fail)."""
    seen, _ = cut_off_write(tmp_path, redis_server, namespace, "asyncio", fault, fenced=False, max_write_time=0)
    assert seen.write_overlaps > 0, "the checks cannot tell a write that ran beside a cut-off one"
