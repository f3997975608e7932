"""Connections the dispatcher owns: the three transports, both protocol modes, reconnects, tool-list changes."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import socket
from typing import TYPE_CHECKING, Any, Literal

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.types import TextContent, ToolAnnotations

import dispatcher
from dispatcher import (
    CallStatus,
    ConfigurationError,
    Dispatcher,
    ReconnectPolicy,
    RetryPolicy,
    ServerConnectionError,
    ToolCall,
    ToolResult,
)
from dispatcher.examples import Workspace, serve_http

from . import forkserver
from .cuttable import CuttableTransport
from .httpx_generators import HTTPX_GENERATORS

if TYPE_CHECKING:
    from collections.abc import Callable


pytestmark = pytest.mark.anyio

Mode = Literal["auto", "legacy"]
MODES = pytest.mark.parametrize("mode", ["auto", "legacy"])

# Under trio, the SDK's legacy HTTP client leaves httpx async generators unclosed (tests/httpx_generators.py).
HTTP_MODES = pytest.mark.parametrize("mode", ["auto", pytest.param("legacy", marks=HTTPX_GENERATORS)])

# The folder holding the `dispatcher` package, so subprocesses import this checkout.
SOURCE_ROOT = str(pathlib.Path(dispatcher.__file__).resolve().parents[1])


def workspace_command(*options: str) -> StdioServerParameters:
    """The example workspace as a stdio subprocess of this checkout, forked from tests/forkserver.py's zygote."""
    pythonpath = os.pathsep.join(p for p in (SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)
    return forkserver.params(["-m", "dispatcher.examples.workspace", *options], {"PYTHONPATH": pythonpath})


def text(result: ToolResult) -> str:
    """The text of a result's single content block."""
    assert result.result is not None, result
    content = result.result.content[0]
    assert isinstance(content, TextContent)
    return content.text


def calls(*specs: tuple[str, dict[str, Any]]) -> list[ToolCall]:
    """Calls with ids c0, c1, ... from (tool, arguments) pairs."""
    return [ToolCall(f"c{i}", tool, arguments) for i, (tool, arguments) in enumerate(specs)]


async def eventually(condition: Callable[[], bool]) -> None:
    """Wait (up to 10 s) until `condition()` holds, for work done on the HTTP server's thread."""
    with anyio.fail_after(10):
        while not condition():  # noqa: ASYNC110  # the change comes from another thread: no event to wait on
            await anyio.sleep(0.01)


def tool_names(d: Dispatcher) -> set[str]:
    """The catalogue names of the callable tools."""
    return {entry.name for entry in d.tools()}


class Crashable:
    """A workspace reached through client connections that a test can cut or refuse, like a crash."""

    def __init__(self, workspace: Workspace, mode: str = "auto") -> None:
        self.workspace = workspace
        self.mode = mode
        self.connections = 0
        self.down = False
        self.live: set[anyio.CancelScope] = set()

    def client(self) -> Client:
        """The client factory to pass to `Dispatcher.connect`."""
        if self.down:
            raise ConnectionRefusedError("the server is down")
        self.connections += 1
        return Client(CuttableTransport(self.workspace.server, self.live), mode=self.mode)

    def crash(self) -> None:
        """Cut every open connection: the clients see their connection closed."""
        for scope in self.live:
            scope.cancel()


def test_new_names_are_exported() -> None:
    """The names this feature adds are part of the package's public surface."""
    assert {"DefinitionChange", "ServerConnectionError"} <= set(dispatcher.__all__)


# The three transports, on both protocol modes ----------------------------------------------------


@MODES
async def test_in_process_server(mode: Mode) -> None:
    """An in-process MCPServer: tools are listed with trusted hints, and calls run and return results."""
    workspace = Workspace()
    async with Dispatcher() as d:
        entries = await d.connect("ws", workspace.server, trusted=True, mode=mode)
        assert [entry.name for entry in entries] == list(Workspace.tool_names)
        assert {entry.name for entry in entries if entry.concurrent} == {"search_notes", "read_note", "fetch_url"}
        results = await d.dispatch(
            calls(("set_note", {"name": "a", "text": "x"}), ("read_note", {"name": "a"}), ("read_note", {"name": "b"}))
        )
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK, CallStatus.TOOL_ERROR]
    assert text(results[1]) == "x"
    assert all(r.server == "ws" for r in results)


@MODES
@pytest.mark.subprocess
async def test_stdio_subprocess_crash_and_reconnect(mode: Mode, tmp_path: pathlib.Path) -> None:
    """A stdio server that dies mid-call: that call FAILS, and the next call starts a fresh process."""
    # Every process exits abruptly on its second tools/call; notes live in a folder across processes.
    command = workspace_command("--root", str(tmp_path), "--exit-after", "2")
    async with Dispatcher() as d:
        await d.connect("ws", command, trusted=True, mode=mode)
        first = await d.dispatch(calls(("append_note", {"name": "log", "text": "one"})))
        crashed = await d.dispatch(calls(("append_note", {"name": "log", "text": "two"})))
        after = await d.dispatch(calls(("read_note", {"name": "log"})))
    assert first[0].ok
    assert crashed[0].status is CallStatus.FAILED
    assert crashed[0].error is not None and "connection to the server lost" in crashed[0].error
    assert "server 'ws'" in crashed[0].error
    assert after[0].ok and text(after[0]) == "one"


@HTTP_MODES
async def test_streamable_http_restart(mode: Mode) -> None:
    """An HTTP server that stops and comes back on the same port: the call meanwhile fails, then calls reconnect."""
    workspace = Workspace()
    async with Dispatcher() as d:
        # The server vanishes without waiting for open streams, as a crashed one would.
        async with serve_http(workspace.server, shutdown_timeout=0.1) as url:
            await d.connect("ws", url, trusted=True, mode=mode, reconnect=ReconnectPolicy(wait_initial=0.05))
            first = await d.dispatch(calls(("set_note", {"name": "a", "text": "x"})))
        down = await d.dispatch(calls(("read_note", {"name": "a"})))
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with serve_http(workspace.server, port=port, shutdown_timeout=0.1):
            # A call may still meet the reconnect backoff (it grew while the server was down, longer on a
            # loaded machine): calls are sent until one reconnects, for at most 30 s.
            with anyio.fail_after(30):
                while True:
                    back = await d.dispatch(calls(("read_note", {"name": "a"})))
                    if back[0].ok:
                        break
                    await anyio.sleep(0.05)
    assert first[0].ok
    assert down[0].status is CallStatus.FAILED
    assert "server 'ws'" in str(down[0].error)
    assert back[0].ok and text(back[0]) == "x", (down[0].error, back[0].error)


@HTTP_MODES
async def test_first_connection_failure_raises(mode: Mode) -> None:
    """Connecting to nothing raises ServerConnectionError, and the name stays free."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with Dispatcher() as d:
        with pytest.raises(ServerConnectionError, match="could not connect to server 'ws'"):
            await d.connect("ws", f"http://127.0.0.1:{port}/mcp", mode=mode, connect_timeout=5)
        await d.connect("ws", Workspace().server, mode=mode)
        assert "search_notes" in tool_names(d)


# Reconnects --------------------------------------------------------------------------------------


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
@MODES
async def test_calls_in_flight_when_the_connection_dies_get_results(mode: Mode) -> None:
    """Calls running when the connection is cut end FAILED; later calls share one fresh connection."""
    workspace = Workspace(latency_by_tool={"fetch_url": 30.0})
    server = Crashable(workspace, mode)
    async with Dispatcher() as d:
        await d.connect("ws", server.client, trusted=True)
        batch = d.batch()
        batch.submit_all(calls(*[("fetch_url", {"url": f"https://{i}.example/"}) for i in range(3)]))
        await anyio.wait_all_tasks_blocked()
        assert workspace.in_flight == 3
        server.crash()
        with anyio.fail_after(5):
            lost = await batch.wait()
        after = await d.dispatch(calls(*[("search_notes", {"query": str(i)}) for i in range(5)]))
    assert [r.status for r in lost] == [CallStatus.FAILED] * 3
    assert all("connection to the server lost" in str(r.error) for r in lost)
    assert all(r.ok for r in after)
    assert server.connections == 2


@pytest.mark.backends("trio-mockclock")
async def test_a_retried_call_reconnects() -> None:
    """With retries on, an idempotent call cut off by a crash is retried on a fresh connection."""
    workspace = Workspace(latency_by_tool={"set_note": 1.0})
    server = Crashable(workspace)
    async with Dispatcher(retry=RetryPolicy(seed=1)) as d:
        await d.connect("ws", server.client, trusted=True)
        batch = d.batch()
        batch.submit_all(calls(("set_note", {"name": "a", "text": "x"}), ("append_note", {"name": "b", "text": "y"})))
        await anyio.wait_all_tasks_blocked()
        server.crash()
        results = await batch.wait()
    assert results[0].ok and results[0].attempts == 2
    assert "connection to the server lost" in results[0].attempt_errors[0]
    assert results[1].ok and results[1].attempts == 1  # queued behind set_note: it ran once, after it
    assert server.connections == 2


@pytest.mark.backends("trio-mockclock")
async def test_failed_reconnects_back_off() -> None:
    """While the server is down, one attempt is made, then calls fail fast until the backoff has passed."""
    server = Crashable(Workspace())
    async with Dispatcher() as d:
        await d.connect("ws", server.client, trusted=True)
        server.down = True
        server.crash()
        await anyio.wait_all_tasks_blocked()
        read = ("search_notes", {"query": "x"})
        attempt = await d.dispatch(calls(read, read, read))
        fast = await d.dispatch(calls(read))
        await anyio.sleep(1.0)
        second = await d.dispatch(calls(read))
        await anyio.sleep(1.0)
        still_waiting = await d.dispatch(calls(read))  # the second failure doubled the backoff to 2 s
        server.down = False
        await anyio.sleep(1.0)
        back = await d.dispatch(calls(read))
    assert all("could not reconnect to server 'ws': ConnectionRefusedError" in str(r.error) for r in attempt)
    assert "server 'ws' is unreachable" in str(fast[0].error)
    assert "next reconnect attempt is in 1.0s" in str(fast[0].error)
    assert "could not reconnect" in str(second[0].error)
    assert "next reconnect attempt is in 1.0s" in str(still_waiting[0].error)
    assert back[0].ok
    assert server.connections == 2


@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_reconnect_lists_the_tools_again() -> None:
    """A reconnect re-lists the tools: one that disappeared while disconnected fails as removed."""
    workspace = Workspace()
    server = Crashable(workspace)
    async with Dispatcher() as d:
        # Not following changes, so nothing notices the crash before a call does.
        await d.connect("ws", server.client, follow_changes=False)
        server.crash()
        discovers = await d.dispatch(calls(("search_notes", {"query": "x"})))
        workspace.remove_tool("send_message")
        results = await d.dispatch(
            calls(("search_notes", {"query": "x"}), ("send_message", {"to": "bob", "text": "hi"}))
        )
    assert "connection to the server lost" in str(discovers[0].error)
    assert results[0].ok
    assert results[1].status is CallStatus.FAILED
    assert results[1].error == "tool 'send_message' was removed by server 'ws'"
    assert server.connections == 2


async def test_closing_the_dispatcher_closes_owned_clients() -> None:
    """Leaving the dispatcher's block closes the connections it owns."""
    server = Crashable(Workspace())
    async with Dispatcher() as d:
        await d.connect("a", server.client)
        await d.connect("b", server.client)
        assert len(server.live) == 2
    assert server.live == set()


async def test_user_owned_clients_stay_open() -> None:
    """A client passed to add_mcp_server is the user's: the dispatcher leaves it open."""
    workspace = Workspace()
    async with Client(workspace.server) as client:
        async with Dispatcher() as d:
            await d.add_mcp_server("ws", client)
        assert (await client.call_tool("search_notes", {"query": "x"})).is_error is False


async def test_connect_checks_its_arguments() -> None:
    """Bad targets, modes, timeouts, names and closed dispatchers are refused with advice."""
    workspace = Workspace()
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server)
        with pytest.raises(ConfigurationError, match="already registered"):
            await d.connect("ws", workspace.server)
        with pytest.raises(ConfigurationError, match="target must be"):
            await d.connect("x", 42)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="mode must be"):
            await d.connect("x", workspace.server, mode="2024")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=r"pass mode=\.\.\. to the Client"):
            await d.connect("x", lambda: Client(workspace.server), mode="legacy")
        with pytest.raises(ConfigurationError, match="connect_timeout"):
            await d.connect("x", workspace.server, connect_timeout=0)
        with pytest.raises(ConfigurationError, match=r"overrides name tools .* \['nope'\]"):
            await d.connect("x", workspace.server, overrides={"nope": ToolAnnotations(read_only_hint=True)})
        assert "x" not in {entry.server for entry in d.tools()}
        await d.connect("x", workspace.server)  # the name is free again after each failure
    with pytest.raises(dispatcher.DispatcherClosedError):
        await d.connect("y", workspace.server)


async def test_overrides_and_limits_apply_to_connected_servers() -> None:
    """Overrides and untrusted defaults work as for add_mcp_server."""
    workspace = Workspace()
    async with Dispatcher() as d:
        entries = await d.connect(
            "ws", workspace.server, overrides={"read_note": ToolAnnotations(read_only_hint=True)}, max_concurrency=2
        )
    concurrent = {entry.name for entry in entries if entry.concurrent}
    assert concurrent == {"read_note"}  # untrusted: only the user's own declaration counts


# Following tools/list_changed --------------------------------------------------------------------


@MODES
async def test_list_changed_in_process(mode: Mode) -> None:
    """A server's tools/list_changed is followed: new tools become callable, removed ones fail."""
    workspace = Workspace()
    workspace.remove_tool("send_message")
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server, trusted=True, mode=mode)
        before = await d.dispatch(calls(("send_message", {"to": "bob", "text": "hi"})))
        workspace.restore_tool("send_message")
        workspace.remove_tool("fetch_url")
        await workspace.notify_tools_changed()
        await anyio.wait_all_tasks_blocked()
        after = await d.dispatch(
            calls(("send_message", {"to": "bob", "text": "hi"}), ("fetch_url", {"url": "https://a.example/"}))
        )
        names = tool_names(d)
    assert before[0].status is CallStatus.FAILED and "unknown tool 'send_message'" in str(before[0].error)
    assert after[0].ok
    assert after[1].status is CallStatus.FAILED
    assert after[1].error == "tool 'fetch_url' was removed by server 'ws'"
    assert "fetch_url" not in names and "send_message" in names


@HTTP_MODES
async def test_list_changed_over_http(mode: Mode) -> None:
    """tools/list_changed is followed over streamable HTTP too."""
    workspace = Workspace()
    async with serve_http(workspace.server) as url, Dispatcher() as d:
        await d.connect("ws", url, trusted=True, mode=mode)
        workspace.remove_tool("fetch_url")
        await workspace.notify_tools_changed()
        await eventually(lambda: "fetch_url" not in tool_names(d))
        results = await d.dispatch(calls(("fetch_url", {"url": "https://a.example/"})))
    assert results[0].error == "tool 'fetch_url' was removed by server 'ws'"


async def test_follow_changes_can_be_turned_off() -> None:
    """With follow_changes=False the catalogue only changes on refresh()."""
    workspace = Workspace()
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server, follow_changes=False)
        workspace.remove_tool("fetch_url")
        await workspace.notify_tools_changed()
        await anyio.wait_all_tasks_blocked()
        assert "fetch_url" in tool_names(d)
        entries = await d.refresh("ws")
    assert "fetch_url" not in {entry.name for entry in entries}


async def test_a_server_without_subscriptions_still_connects() -> None:
    """A 2026-07-28 server that does not serve subscriptions/listen is used without following changes."""
    server = MCPServer("plain", subscriptions=False)

    def echo(text: str) -> str:
        return text

    server.add_tool(echo, annotations=ToolAnnotations(read_only_hint=True))
    async with Dispatcher() as d:
        await d.connect("plain", server, trusted=True)
        server.remove_tool("echo")
        before = tool_names(d)
        after = {entry.name for entry in await d.refresh("plain")}
    assert before == {"echo"} and after == set()


@MODES
async def test_refresh_a_user_owned_client(mode: Mode) -> None:
    """A server added with add_mcp_server is brought up to date by refresh()."""
    workspace = Workspace()
    async with Client(workspace.server, mode=mode) as client, Dispatcher() as d:
        await d.add_mcp_server("ws", client)
        workspace.remove_tool("delete_note")
        entries = await d.refresh("ws")
        results = await d.dispatch(calls(("delete_note", {"name": "a"})))
        with pytest.raises(ConfigurationError, match="no MCP server named 'nope'"):
            await d.refresh("nope")
    assert "delete_note" not in {entry.name for entry in entries}
    assert results[0].error == "tool 'delete_note' was removed by server 'ws'"


async def test_removed_tool_called_by_its_prefixed_name() -> None:
    """A removed tool's tombstone answers to its catalogue name, prefixed or not; no other tool takes it."""
    first, second = Workspace(), Workspace()
    async with Dispatcher() as d:
        await d.connect("one", first.server)
        await d.connect("two", second.server)
        assert {"read_note", "two__read_note"} <= tool_names(d)
        second.remove_tool("read_note")
        await second.notify_tools_changed()
        await anyio.wait_all_tasks_blocked()
        results = await d.dispatch(
            [
                ToolCall("a", "two__read_note", {"name": "x"}),
                ToolCall("b", "read_note", {"name": "x"}, server="two"),
                ToolCall("c", "read_note", {"name": "x"}),
            ]
        )
        first.remove_tool("read_note")
        second.restore_tool("read_note")
        await first.notify_tools_changed()
        await second.notify_tools_changed()
        # A listing is followed by a rest of a few times its length (LISTING_REST), which a loaded machine
        # can stretch past `wait_all_tasks_blocked`: wait for the catalogue the listings lead to instead (were
        # two's tool given the bare name, it never comes, and the assertion below says what came instead).
        with contextlib.suppress(TimeoutError):
            await eventually(lambda: {"two__read_note"} == tool_names(d) & {"two__read_note", "read_note"})
        names = tool_names(d)
        [bare] = await d.dispatch([ToolCall("d", "read_note", {"name": "x"})])
    assert [r.error for r in results[:2]] == ["tool 'read_note' was removed by server 'two'"] * 2
    assert results[2].server == "one" and results[2].status is CallStatus.TOOL_ERROR
    # one's name stays reserved for it: two's tool comes back under its own catalogue name.
    assert "two__read_note" in names and "read_note" not in names
    assert bare.error == "tool 'read_note' was removed by server 'one'"


# The guide ---------------------------------------------------------------------------------------

_GUIDE = pathlib.Path(SOURCE_ROOT) / "docs" / "mcp.md"


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, ["['ok', 'ok']"]),
        (1, ["['fetch_url', 'read_note', 'search_notes']", "[]"]),
        (2, ["search_notes True False", "read_note False False", "create_note False False", "set_note False True"]),
        (
            3,
            [
                "failed tool 'fetch_url' of server 'notes' is blocked: its definition changed since it was approved "
                "(annotations changed: readOnlyHint true -> false); it stays unavailable until the change is accepted",
                "fetch_url annotations changed: readOnlyHint true -> false",
                "True",
                "['fetch_url']",
            ],
        ),
    ],
)
@pytest.mark.subprocess
def test_the_guide_runs_as_written(index: int, expected: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Each example of docs/mcp.md runs and prints what the guide says it prints."""
    blocks = re.findall(r"```python\n(.*?)```", _GUIDE.read_text(), re.DOTALL)
    blocks = [block for block in blocks if not block.startswith("# Fragment: ")]
    assert len(blocks) == 4
    exec(compile(blocks[index], f"docs/mcp.md (example {index + 1})", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.splitlines() == expected
