"""A server cannot exhaust the client: answer sizes, tools/list_changed storms, suggestion work, name churn."""

from __future__ import annotations

import difflib
import math
from typing import Any, Literal

import anyio
import anyio.lowlevel
import pytest

from dispatcher import CallStatus, Dispatcher, ToolCall
from dispatcher._core import _catalog
from dispatcher._core._catalog import MAX_TOMBSTONES
from dispatcher._mcp._connections import LISTING_BURST, LISTING_INTERVAL, LISTING_REST
from dispatcher._mcp._session import MAX_TOOLS
from dispatcher._mcp._transport import DEFAULT_MAX_ANSWER_BYTES
from dispatcher.examples import serve_http

from .httpx_generators import HTTPX_GENERATORS
from .limits_server import LimitsServer, stdio

pytestmark = pytest.mark.anyio

Mode = Literal["auto", "legacy"]
MODES = pytest.mark.parametrize("mode", ["auto", "legacy"])

# A storm also leaves the SDK's 2026-07-28 HTTP client with unclosed generators under trio.
HTTP_MODES = pytest.mark.parametrize(
    "mode", [pytest.param("auto", marks=HTTPX_GENERATORS), pytest.param("legacy", marks=HTTPX_GENERATORS)]
)


STORM = {"count": 1000, "pause_every": 2}
"""A storm of announcements: 500 pauses of 1 ms, so at least half a second, and ~150 times the listings it may
cost (a burst of 4, then one a second)."""


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


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
@MODES
@pytest.mark.slow
async def test_a_storm_costs_one_listing_per_interval_in_process(mode: Mode) -> None:
    """1,000 announcements spread over half a second cost at most one listing per interval, one at a time."""
    server = LimitsServer()
    async with Dispatcher() as d:
        await d.connect("storm", server, trusted=True, mode=mode)
        start = anyio.current_time()
        result = (await d.dispatch([ToolCall("s", "storm", STORM)]))[0]
        elapsed = anyio.current_time() - start
        assert result.ok, result.error
        listings = await quiet(d, "storm")
    # The connect listing, then the storm's.
    assert 2 <= listings <= 1 + listing_bound(elapsed), (listings, elapsed)


@pytest.mark.backends("trio-mockclock")
@MODES
@pytest.mark.slow
async def test_slow_listings_take_a_bounded_share_of_the_time(mode: Mode) -> None:
    """A server whose listing takes 0.5 s, announcing for 10 s, is listed with a rest after each listing."""
    server = LimitsServer(list_delay=0.5)
    async with Dispatcher() as d:
        await d.connect("slow", server, trusted=True, mode=mode)
        start = anyio.current_time()
        # An announcement every 5 ms, 500 times as often as the listings can follow: 2,000 in the 10 s.
        storm = {"count": 2_000, "pause_every": 1, "pause": 0.005}
        [result] = await d.dispatch([ToolCall("s", "storm", storm)])
        elapsed = anyio.current_time() - start
        assert result.ok, result.error
        await anyio.sleep(10)
    listings = server.listings - 1  # the connect listing
    # Each listing of the storm takes 0.5 s and is followed by a rest of 4 times that (the bucket alone
    # would allow about 14: 4 at once, then one a second).
    assert LISTING_REST == 4.0
    assert 9 <= elapsed <= 11, elapsed
    assert 2 <= listings <= 2 + math.ceil(elapsed / (0.5 * 5)), listings


@MODES
@pytest.mark.subprocess
async def test_a_storm_over_stdio_costs_one_listing_per_interval(mode: Mode) -> None:
    """Over stdio too, a storm of announcements is listed at a bounded rate."""
    async with Dispatcher() as d:
        await d.connect("storm", stdio(), trusted=True, mode=mode)
        start = anyio.current_time()
        result = (await d.dispatch([ToolCall("s", "storm", STORM)]))[0]
        elapsed = anyio.current_time() - start
        assert result.ok, result.error
        listings = await quiet(d, "storm")
    assert 2 <= listings <= 1 + listing_bound(elapsed), (listings, elapsed)


@HTTP_MODES
@pytest.mark.slow
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


# 11c: suggestions for unknown names ----------------------------------------------------------------

Transport = Literal["in-process", "stdio"]
TRANSPORTS = pytest.mark.parametrize("transport", ["in-process", "stdio"])


def target(transport: Transport, *options: str, **kwargs: int) -> Any:
    """The limits server in process, or as a stdio subprocess with the matching options."""
    return LimitsServer(**kwargs) if transport == "in-process" else stdio(*options)


@TRANSPORTS
@pytest.mark.subprocess
async def test_misspelt_names_against_a_huge_catalogue_cost_bounded_work(
    transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 misspelt names against 5,000 tools compare a bounded number of names each, and still suggest well."""
    compared: list[int] = []
    real = difflib.get_close_matches

    def counting(word: str, possibilities: Any, n: int = 3, cutoff: float = 0.6) -> list[str]:
        possibilities = list(possibilities)
        compared.append(len(possibilities))
        return real(word, possibilities, n, cutoff)

    monkeypatch.setattr(difflib, "get_close_matches", counting)
    async with Dispatcher() as d:
        await d.connect("many", target(transport, "--many", many=5000), trusted=True)
        assert len(d.tools()) > 5000
        calls = [
            ToolCall(f"m{i}", f"{('get', 'list', 'create', 'update', 'delete')[i % 5]}_recrod_{i}") for i in range(1000)
        ]
        ticks = 0
        gaps: list[float] = []

        async def heartbeat() -> None:
            nonlocal ticks
            last = anyio.current_time()
            while True:
                await anyio.lowlevel.checkpoint()
                now = anyio.current_time()
                gaps.append(now - last)
                last = now
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeat)
            await anyio.lowlevel.checkpoint()
            results = await d.dispatch(calls)
            tg.cancel_scope.cancel()
    assert all(result.status is CallStatus.FAILED for result in results)
    assert len(compared) == 1000
    assert max(compared) <= _catalog._MAX_CANDIDATES
    # The index still finds the tool a typo meant.
    assert "did you mean 'get_record_0'" in str(results[0].error)
    assert sum("did you mean" in str(result.error) for result in results) >= 990
    # A generous band: the loop got turns during the batch (main stalled it for seconds at a time).
    assert ticks > 0 and max(gaps) < 1.0, max(gaps)


async def test_a_huge_name_is_suggested_for_from_its_start() -> None:
    """An unknown name of a megabyte costs no more than one of a hundred characters."""
    async with Dispatcher() as d:
        await d.connect("many", LimitsServer(many=100), trusted=True)
        [result] = await d.dispatch([ToolCall("1", "get_recrod_0" + "x" * 1_000_000)])
    assert result.status is CallStatus.FAILED and len(str(result.error)) < 500


# 11d: a server that churns its tool names --------------------------------------------------------


@TRANSPORTS
@pytest.mark.subprocess
async def test_a_churning_server_keeps_names_and_tombstones_bounded(transport: Transport) -> None:
    """Each listing a fresh set of 200 names: tombstones stay at MAX_TOMBSTONES, the oldest dropped."""
    async with Dispatcher() as d:
        await d.connect("churn", target(transport, "--churn", churn=200), follow_changes=False)
        await d.connect("calm", LimitsServer())
        calm_names = {entry.name for entry in d.tools() if entry.server == "calm"}
        for _ in range(12):
            await d.refresh("churn")
        catalog = d._catalog
        tombstones = catalog._removed["churn"]
        names = [name for (server, _), name in catalog._names.items() if server == "churn"]
        [oldest, newest, calm] = await d.dispatch(
            [
                ToolCall("1", "gen0_0", server="churn"),
                ToolCall("2", "gen10_0", server="churn"),
                ToolCall("3", "echo", {"text": "hi"}, server="calm"),
            ]
        )
        # An untrusted server's new tools await review: listed (blocked), not callable.
        live = {entry.name for entry in d.tools() if entry.server == "churn"} | {
            change.tool for change in d.pending_changes("churn")
        }
    assert len(tombstones) == MAX_TOMBSTONES
    assert len(names) == MAX_TOMBSTONES + len(live)
    assert len(catalog._issued) == len(catalog._names)
    assert oldest.status is CallStatus.FAILED and "has no tool" in str(oldest.error)  # dropped, forgotten
    assert newest.error == "tool 'gen10_0' was removed by server 'churn'"  # recent: still a tombstone
    # The other server's names are untouched by the churn.
    assert calm.ok and calm_names <= {entry.name for entry in d.tools()}


# 11a: the size of one answer -----------------------------------------------------------------------


def texts(results: list[Any]) -> list[str]:
    return [
        result.result.content[0].text if result.ok else f"{result.status.value}: {result.error}" for result in results
    ]


async def check_answer_cap(d: Dispatcher, name: str) -> None:
    """The big answer fails alone; calls beside it and after it succeed on the same connection."""
    [before] = await d.dispatch([ToolCall("p", "pid", {}, server=name)])
    results = await d.dispatch(
        [
            ToolCall("big", "big", {"size": 200_000}, server=name),
            ToolCall("small", "big", {"size": 20_000}, server=name),
            ToolCall("echo", "echo", {"text": "still here"}, server=name),
        ]
    )
    [after] = await d.dispatch([ToolCall("p", "pid", {}, server=name)])
    big, small, echo = results
    assert big.status is CallStatus.FAILED, texts(results)
    assert big.attempts == 1  # deterministic: never retried, although the tool is idempotent and trusted
    assert "over the limit of 100,000" in str(big.error) and "max_answer_bytes" in str(big.error)
    assert small.ok and echo.ok, texts(results)
    assert before.ok and after.ok and texts([before]) == texts([after])  # the same connection, not a reconnect


@MODES
@pytest.mark.subprocess
async def test_an_answer_over_the_cap_fails_alone_over_stdio(mode: Mode) -> None:
    """Over stdio, an answer larger than max_answer_bytes fails that call alone; the process keeps serving."""
    async with Dispatcher() as d:
        await d.connect("big", stdio(), trusted=True, mode=mode, max_answer_bytes=100_000)
        await check_answer_cap(d, "big")


@HTTP_MODES
async def test_an_answer_over_the_cap_fails_alone_over_http(mode: Mode) -> None:
    """Over streamable HTTP on 127.0.0.1, the same: one call fails, the connection goes on."""
    async with serve_http(LimitsServer()) as url, Dispatcher() as d:
        await d.connect("big", url, trusted=True, mode=mode, max_answer_bytes=100_000)
        await check_answer_cap(d, "big")


@MODES
@pytest.mark.subprocess
async def test_a_notification_over_the_cap_is_dropped_over_stdio(mode: Mode) -> None:
    """A huge log notification is dropped; the call that sent it gets its answer."""
    async with Dispatcher() as d:
        await d.connect("big", stdio(), trusted=True, mode=mode, max_answer_bytes=100_000)
        [result] = await d.dispatch([ToolCall("s", "shout", {"size": 300_000})])
    assert result.ok and texts([result]) == ["shouted"]


@pytest.mark.subprocess
async def test_a_tool_list_over_the_cap_fails_connect_with_a_clear_error() -> None:
    """A listing page larger than the cap is refused: connect says why."""
    from dispatcher import ServerConnectionError

    with pytest.raises(ServerConnectionError, match="over the limit of 100,000"):
        async with Dispatcher() as d:
            await d.connect("many", stdio("--many"), max_answer_bytes=100_000)


@pytest.mark.subprocess
async def test_without_a_cap_the_answer_comes_through() -> None:
    """The oracle: with max_answer_bytes=None the same answer reaches the caller, so the check above is the cap's."""
    async with Dispatcher() as d:
        await d.connect("big", stdio(), trusted=True, max_answer_bytes=None)
        [result] = await d.dispatch([ToolCall("big", "big", {"size": 200_000})])
    assert result.ok and len(texts([result])[0]) == 200_000


@pytest.mark.subprocess
async def test_the_default_cap_admits_a_megabyte_and_is_validated() -> None:
    """The default (16 MiB) lets ordinary large answers through; a cap that is not an int >= 1024 is refused."""
    from dispatcher import ConfigurationError

    assert DEFAULT_MAX_ANSWER_BYTES == 16 * 2**20
    async with Dispatcher() as d:
        await d.connect("big", stdio(), trusted=True)
        [result] = await d.dispatch([ToolCall("big", "big", {"size": 1_000_000})])
        for bad in (0, 10, 1.5, True, "1MB"):
            with pytest.raises(ConfigurationError, match="max_answer_bytes must be an int >= 1024"):
                await d.connect("other", stdio(), max_answer_bytes=bad)  # type: ignore[arg-type]
    assert result.ok


async def test_a_server_listing_too_many_tools_is_refused() -> None:
    """More than MAX_TOOLS tools from one server fails connect with a clear error; the dispatcher goes on."""
    from dispatcher import ServerConnectionError

    async with Dispatcher() as d:
        with pytest.raises(ServerConnectionError, match="lists more than 10,000 tools"):
            await d.connect("huge", LimitsServer(many=MAX_TOOLS + 1))
        await d.connect("calm", LimitsServer())
        [result] = await d.dispatch([ToolCall("1", "echo", {"text": "hi"})])
    assert result.ok


@HTTP_MODES
async def test_the_default_cap_admits_answers_of_a_few_megabytes_over_http(mode: Mode) -> None:
    """Over HTTP the cap is the one limit: a 2 MB answer passes (the SDK's own 1 MiB SSE bound is set by it)."""
    async with serve_http(LimitsServer()) as url, Dispatcher() as d:
        await d.connect("big", url, trusted=True, mode=mode)
        [result] = await d.dispatch([ToolCall("b", "big", {"size": 2_000_000})])
    assert result.ok, result.error
    assert len(texts([result])[0]) == 2_000_000


@HTTP_MODES
async def test_an_answer_far_over_the_cap_over_http_fails_once(mode: Mode) -> None:
    """An answer far over the cap, refused by the SDK's event bound, is the same clear error and is not retried."""
    server = LimitsServer()
    async with serve_http(server) as url, Dispatcher() as d:
        await d.connect("big", url, trusted=True, mode=mode, max_answer_bytes=100_000)
        [result] = await d.dispatch([ToolCall("b", "big", {"size": 1_000_000})])
        [after] = await d.dispatch([ToolCall("e", "echo", {"text": "still here"})])
    assert result.status is CallStatus.FAILED
    assert "over the limit of 100,000 bytes" in str(result.error), result.error
    assert result.attempts == 1 and server.bigs == 1
    assert after.ok
