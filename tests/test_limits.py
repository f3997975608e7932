"""A server cannot exhaust the client: answer sizes, tools/list_changed storms, suggestion work, name churn."""

from __future__ import annotations

import math
from typing import Literal

import anyio
import pytest
from trio.testing import MockClock

from dispatcher import Dispatcher, ToolCall
from dispatcher._connections import LISTING_BURST, LISTING_INTERVAL
from dispatcher.examples import serve_http

from .limits_server import LimitsServer, stdio

pytestmark = pytest.mark.anyio

Mode = Literal["auto", "legacy"]
MODES = pytest.mark.parametrize("mode", ["auto", "legacy"])

_HTTPX_GENERATORS = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <async_generator object "
    r"(EventSource|PoolByteStream|Response)\.\w+:pytest.PytestUnraisableExceptionWarning"
)
# A storm also leaves the SDK's 2026-07-28 HTTP client with unclosed generators under trio.
HTTP_MODES = pytest.mark.parametrize(
    "mode", [pytest.param("auto", marks=_HTTPX_GENERATORS), pytest.param("legacy", marks=_HTTPX_GENERATORS)]
)


def all_clocks() -> pytest.MarkDecorator:
    """Run a test on asyncio, trio, and trio under a virtual clock."""
    clock = MockClock(autojump_threshold=0)
    return pytest.mark.parametrize(
        "anyio_backend", ["asyncio", "trio", pytest.param(("trio", {"clock": clock}), id="trio-mock")]
    )


def listing_bound(elapsed: float) -> int:
    """The most listings a storm lasting `elapsed` seconds may cost: a burst, one per interval, and one after."""
    return LISTING_BURST + 1 + math.ceil(elapsed / LISTING_INTERVAL)


async def quiet(d: Dispatcher, server: str) -> int:
    """How many listings `server` served, once its coalesced listings have settled."""
    await anyio.sleep(LISTING_INTERVAL * 1.5)
    result = (await d.dispatch([ToolCall("n", "listed", {}, server=server)]))[0]
    assert result.ok, result.error
    assert result.result is not None
    return int(result.result.content[0].text)  # type: ignore[union-attr]


# 11b: tools/list_changed storms --------------------------------------------------------------------


@all_clocks()
@MODES
async def test_a_storm_costs_one_listing_per_interval_in_process(mode: Mode) -> None:
    """5,000 announcements spread over time cost at most one listing per interval, one at a time."""
    server = LimitsServer()
    async with Dispatcher() as d:
        await d.connect("storm", server, trusted=True, mode=mode)
        start = anyio.current_time()
        result = (await d.dispatch([ToolCall("s", "storm", {"count": 5000, "pause_every": 10})]))[0]
        elapsed = anyio.current_time() - start
        assert result.ok, result.error
        listings = await quiet(d, "storm")
    # The connect listing, then the storm's.
    assert 2 <= listings <= 1 + listing_bound(elapsed), (listings, elapsed)


@MODES
async def test_a_storm_over_stdio_costs_one_listing_per_interval(mode: Mode) -> None:
    """Over stdio too, a storm of announcements is listed at a bounded rate."""
    async with Dispatcher() as d:
        await d.connect("storm", stdio(), trusted=True, mode=mode)
        start = anyio.current_time()
        result = (await d.dispatch([ToolCall("s", "storm", {"count": 5000, "pause_every": 10})]))[0]
        elapsed = anyio.current_time() - start
        assert result.ok, result.error
        listings = await quiet(d, "storm")
    assert 2 <= listings <= 1 + listing_bound(elapsed), (listings, elapsed)


@HTTP_MODES
async def test_a_storm_over_http_leaves_other_servers_calls_alone(mode: Mode) -> None:
    """A storm from one HTTP server is listed at a bounded rate while a batch on another server runs through."""
    stormy = LimitsServer()
    calm = LimitsServer()
    async with serve_http(stormy) as url, Dispatcher(max_concurrency=64) as d:
        await d.connect("storm", url, trusted=True, mode=mode)
        await d.connect("calm", calm, trusted=True)
        batch = [ToolCall(f"e{i}", "echo", {"text": str(i)}, server="calm") for i in range(500)]
        baseline_start = anyio.current_time()
        await d.dispatch(batch)
        baseline = anyio.current_time() - baseline_start

        start = anyio.current_time()
        during = 0.0
        async with anyio.create_task_group() as tg:
            storm = tg.start_soon
            storm(d.dispatch, [ToolCall("s", "storm", {"count": 5000, "pause_every": 5}, server="storm")])
            await anyio.sleep(0.05)
            batch_start = anyio.current_time()
            results = await d.dispatch(batch)
            during = anyio.current_time() - batch_start
        elapsed = anyio.current_time() - start
        listings = await quiet(d, "storm")
    assert all(result.ok for result in results)
    assert [result.result.content[0].text for result in results if result.result] == [  # type: ignore[union-attr]
        str(i) for i in range(500)
    ]
    assert 2 <= listings <= 1 + listing_bound(elapsed), (listings, elapsed)
    # A generous band: the other server's batch is not held up by the storm's listings.
    assert during < 10 * baseline + 2.0, (during, baseline)
