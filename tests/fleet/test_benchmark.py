"""One tiny iteration of the fleet benchmarks (the cost part, one cell of the windows): they run and report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks import fleet, fleet_windows

if TYPE_CHECKING:
    import pathlib

    from benchmarks._redis import RedisServer


def test_coordination_cost_reports_every_variant(redis_server: RedisServer) -> None:
    """The cost part times the four variants on one backend, each at a positive time per call."""
    config = fleet.Config(calls=3, repeat=1, backends=("asyncio",))
    cost = fleet.coordination_cost(config, redis_server.url)
    assert set(cost["asyncio"]) == {"no coordinator", "LocalCoordinator", "Redis, limit", "Redis, shared state"}
    assert all(stat.median > 0 for stat in cost["asyncio"].values())
    table = fleet._table(config, cost, [])
    assert "| asyncio | Redis, limit |" in table


def test_the_windows_benchmark_measures_overlaps_refusals_and_the_handover() -> None:
    """fleet_windows.measure: overlapping effective writes, their longest overlap, fenced refusals, B's handover."""
    records = [
        {"event": "start", "pid": 1, "seq": 0, "at": 10.0, "arguments": {"name": "a-0"}},
        {"event": "start", "pid": 1, "seq": 1, "at": 11.0, "arguments": {"name": "b-0"}},
        {"event": "end", "pid": 1, "seq": 0, "at": 11.5, "outcome": "ok"},
        {"event": "end", "pid": 1, "seq": 1, "at": 12.0, "outcome": "ok"},
        {"event": "start", "pid": 1, "seq": 2, "at": 12.0, "arguments": {"name": "b-1"}},
        {"event": "end", "pid": 1, "seq": 2, "at": 12.5, "outcome": "fenced"},
    ]
    assert fleet_windows.measure(records, fault_at=10.5) == (1, 0.5, 1, 0.5)
    assert fleet_windows.measure(records[:1] + records[2:3], fault_at=10.5) == (0, 0.0, 0, None)
    grid = fleet_windows.cells(fleet_windows.QUICK)
    assert {cell.fault for cell in grid} == set(fleet_windows.FAULTS)
    assert len(grid) == len(fleet_windows.FAULTS) * len(fleet_windows.PROTECTIONS)


def test_one_cell_of_the_windows_benchmark_runs(redis_server: RedisServer, tmp_path: pathlib.Path) -> None:
    """A killed holder under a fencing server: its late write is refused, nothing overlaps, B writes after."""
    cell = fleet_windows.Cell("SIGKILL", "fenced", None)
    run = fleet_windows.run_cell(cell, redis_server, tmp_path)
    assert (run.overlaps, run.refused, run.cut_off) == (0, 1, "killed"), run
    # Refused: B's write reached the server while A's still ran, so the turn did not wait for it.
    assert run.handover is not None, run
    assert "| SIGKILL | fenced | 1 | 0 |" in fleet_windows.table({cell: [run]})
