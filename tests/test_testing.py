"""dispatcher.testing: faults injected into a real MCP server, and the ledger of what ran."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import anyio
import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from mcp.types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT, TextContent

import dispatcher.testing
from dispatcher.testing import Execution, FaultKind, InjectedFault, inject_faults

if TYPE_CHECKING:
    from collections.abc import Callable


def counter_server() -> tuple[MCPServer, list[str]]:
    """A server whose tools record their effects in a list, so a test can see whether they ran."""
    server = MCPServer("counter")
    effects: list[str] = []

    @server.tool()
    async def bump(key: str) -> str:
        """Record one effect."""
        effects.append(key)
        return f"bumped {key}"

    @server.tool()
    async def other(key: str) -> str:
        """Another tool, to check targeting."""
        effects.append(f"other:{key}")
        return key

    return server, effects


async def outcome_of(client: Client, tool: str, key: str, read_timeout: float | None = None) -> str:
    """What the client saw: 'ok', 'is_error' or the MCPError code."""
    try:
        result = await client.call_tool(tool, {"key": key}, read_timeout_seconds=read_timeout)
    except MCPError as exc:
        return str(exc.error.code)
    return "is_error" if result.is_error else "ok"


def test_public_names() -> None:
    """dispatcher.testing exports exactly its documented names, sorted."""
    assert dispatcher.testing.__all__ == sorted(dispatcher.testing.__all__)
    assert set(dispatcher.testing.__all__) == {
        "Execution",
        "FaultInjector",
        "FencedResource",
        "FaultKind",
        "HostileServer",
        "InjectedFault",
        "Outcome",
        "Strike",
        "inject_faults",
    }


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"rate": 1.5}, ValueError),
        ({"rate": -0.1}, ValueError),
        ({"rate": True}, ValueError),
        ({"kinds": ()}, ValueError),
        ({"kinds": ("explode",)}, ValueError),
        ({"strike": "during"}, ValueError),
        ({"tools": "bump"}, TypeError),
    ],
)
def test_bad_settings_are_rejected(kwargs: dict[str, Any], error: type[Exception]) -> None:
    """A rate outside 0..1, an unknown kind or strike, or a bare string of tools is refused."""
    server, _ = counter_server()
    installed = len(server.middleware)
    with pytest.raises(error):
        inject_faults(server, **kwargs)
    assert len(server.middleware) == installed, "a rejected injector was installed"


@pytest.mark.anyio
async def test_ledger_records_every_call() -> None:
    """Without faults every call runs normally and the ledger has its tool, arguments, outcome and times."""
    server, effects = counter_server()
    faults = inject_faults(server)
    async with Client(server) as client:
        assert await outcome_of(client, "bump", "a") == "ok"
        assert await outcome_of(client, "other", "b") == "ok"
        await client.list_tools()
    first, second = faults.ledger
    assert (first.index, first.tool, first.arguments, first.fault, first.body_ran, first.outcome) == (
        0,
        "bump",
        {"key": "a"},
        None,
        True,
        "ok",
    )
    assert second.tool == "other" and second.outcome == "ok"
    assert first.finished_at is not None and first.started_at <= first.finished_at <= second.started_at
    assert effects == ["a", "other:b"]
    assert faults.executions("bump") == [first] and faults.executions(arguments={"key": "b"}) == [second]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize(
    ("kind", "seen", "outcome"),
    [
        ("drop", str(CONNECTION_CLOSED), "error"),
        ("error", str(INTERNAL_ERROR), "error"),
        ("tool_error", "is_error", "tool_error"),
        ("hang", str(REQUEST_TIMEOUT), "cancelled"),
    ],
)
async def test_each_fault_as_the_client_sees_it(
    kind: FaultKind, seen: str, outcome: str, mode: Literal["auto", "legacy"]
) -> None:
    """Each kind reaches the client as documented, on both protocol eras, and the ledger says how it ended."""
    server, effects = counter_server()
    faults = inject_faults(server, rate=1.0, kinds=(kind,))
    async with Client(server, mode=mode) as client:
        # Only a hang needs the client to give up; the other faults answer at once, however loaded the machine.
        read_timeout = 0.2 if kind == "hang" else 30.0
        assert await outcome_of(client, "bump", "a", read_timeout=read_timeout) == seen
        with anyio.fail_after(10):  # the server sees the cancellation of a hang a little after the client gives up
            while not faults.ledger or faults.ledger[0].finished_at is None:  # noqa: ASYNC110 - the ledger has no event to wait on
                await anyio.sleep(0.01)
    (execution,) = faults.ledger
    assert execution.fault == kind and execution.strike == "before" and not execution.body_ran
    assert execution.outcome == outcome and execution.finished_at is not None
    assert effects == []


@pytest.mark.anyio
async def test_crash_raises_inside_the_server() -> None:
    """A crash is an unexpected exception in the handler; in process the client sees -32603."""
    server, _ = counter_server()
    seen: list[BaseException] = []

    async def spy(ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        try:
            return await call_next(ctx)
        except InjectedFault as exc:
            seen.append(exc)
            raise

    server.middleware.append(spy)
    faults = inject_faults(server, rate=1.0, kinds=("crash",))
    async with Client(server) as client:
        assert await outcome_of(client, "bump", "a") == str(INTERNAL_ERROR)
    assert len(seen) == 1 and "crashed" in str(seen[0])
    assert faults.ledger[0].outcome == "error"


@pytest.mark.anyio
@pytest.mark.parametrize(("strike", "ran"), [("before", False), ("after", True)])
async def test_strike_after_lets_the_tool_have_its_effect(strike: Literal["before", "after"], ran: bool) -> None:
    """A fault striking after the tool ran hides an effect that happened; one striking before prevents it."""
    server, effects = counter_server()
    faults = inject_faults(server, rate=1.0, kinds=("drop",), strike=strike)
    async with Client(server) as client:
        assert await outcome_of(client, "bump", "a") == str(CONNECTION_CLOSED)
    assert effects == (["a"] if ran else [])
    assert faults.ledger[0].body_ran is ran and faults.ledger[0].strike == strike


async def _fates(seed: int, calls: int = 60, **options: Any) -> list[tuple[str | None, str | None]]:
    server, _ = counter_server()
    faults = inject_faults(
        server, rate=0.5, seed=seed, kinds=("drop", "error", "tool_error"), strike="either", **options
    )
    async with Client(server) as client:
        for i in range(calls):
            await outcome_of(client, "bump", str(i))
    return [(execution.fault, execution.strike) for execution in faults.ledger]


@pytest.mark.anyio
async def test_the_seed_decides_the_faults() -> None:
    """The same seed and call order give the same faults; another seed gives others."""
    first, again, other = await _fates(7), await _fates(7), await _fates(8)
    assert first == again
    assert first != other
    assert {strike for _, strike in first} == {"before", "after", None}


@pytest.mark.anyio
async def test_rate_is_the_share_of_failing_calls() -> None:
    """At rate 0.3 about 30% of calls fail; the rate can be changed at any time."""
    server, _ = counter_server()
    faults = inject_faults(server, rate=0.3, seed=1)
    async with Client(server) as client:
        for i in range(600):
            await outcome_of(client, "bump", str(i))
        faults.rate = 0.0
        for i in range(50):
            assert await outcome_of(client, "bump", f"z{i}") == "ok"
    failed = sum(execution.fault is not None for execution in faults.ledger[:600])
    assert 0.25 * 600 < failed < 0.35 * 600
    with pytest.raises(ValueError, match="probability"):
        faults.rate = 2


@pytest.mark.anyio
async def test_only_the_targeted_tools_fail_but_every_call_is_recorded() -> None:
    """`tools` limits random faults to the named tools; the others still appear in the ledger."""
    server, _ = counter_server()
    faults = inject_faults(server, rate=1.0, tools=["bump"])
    async with Client(server) as client:
        assert await outcome_of(client, "bump", "a") == str(INTERNAL_ERROR)
        assert await outcome_of(client, "other", "b") == "ok"
    assert [execution.fault for execution in faults.ledger] == ["error", None]
    assert faults.tools == frozenset({"bump"})


@pytest.mark.anyio
async def test_fail_next_scripts_faults_in_order_and_by_arguments() -> None:
    """Scripted faults hit the next matching executions in order, then the tool behaves again."""
    server, _ = counter_server()
    faults = inject_faults(server)
    faults.fail_next("bump", "error", "tool_error")
    faults.fail_next("other", "drop", arguments={"key": "y"})
    async with Client(server) as client:
        assert await outcome_of(client, "other", "x") == "ok"
        assert await outcome_of(client, "bump", "a") == str(INTERNAL_ERROR)
        assert await outcome_of(client, "bump", "a") == "is_error"
        assert await outcome_of(client, "bump", "a") == "ok"
        assert await outcome_of(client, "other", "y") == str(CONNECTION_CLOSED)
        assert await outcome_of(client, "other", "y") == "ok"
    with pytest.raises(ValueError, match="fault kinds"):
        faults.fail_next("bump")


@pytest.mark.anyio
async def test_remove_stops_injecting_and_keeps_the_ledger() -> None:
    """After remove() calls run untouched and unrecorded; what was recorded stays."""
    server, _ = counter_server()
    faults = inject_faults(server, rate=1.0)
    async with Client(server) as client:
        assert await outcome_of(client, "bump", "a") == str(INTERNAL_ERROR)
        faults.remove()
        faults.remove()
        assert await outcome_of(client, "bump", "b") == "ok"
    assert len(faults.ledger) == 1
    assert isinstance(faults.ledger[0], Execution)


@pytest.mark.anyio
async def test_tool_error_result_text_names_the_fault() -> None:
    """An injected isError result says it was injected, so a test's output explains itself."""
    server, _ = counter_server()
    inject_faults(server, rate=1.0, kinds=("tool_error",))
    async with Client(server) as client:
        result = await client.call_tool("bump", {"key": "a"})
    assert result.is_error
    (content,) = result.content
    assert isinstance(content, TextContent) and "injected fault" in content.text
