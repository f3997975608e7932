"""Adversarial review of issue 26: odd inputs to `tune` and the online limit that once hung or misled."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from dispatcher import AdaptiveLimit, CallEvent, ConfigurationError, Dispatcher, ToolCall
from dispatcher.cli import main
from dispatcher.examples import Workspace
from dispatcher.tuning import tune


@pytest.mark.anyio
async def test_a_huge_setting_fails_before_connecting() -> None:
    """A setting of 1e20 once spawned as many callers and planned 2e20 warm-up calls: the sweep never ended
    and its memory grew. It is a configuration error, raised before the server is reached."""
    server = Workspace().server
    with pytest.raises(ConfigurationError, match="at most 10000"):
        await tune(server, "reads", (1, 10**20), calls=3)
    with pytest.raises(ConfigurationError, match="clients must be"):
        await tune(server, "reads", (1, 2), calls=3, clients=10**20)


def test_a_huge_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """The command says what is accepted (exit 2), for --range and --to alike, with no traceback."""
    for argv in (["--range", "1,99999999999999999999"], ["--from", "1", "--to", "99999999999999999999"]):
        code = main(["tune", "--stdio", "python -c pass", "--synthetic", "reads", *argv])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "at most 10000" in err
        assert "Traceback" not in err


def _hostile(words: list[str], *, latency: float = 0.1) -> MCPServer[Any]:
    """A read-only tool whose first answer is an error result with `words[0]`, the rest ordinary answers."""
    server = MCPServer("hostile")
    said: list[str] = list(words)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def look(n: int) -> str:
        await anyio.sleep(latency)
        if said:
            raise ToolError(said.pop(0))
        return f"rate limit exceeded, retry after 1000 (just text) {n}"

    return server


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
@pytest.mark.parametrize(
    ("words", "trusted", "paused"),
    [
        ("rate limit exceeded, retry after 0", True, 0.0),
        ("rate limit exceeded, retry after -1", True, 0.0),
        ("rate limit exceeded, retry after nan", True, 0.0),
        ("rate limit exceeded, retry after 1e9", True, 0.0),
        ("rate limit exceeded, retry after 1000000000", True, 5.0),  # capped at max_wait
        ("rate limit exceeded, retry after " + "9" * 400, True, 0.0),  # not a finite number: named none
        ("rate limit exceeded, retry after 1000000000", False, 0.0),  # an untrusted server's words: no pause
    ],
)
async def test_a_retry_after_pauses_only_within_bounds(words: str, trusted: bool, paused: float) -> None:
    """Odd Retry-Afters hold a trusted server's next calls at most `max_wait`; an untrusted one's hold nothing.

    Ordinary results that say "rate limit" never count; every call gets one result, in request order."""
    setting = AdaptiveLimit(floor=1, ceiling=8, initial=2, max_wait=5.0)
    async with Dispatcher(max_concurrency=None, retry=None) as dispatcher:
        await dispatcher.connect("h", _hostile([words]), trusted=trusted, max_concurrency=setting)
        first = await dispatcher.dispatch([ToolCall("a", "look", {"n": 0})])
        assert [r.call_id for r in first] == ["a"] and not first[0].ok
        began = anyio.current_time()
        calls = [ToolCall(f"c{i}", "look", {"n": i}) for i in range(6)]
        results = await dispatcher.dispatch(calls)
        took = anyio.current_time() - began
        assert [r.call_id for r in results] == [c.id for c in calls] and all(r.ok for r in results)
        limit = dispatcher.server_limit("h")
        assert limit is not None and 1 <= limit <= 8
    assert paused <= took < paused + 0.1 * 6 + 1e-6, took


def _pumping(pattern: str) -> MCPServer[Any]:
    """A read-only tool whose latency is set to pump the limit.

    "oscillate": alternate bursts of 1 ms and 500 ms answers; "first-fast": the first call in flight of each
    burst answers in 1 ms, every other in 300 ms."""
    server = MCPServer("pump")
    state = {"n": 0, "in_flight": 0}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def look(n: int) -> str:
        state["n"] += 1
        state["in_flight"] += 1
        try:
            if pattern == "oscillate":
                await anyio.sleep(0.001 if (state["n"] // 7) % 2 else 0.5)
            else:
                await anyio.sleep(0.001 if state["in_flight"] == 1 else 0.3)
        finally:
            state["in_flight"] -= 1
        return str(n)

    return server


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
@pytest.mark.parametrize("pattern", ["oscillate", "first-fast"])
async def test_a_pumping_server_keeps_its_limit_within_bounds(pattern: str) -> None:
    """Latency shaped to pump the limit up and down: it stays in floor..ceiling, every call gets one result
    in request order, and the finished events carry a limit in those bounds."""
    events: list[CallEvent] = []
    setting = AdaptiveLimit(floor=2, ceiling=12, initial=4)
    async with Dispatcher(max_concurrency=None, retry=None, on_event=events.append) as dispatcher:
        await dispatcher.connect("p", _pumping(pattern), trusted=True, max_concurrency=setting)
        for burst in range(12):
            calls = [ToolCall(f"b{burst}c{i}", "look", {"n": i}) for i in range(40)]
            results = await dispatcher.dispatch(calls)
            assert [r.call_id for r in results] == [c.id for c in calls] and all(r.ok for r in results)
            limit = dispatcher.server_limit("p")
            assert limit is not None and 2 <= limit <= 12
    limits = [e.limit for e in events if e.kind == "finished"]
    assert len(limits) == 12 * 40 and all(x is not None and 2 <= x <= 12 for x in limits)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_writes_run_alone_and_a_silent_server_times_out_to_the_floor() -> None:
    """Under an adaptive limit a write still runs alone; a server that stops answering is cut to the floor by
    its timeouts (once per round), and every call still gets its one result, in request order."""
    state = {"in_flight": 0, "beside_write": 0, "silent": False}
    server = MCPServer("mixed")

    async def run(write: bool) -> str:
        state["in_flight"] += 1
        try:
            if write and state["in_flight"] > 1:
                state["beside_write"] += 1
            await anyio.sleep(3600 if state["silent"] else 0.05)
            if write and state["in_flight"] > 1:
                state["beside_write"] += 1
        finally:
            state["in_flight"] -= 1
        return "ok"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def look(n: int) -> str:
        return await run(False)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    async def put(n: int) -> str:
        return await run(True)

    setting = AdaptiveLimit(floor=2, ceiling=16, initial=8)
    async with Dispatcher(max_concurrency=None, retry=None, call_timeout=1.0) as dispatcher:
        await dispatcher.connect("m", server, trusted=True, max_concurrency=setting)
        calls = [ToolCall(f"c{i}", "put" if i % 5 == 0 else "look", {"n": i}) for i in range(30)]
        results = await dispatcher.dispatch(calls)
        assert [r.call_id for r in results] == [c.id for c in calls] and all(r.ok for r in results)
        assert state["beside_write"] == 0
        state["silent"] = True
        for burst in range(4):
            calls = [ToolCall(f"s{burst}c{i}", "look", {"n": i}) for i in range(8)]
            results = await dispatcher.dispatch(calls)
            assert [r.call_id for r in results] == [c.id for c in calls] and not any(r.ok for r in results)
        assert dispatcher.server_limit("m") == 2


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_stop_during_the_online_run_is_reported_as_interrupted() -> None:
    """Ctrl-C (the stop event) while `--online` runs after the sweep once ended the run with no online
    result and no word of the interruption (exit status 0): every setting was measured, so the cut was
    forgotten. The report says it was interrupted, and the online result is missing for that reason."""
    stop = anyio.Event()
    server = MCPServer("counted")
    answered = {"n": 0}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def look(query: str) -> str:
        await anyio.sleep(0.01)
        answered["n"] += 1
        if answered["n"] == 80:  # the sweep's ~50 calls are in: the online run is under way
            stop.set()
        return query

    report = await tune(server, "reads", (1, 2), calls=20, repeats=1, trusted=True, online=True, stop=stop)
    assert answered["n"] >= 80
    assert report.online is None
    assert report.cut_short == "interrupted"
