"""One tiny iteration of the fleet benchmark's cost part: it runs and reports plausible figures."""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks import fleet

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer


def test_coordination_cost_reports_every_variant(redis_server: RedisServer) -> None:
    """The cost part times the four variants on one backend, each at a positive time per call."""
    config = fleet.Config(calls=3, repeat=1, backends=("asyncio",))
    cost = fleet.coordination_cost(config, redis_server.url)
    assert set(cost["asyncio"]) == {"no coordinator", "LocalCoordinator", "Redis, limit", "Redis, shared state"}
    assert all(stat.median > 0 for stat in cost["asyncio"].values())
    table = fleet._table(config, cost, [])
    assert "| asyncio | Redis, limit |" in table
