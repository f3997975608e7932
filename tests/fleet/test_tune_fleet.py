"""`tune --fleet`: the fleet-wide limit swept by real processes sharing it through a real Redis.

The server is the example workspace over streamable HTTP with its ledger, so the concurrency the server
saw is checked from its own records. No figure of speed is asserted: only what the limit guarantees
(never more in flight than the setting) and that the fleet really ran calls together under a setting
that allows it.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING

import pytest
import redis

from dispatcher import ConfigurationError
from dispatcher._core._errors import FleetTuneError
from dispatcher.cli import main
from dispatcher.tuning import tune
from dispatcher.tuning._fleet import shares
from tests import forkserver
from tests.ledger import Ledger

if TYPE_CHECKING:
    from collections.abc import Iterator

    from benchmarks._redis import RedisServer


@pytest.fixture
def workspace(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """tests/fleet/conftest.py's workspace (HTTP, with a ledger), forked from tests/forkserver.py's zygote."""
    yield from forkserver.http_workspace(tmp_path)


def children() -> dict[int, str]:
    """This process's children, by pid, with their command lines (from /proc)."""
    found = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                found[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
    return found


async def setting_started(client: redis.Redis) -> None:
    """Return once a fleet setting has written its keys to Redis (within 120 s)."""
    import anyio

    with anyio.fail_after(120):
        while not await anyio.to_thread.run_sync(lambda: client.keys("dispatcher-tune-*")):  # noqa: ASYNC110
            await anyio.sleep(0.1)  # Redis has no event to wait on


async def endless_setting(url: str, redis_url: str) -> None:
    """One fleet setting of two processes that measures for 600 s, long past any test: it must be stopped."""
    from dispatcher import ToolCall
    from dispatcher.tuning._fleet import fleet_measure

    workload = [ToolCall("0", "search_notes", {"query": "a"}, server="server")]
    await fleet_measure(
        url, workload, redis=redis_url, processes=2, limit=2, clients=2, warmup=0, calls=None,
        duration=600.0, trusted=True, server="server", mode="auto", call_timeout=None, connect_timeout=30.0,
    )  # fmt: skip


def ledger_peak(path: pathlib.Path) -> int:
    """The most calls the server ran at once, from its ledger."""
    return Ledger(path).peak()


@pytest.mark.anyio
async def test_a_fleet_sweep_measures_the_fleet_wide_limit_with_several_processes(
    redis_server: RedisServer, workspace: tuple[str, pathlib.Path]
) -> None:
    """Two processes, six callers, settings 1 and 3: the server never sees more than 3, the fleet reaches past 1."""
    url, ledger = workspace
    report = await tune(
        url, "reads", [1, 3], trusted=True, calls=24, clients=6, fleet=redis_server.url, processes=2, repeats=1
    )
    assert report.knob == "fleet" and report.processes == 2
    assert report.to_json()["processes"] == 2
    assert "FleetServer(limit=" in report.how_to_apply
    one, three = report.settings
    assert (one.limit, three.limit) == (1, 3)
    assert one.errors == three.errors == 0
    # 24 calls split between 2 processes: more than one process's 12 shows that both were measured (a loaded
    # machine may cut a few off at the end of the window).
    assert one.calls > 12 and three.calls > 12, "each setting measured the calls of both processes"
    assert one.in_flight <= 1.05, f"{one.in_flight} in flight on average under a fleet-wide limit of 1"
    assert three.in_flight <= 3.05
    assert three.in_flight > 1.2, "the fleet never ran calls together under a limit of 3"
    assert ledger_peak(ledger) <= 3, "the server ran more calls at once than the largest fleet-wide setting"
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.keys("dispatcher-tune-*") == [], "a setting's fleet left keys in Redis"
    finally:
        client.close()


def test_the_fleet_sweep_from_the_command_line(
    redis_server: RedisServer, workspace: tuple[str, pathlib.Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`dispatcher tune --fleet URL --processes 2` prints the fleet-wide table and a FleetServer recommendation."""
    url, ledger = workspace
    argv = [
        "tune",
        "--url",
        url,
        "--trusted",
        "--synthetic",
        "reads",
        "--range",
        "2",
        "--calls",
        "12",
        "--repeats",
        "1",
        "--quiet",
    ]
    assert main([*argv, "--fleet", redis_server.url, "--processes", "2", "--clients", "4"]) == 0
    out = capsys.readouterr().out
    assert "tuning the fleet-wide limit (2 processes sharing it through Redis)" in out
    assert "recommended: RedisCoordinator(..., servers={...: FleetServer(limit=2)})" in out
    assert ledger_peak(ledger) <= 2


def test_fleet_options_that_cannot_work_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--fleet without --url, with --per-server, and --processes without --fleet: usage errors (exit 2)."""
    stdio = ["tune", "--stdio", "python -m x", "--synthetic", "reads", "--fleet", "redis://127.0.0.1:1/0"]
    assert main(stdio) == 2
    assert "--fleet needs --url" in capsys.readouterr().err
    url = ["tune", "--url", "http://127.0.0.1:9/mcp", "--synthetic", "reads"]
    assert main([*url, "--fleet", "redis://127.0.0.1:1/0", "--per-server"]) == 2
    assert "leave out --per-server" in capsys.readouterr().err
    assert main([*url, "--processes", "3"]) == 2
    assert "--processes applies to a --fleet sweep only" in capsys.readouterr().err


@pytest.mark.anyio
async def test_a_fleet_sweep_without_redis_fails_before_starting_processes() -> None:
    """An unreachable Redis: the sweep fails at once, saying so; a non-HTTP target or bad count is refused."""
    with pytest.raises(FleetTuneError, match=r"cannot reach Redis at redis://127\.0\.0\.1:1/0"):
        await tune("http://127.0.0.1:9/mcp", "reads", [1], fleet="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError, match="streamable HTTP URL"):
        await tune(object(), "reads", [1], fleet="redis://127.0.0.1:1/0")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="processes must be"):
        await tune("http://127.0.0.1:9/mcp", "reads", [1], fleet="redis://127.0.0.1:1/0", processes=0)
    with pytest.raises(ConfigurationError, match="from 1 to 256"):
        await tune("http://127.0.0.1:9/mcp", "reads", [1], fleet="redis://127.0.0.1:1/0", processes=100_000)


def test_the_load_is_split_across_the_processes() -> None:
    """Callers and calls are split in near-equal whole shares that add up to the total."""
    assert shares(7, 3) == [3, 2, 2]
    assert shares(2, 4) == [1, 1, 0, 0]
    assert sum(shares(200, 6)) == 200


@pytest.mark.anyio
async def test_a_sweep_cancelled_mid_setting_stops_its_processes_and_leaves_no_keys(
    redis_server: RedisServer, workspace: tuple[str, pathlib.Path]
) -> None:
    """Cancelled while its processes run (Ctrl-C), a setting kills them and deletes its keys; no password on argv."""
    import anyio

    url, _ = workspace
    client = redis.Redis.from_url(redis_server.url)
    seen: dict[int, str] = {}

    async def watch(scope: anyio.CancelScope) -> None:
        await setting_started(client)
        seen.update(children())
        scope.cancel()

    try:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, scope)
                await endless_setting(url, redis_server.url)
        assert scope.cancelled_caught
        fleet = {pid: line for pid, line in seen.items() if "dispatcher.tuning._fleet" in line}
        assert len(fleet) == 2, f"the sweep's processes were not seen: {seen}"
        assert not [line for line in fleet.values() if redis_server.url in line], "the Redis URL is on a command line"
        assert not set(fleet) & set(children()), "a process of the cancelled sweep is still running"
        assert client.keys("dispatcher-tune-*") == [], "a cancelled setting left keys in Redis"
    finally:
        client.close()


@pytest.mark.anyio
async def test_a_process_killed_mid_setting_fails_the_sweep_saying_so(
    redis_server: RedisServer, workspace: tuple[str, pathlib.Path]
) -> None:
    """A process of the fleet killed mid-setting: the sweep fails naming the signal, and leaves no keys."""
    import os
    import signal

    import anyio

    url, _ = workspace
    client = redis.Redis.from_url(redis_server.url)

    async def kill_one() -> None:
        await setting_started(client)
        for pid, line in (await anyio.to_thread.run_sync(children)).items():
            if "dispatcher.tuning._fleet" in line:
                os.kill(pid, signal.SIGKILL)
                return
        raise AssertionError("no process of the sweep was found")

    try:
        caught: FleetTuneError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_one)
            try:
                await endless_setting(url, redis_server.url)
            except FleetTuneError as exc:
                caught = exc
        assert caught is not None, "the sweep did not fail"
        assert "a process of the fleet failed (killed by signal 9)" in str(caught)
        assert "RuntimeWarning" not in str(caught)
        assert client.keys("dispatcher-tune-*") == [], "a failed setting left keys in Redis"
    finally:
        client.close()


@pytest.mark.anyio
async def test_a_fleet_setting_cut_short_by_max_time_is_kept_as_partial(
    redis_server: RedisServer, slow_workspace: tuple[str, pathlib.Path]
) -> None:
    """--max-time mid-setting: the fleet's processes close their windows there and the setting is kept, partial."""
    import anyio

    # 0.2 s calls, so that a call is running at the deadline (with 30 ms calls, one run of the suite on a
    # loaded machine had none there to cut off).
    url, _ = slow_workspace
    began = anyio.current_time()
    # A window of 600 s: only the budget can close it. 60 s: on a loaded machine the processes take 20 s and more
    # to import what they need and connect, before they measure anything.
    report = await tune(
        url, "reads", [2], trusted=True, calls=None, duration=600.0, fleet=redis_server.url, processes=2,
        repeats=1, max_time=60.0,
    )  # fmt: skip
    took = anyio.current_time() - began
    assert report.cut_short == "max_time"
    (setting,) = report.settings
    assert setting.partial and report.to_json()["settings"][0]["partial"] is True
    assert setting.calls > 0 and setting.elapsed > 0, "nothing measured before the budget ran out"
    assert setting.cut_off >= 1, "the calls running at the deadline were not counted as cut off"
    assert report.recommended == 2
    # Generous: the budget, the grace to close up, and a loaded machine's process exits.
    assert took < 60.0 + 15.0, f"the sweep took {took:.1f} s for a budget of 60 s"
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.keys("dispatcher-tune-*") == [], "a setting cut short left keys in Redis"
    finally:
        client.close()
