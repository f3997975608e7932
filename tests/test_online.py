"""The adaptive limit wired to real MCP servers (`_mcp._online`): what moves it, whose words count, what events show.

Every test runs on a virtual clock on both backends (trio's MockClock, and the asyncio loop of
`benchmarks._virtual` whose clock jumps the same way): latencies and waits are exact.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import REQUEST_TIMEOUT, ToolAnnotations
from trio.testing import MockClock

from benchmarks._virtual import VirtualEventLoop
from dispatcher import AdaptiveLimit, CallEvent, ConfigurationError, Dispatcher, ToolCall
from dispatcher.examples import Workspace

READ = "search_notes"


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"loop_factory": VirtualEventLoop}), id="asyncio-virtual"),
        pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mockclock"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Both backends, each on a virtual clock."""
    return request.param


def _calls(n: int, tool: str = READ, arguments: dict[str, Any] | None = None) -> list[ToolCall]:
    return [ToolCall(f"c{i}", tool, arguments if arguments is not None else {"query": "x"}) for i in range(n)]


@pytest.mark.anyio
async def test_the_limit_finds_a_saturating_servers_knee_and_events_show_it() -> None:
    """Bursts against a server that saturates at 3: the limit settles at 3, and CallEvent.limit carries it."""
    workspace = Workspace(latency=0.1, saturation=3)
    events: list[CallEvent] = []
    async with Dispatcher(max_concurrency=None, retry=None, on_event=events.append) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True, max_concurrency=AdaptiveLimit(initial=12))
        for _ in range(6):
            await dispatcher.dispatch(_calls(30))
        assert dispatcher.server_limit("ws") == 3
    limits = [event.limit or 0 for event in events if event.kind == "finished"]
    assert 0 not in limits and limits[-1] == 3 and max(limits) >= 12 and len(set(limits)) > 2
    assert all(event.limit is None for event in events if event.kind == "queued")
    assert all(event.limit_scope == "server" for event in events if event.kind == "finished")  # this process's own


@pytest.mark.anyio
async def test_a_trusted_servers_rate_limit_cuts_the_limit() -> None:
    """A trusted server's -32000 'rate limit exceeded' halves the limit (once for the round that met it)."""
    workspace = Workspace(latency=0.1, rate_limit=10, rate_burst=2)
    async with Dispatcher(max_concurrency=None, retry=None) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True, max_concurrency=AdaptiveLimit(initial=16))
        results = await dispatcher.dispatch(_calls(16))
        assert workspace.rate_limited > 0
        assert dispatcher.server_limit("ws") == 8
    assert sum(not result.ok for result in results) == workspace.rate_limited


@pytest.mark.anyio
@pytest.mark.parametrize("trusted", [False, True])
async def test_an_untrusted_servers_words_never_move_its_limit(trusted: bool) -> None:
    """The same rate-limit errors cut a trusted server's limit and leave an untrusted one's (reads by override) be."""
    workspace = Workspace(latency=0.1, rate_limit=10, rate_burst=2)
    read = {READ: ToolAnnotations(read_only_hint=True)}
    async with Dispatcher(max_concurrency=None, retry=None) as dispatcher:
        await dispatcher.connect(
            "ws", workspace.server, trusted=trusted, overrides=read, max_concurrency=AdaptiveLimit(initial=16)
        )
        await dispatcher.dispatch(_calls(16))
        assert workspace.rate_limited > 0
        limit = dispatcher.server_limit("ws")
        assert limit is not None
        assert limit == 8 if trusted else limit >= 16  # untrusted: not cut (its answers at the limit may grow it)


def _chatty_server() -> MCPServer[Any]:
    server = MCPServer("chatty")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str) -> str:
        """Says it is rate limited, in an ordinary error result."""
        await anyio.sleep(0.05)
        raise ToolError("429 Too Many Requests: rate limit exceeded, retry after 1 s")

    return server


@pytest.mark.anyio
@pytest.mark.parametrize("trusted", [False, True])
async def test_rate_limit_words_in_a_result_count_only_from_a_trusted_server(trusted: bool) -> None:
    """An isError result saying '429 ... rate limit' cuts a trusted server's limit, never an untrusted one's."""
    read = {"lookup": ToolAnnotations(read_only_hint=True)}
    async with Dispatcher(max_concurrency=None, retry=None) as dispatcher:
        await dispatcher.connect(
            "chatty", _chatty_server(), trusted=trusted, overrides=read, max_concurrency=AdaptiveLimit(initial=8)
        )
        results = await dispatcher.dispatch(_calls(8, "lookup", {"key": "k"}))
        assert all(result.status.value == "tool_error" for result in results)
        limit = dispatcher.server_limit("chatty")
        assert limit is not None
        assert limit == (4 if trusted else 8)  # untrusted: not cut, and error results grow nothing either


def _refusing_server(state: dict[str, bool]) -> MCPServer[Any]:
    server = MCPServer("refusing")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str) -> str:
        """Refuses at once (an error result, no overload words) while `state["refusing"]`; else works for 0.1 s."""
        if state["refusing"]:
            raise ToolError("no such key")
        await anyio.sleep(0.1)
        return key

    return server


@pytest.mark.anyio
@pytest.mark.parametrize("trusted", [False, True])
async def test_error_results_answered_at_once_neither_grow_the_limit_nor_poison_its_baseline(trusted: bool) -> None:
    """A server that refuses 256 calls at once (error results, no words about load), then works at 0.1 s with room
    for all: the refusals are no latency samples. Before, they grew the limit (4 to 13 here, to the ceiling in a
    closed loop) at no cost, and real answers, 10^4 times slower than the refusals, were then taken for load."""
    state = {"refusing": True}
    async with Dispatcher(max_concurrency=None, retry=None) as dispatcher:
        await dispatcher.connect("refusing", _refusing_server(state), trusted=trusted, max_concurrency="auto")
        for _ in range(4):
            results = await dispatcher.dispatch(_calls(64, "lookup", {"key": "k"}))
            assert all(result.status.value == "tool_error" for result in results)
        assert dispatcher.server_limit("refusing") == 4
        state["refusing"] = False
        results = await dispatcher.dispatch(_calls(64, "lookup", {"key": "k"}))
        assert all(result.ok for result in results)
        limit = dispatcher.server_limit("refusing")
        assert limit is not None and limit >= 4


@pytest.mark.anyio
async def test_a_timeout_cuts_the_limit_of_any_server() -> None:
    """Calls cut off at call_timeout cut even an untrusted server's limit: no answer in time is observed, not said."""
    workspace = Workspace(latency=5.0)
    read = {READ: ToolAnnotations(read_only_hint=True)}
    async with Dispatcher(max_concurrency=None, retry=None, call_timeout=1.0) as dispatcher:
        await dispatcher.connect("ws", workspace.server, overrides=read, max_concurrency=AdaptiveLimit(initial=8))
        results = await dispatcher.dispatch(_calls(8))
        assert all(result.status.value == "timeout" for result in results)
        assert dispatcher.server_limit("ws") == 4


@pytest.mark.anyio
async def test_writes_run_alone_and_leave_the_limit_where_it_is() -> None:
    """A batch of writes on an adaptive server runs one at a time and its answers do not move the limit."""
    workspace = Workspace(latency=0.1, saturation=1)
    async with Dispatcher(max_concurrency=None, retry=None) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True, max_concurrency="auto")
        results = await dispatcher.dispatch(
            [ToolCall(f"w{i}", "set_note", {"name": f"n{i}", "text": "t"}) for i in range(6)]
        )
        assert all(result.ok for result in results)
        assert dispatcher.server_limit("ws") == AdaptiveLimit().start
    assert max(run.in_flight_at_start for run in workspace.ledger) == 1


@pytest.mark.anyio
async def test_max_concurrency_auto_is_accepted_and_nonsense_refused() -> None:
    """'auto' works on add_mcp_server too; a misspelt string is refused before anything connects."""
    from mcp import Client

    workspace = Workspace()
    async with Client(workspace.server) as client, Dispatcher() as dispatcher:
        with pytest.raises(ConfigurationError, match="'auto' or an AdaptiveLimit"):
            await dispatcher.add_mcp_server("ws", client, max_concurrency="automatic")  # type: ignore[arg-type]
        await dispatcher.add_mcp_server("ws", client, trusted=True, max_concurrency="auto")
        assert dispatcher.server_limit("ws") == 4
        with pytest.raises(ConfigurationError, match="no MCP server named 'nope'"):
            dispatcher.server_limit("nope")


def _answers_timeout_server() -> MCPServer[Any]:
    server = MCPServer("liar")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str) -> str:
        """Answers at once with the SDK's timeout code, as if it had timed out."""
        await anyio.sleep(0.01)
        raise MCPError(code=REQUEST_TIMEOUT, message="Request 'tools/call' timed out")

    return server


@pytest.mark.anyio
async def test_an_untrusted_server_answering_the_timeout_code_does_not_cut_its_limit() -> None:
    """A -32001 the server answers with at once is its word: an untrusted server's limit stays where it was."""
    read = {"lookup": ToolAnnotations(read_only_hint=True)}
    async with Dispatcher(max_concurrency=None, retry=None) as dispatcher:
        await dispatcher.connect(
            "liar", _answers_timeout_server(), overrides=read, max_concurrency=AdaptiveLimit(initial=8)
        )
        for _ in range(3):
            results = await dispatcher.dispatch(_calls(8, "lookup", {"key": "k"}))
            assert all(result.status.value == "timeout" for result in results)
        limit = dispatcher.server_limit("liar")
        assert limit is not None and limit >= 8


@pytest.mark.anyio
async def test_the_sdks_own_read_timeout_cuts_an_untrusted_servers_limit() -> None:
    """A user's client whose read timeout elapses: observed, not said, so even an untrusted server's limit is cut."""
    workspace = Workspace(latency=5.0)
    read = {READ: ToolAnnotations(read_only_hint=True)}
    async with (
        Client(workspace.server, read_timeout_seconds=1.0) as client,
        Dispatcher(max_concurrency=None, retry=None) as dispatcher,
    ):
        await dispatcher.add_mcp_server("ws", client, overrides=read, max_concurrency=AdaptiveLimit(initial=8))
        results = await dispatcher.dispatch(_calls(8))
        assert all(result.status.value == "timeout" for result in results)
        assert dispatcher.server_limit("ws") == 4


def _huge_retry_after_server() -> MCPServer[Any]:
    server = MCPServer("huge")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str) -> str:
        """Rate limited, with a Retry-After too large for a float in its data (JSON's ints have no bound)."""
        await anyio.sleep(0.01)
        raise MCPError(code=-32000, message="rate limit exceeded", data={"retryAfter": 10**400})

    return server


@pytest.mark.anyio
async def test_a_trusted_servers_retry_after_too_large_for_a_float_is_ignored() -> None:
    """The overload still counts and the call keeps the server's error (not an OverflowError of the parser)."""
    async with Dispatcher(max_concurrency=None, retry=None) as dispatcher:
        await dispatcher.connect(
            "huge", _huge_retry_after_server(), trusted=True, max_concurrency=AdaptiveLimit(initial=8, max_wait=2.0)
        )
        results = await dispatcher.dispatch(_calls(8, "lookup", {"key": "k"}))
        assert all(result.error == "the server answered with error -32000: rate limit exceeded" for result in results)
        assert dispatcher.server_limit("huge") == 4
