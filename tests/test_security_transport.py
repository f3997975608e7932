"""An untrusted server's answers, and a model's odd arguments, cannot break a connection or other calls.

Each behaviour runs through real MCP servers: in process, as a stdio subprocess and over streamable
HTTP (`tests/transport_server.py`), on asyncio and trio. Connections are made through a client factory
that counts them, so a test sees whether the dispatcher tore a connection down; over stdio the
serving process's id shows whether the server was restarted.
"""

from __future__ import annotations

import ast
import math
import pathlib
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import JSONRPCRequest, TextContent, ToolAnnotations

import dispatcher
from dispatcher import (
    BatchError,
    CallStatus,
    ConfigurationError,
    Dispatcher,
    DispatcherClosedError,
    ReconnectPolicy,
    RetryPolicy,
    ToolCall,
    ToolResult,
)
from dispatcher._core._errors import ArgumentError
from dispatcher._mcp._session import check_arguments
from dispatcher.examples import Workspace, serve_http

from . import transport_server
from .test_connections import Crashable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult

pytestmark = pytest.mark.anyio

Kind = Literal["in-process", "stdio", "http"]
TRANSPORTS = pytest.mark.parametrize("kind", ["in-process", "stdio", "http"])

# Retries that cost no time worth speaking of, for trusted idempotent tools.
QUICK_RETRY = RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.004, seed=0)


class Target:
    """Where a test server is reached, and a client factory that counts the connections made to it."""

    def __init__(self, address: MCPServer[Any] | str | Any) -> None:
        self.address = address
        self.connections = 0

    def client(self) -> Client:
        """The client factory to pass to `Dispatcher.connect`."""
        self.connections += 1
        return Client(self.address)


@asynccontextmanager
async def serving(kind: Kind) -> AsyncIterator[Target]:
    """The test server, reached in process, over stdio or over HTTP."""
    server = transport_server.build()
    if kind == "http":
        async with serve_http(server, shutdown_timeout=0.5) as url:
            yield Target(url)
    elif kind == "stdio":
        yield Target(transport_server.stdio())
    else:
        yield Target(server)


def text(result: ToolResult) -> str:
    """The text of a result's single content block."""
    assert result.result is not None, result
    content = result.result.content[0]
    assert isinstance(content, TextContent)
    return content.text


async def serving_pid(d: Dispatcher) -> str:
    """Which process serves the connection now (over stdio, a new one after a restart)."""
    [result] = await d.dispatch([ToolCall("pid", "pid")])
    assert result.ok, result.error
    return text(result)


# 7. A server's error reply is an answer, not a lost connection ------------------------------------


@TRANSPORTS
@pytest.mark.subprocess
async def test_a_server_error_answer_fails_that_call_alone(kind: Kind) -> None:
    """A tool answering -32000 fails alone: its siblings in flight succeed, and the connection stays up."""
    async with serving(kind) as target, Dispatcher(retry=None) as d:
        await d.connect("s", target.client, trusted=True)
        before = await serving_pid(d)
        results = await d.dispatch(
            [
                ToolCall("e0", "echo", {"key": "a", "delay": 0.2}),
                ToolCall("l0", "limited", {"key": "x"}),
                ToolCall("l1", "limited", {"key": "y"}),
                ToolCall("e1", "echo", {"key": "b", "delay": 0.2}),
            ]
        )
        after = await serving_pid(d)
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.FAILED, CallStatus.FAILED, CallStatus.OK]
    assert results[1].error == "the server answered with error -32000: rate limit exceeded for x"
    assert [text(results[0]), text(results[3])] == ["a", "b"]
    assert target.connections == 1, "the connection was torn down"
    assert before == after, "the server was restarted"


@TRANSPORTS
@pytest.mark.subprocess
async def test_a_storm_of_server_errors_keeps_the_connection(kind: Kind) -> None:
    """Many -32000 answers in one batch, retried for a trusted idempotent tool, never reconnect the server."""
    async with serving(kind) as target, Dispatcher(retry=QUICK_RETRY) as d:
        await d.connect("s", target.client, trusted=True)
        calls = [ToolCall(f"l{i}", "limited", {"key": str(i)}) for i in range(10)]
        calls += [ToolCall(f"e{i}", "echo", {"key": str(i)}) for i in range(10)]
        results = await d.dispatch(calls)
        [tries] = await d.dispatch([ToolCall("t", "tries")])
    assert all(r.status is CallStatus.FAILED and r.attempts == 3 for r in results[:10])
    assert all("after 3 attempts" in str(r.error) for r in results[:10])
    assert all(r.ok for r in results[10:])
    # The documented policy: -32000 may be transient, so a trusted idempotent tool is retried.
    assert text(tries) == "30"
    assert target.connections == 1


@TRANSPORTS
@pytest.mark.subprocess
async def test_an_untrusted_server_error_answer_is_not_retried(kind: Kind) -> None:
    """An untrusted server's -32000 ends its call at once, and its connection stays up."""
    async with serving(kind) as target, Dispatcher(retry=QUICK_RETRY) as d:
        await d.connect("s", target.client, trusted=False)
        [limited] = await d.dispatch([ToolCall("l", "limited", {"key": "x"})])
        [echo] = await d.dispatch([ToolCall("e", "echo", {"key": "fine"})])
    assert limited.status is CallStatus.FAILED and limited.attempts == 1
    assert echo.ok and text(echo) == "fine"
    assert target.connections == 1


async def test_a_lost_connection_is_still_a_lost_connection() -> None:
    """Guard of the rule above: a connection that really closed is still found lost and replaced."""
    server = Crashable(Workspace(latency_by_tool={"fetch_url": 30.0}))
    async with Dispatcher(retry=None) as d:
        await d.connect("ws", server.client, trusted=True)
        batch = d.batch()
        batch.submit(ToolCall("f", "fetch_url", {"url": "https://a.example/"}))
        await anyio.wait_all_tasks_blocked()
        server.crash()
        with anyio.fail_after(10):
            [lost] = await batch.wait()
        [after] = await d.dispatch([ToolCall("s", "search_notes", {"query": "x"})])
    assert lost.status is CallStatus.FAILED and "connection to the server lost" in str(lost.error)
    assert after.ok and server.connections == 2


# 8. -32602 and -32601 are never retried --------------------------------------------------------


def cut_after_answer(address: object, answered: anyio.Event, cut: anyio.Event) -> Client:
    """A client whose `echo("cut")` fails in its transport right after another call got the server's answer.

    The answer of the other call is handed to the dispatcher only once the transport failure has been
    seen, as happens when a connection breaks while an answer is on its way in.
    """

    class CutAfterAnswer(Client):
        async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, *a: Any, **k: Any) -> Any:
            if name == "echo" and arguments is not None and arguments.get("key") == "cut":
                await answered.wait()
                cut.set()
                raise anyio.BrokenResourceError
            try:
                result: CallToolResult = await super().call_tool(name, arguments, *a, **k)
            except MCPError:
                answered.set()
                await cut.wait()
                raise
            return result

    return CutAfterAnswer(address)  # type: ignore[arg-type]


@TRANSPORTS
@pytest.mark.subprocess
async def test_invalid_params_is_never_retried_even_when_the_connection_breaks_meanwhile(kind: Kind) -> None:
    """A -32602 answer stays -32602 (FAILED, one attempt) while a sibling's connection loss is handled first."""
    answered, cut = anyio.Event(), anyio.Event()
    async with serving(kind) as target, Dispatcher(retry=QUICK_RETRY) as d:
        await d.connect("s", lambda: cut_after_answer(target.address, answered, cut), trusted=True)
        with anyio.fail_after(30):
            results = await d.dispatch(
                [ToolCall("bad", "bad_params", {"key": "x"}), ToolCall("cut", "echo", {"key": "cut"})]
            )
    bad = results[0]
    assert bad.status is CallStatus.FAILED
    assert bad.attempts == 1, bad.attempt_errors
    assert bad.error == "the server rejected the arguments: the server does not like 'x'"


@TRANSPORTS
@pytest.mark.subprocess
async def test_method_not_found_and_invalid_params_are_final(kind: Kind) -> None:
    """-32601 and -32602 answers end a trusted idempotent call after one attempt, and keep the connection."""
    async with serving(kind) as target, Dispatcher(retry=QUICK_RETRY) as d:
        await d.connect("s", target.client, trusted=True)
        results = await d.dispatch(
            [ToolCall("bad", "bad_params", {"key": "x"}), ToolCall("none", "unsupported", {"key": "y"})]
        )
    assert [(r.status, r.attempts) for r in results] == [(CallStatus.FAILED, 1), (CallStatus.FAILED, 1)]
    assert results[1].error == "the server does not support the request: nothing serves 'y'"
    assert target.connections == 1


# Any code point, lone surrogates included (hypothesis leaves them out of text by default).
ANY_TEXT = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | ANY_TEXT,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(ANY_TEXT, children, max_size=4),
        max_leaves=12,
    )
)
def test_arguments_are_refused_exactly_when_the_transport_cannot_encode_them(value: object) -> None:
    """check_arguments refuses a value iff the SDK's own message encoder (as stdio sends it) fails on it."""
    arguments = {"key": value}
    message = JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/call", params={"name": "t", "arguments": arguments})
    try:
        message.model_dump_json(by_alias=True, exclude_unset=True).encode()
    except ValueError:
        sendable = False
    else:
        sendable = True
    try:
        check_arguments({"type": "object"}, arguments)
    except ArgumentError:
        accepted = False
    else:
        accepted = True
    assert accepted == sendable


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        ANY_TEXT,
        st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
        max_size=4,
    )
)
def test_flat_arguments_are_refused_exactly_when_the_transport_cannot_encode_them(arguments: dict[str, Any]) -> None:
    """check_arguments's shortcut for flat arguments (any names, NaN, huge integers) agrees with the SDK's encoder."""
    message = JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/call", params={"name": "t", "arguments": arguments})
    try:
        message.model_dump_json(by_alias=True, exclude_unset=True).encode()
    except ValueError:
        sendable = False
    else:
        # pydantic writes NaN and infinities as bare constants, which are not JSON: never sendable.
        sendable = all(not isinstance(value, float) or math.isfinite(value) for value in arguments.values())
    try:
        check_arguments({"type": "object"}, arguments)
    except ArgumentError:
        accepted = False
    else:
        accepted = True
    assert accepted == sendable


# 9. Bad arguments fail that call alone ----------------------------------------------------------

# What json.loads makes of a model's "\ud800" and "\udfff" escapes: strings UTF-8 cannot encode.
LONE_SURROGATE = "\ud800"


@TRANSPORTS
@pytest.mark.subprocess
async def test_arguments_the_transport_cannot_encode_fail_that_call_alone(kind: Kind) -> None:
    """A lone surrogate fails its call as invalid arguments before it is sent; siblings and the server are untouched."""
    async with serving(kind) as target, Dispatcher(retry=QUICK_RETRY) as d:
        await d.connect("s", target.client, trusted=True)
        before = await serving_pid(d)
        results = await d.dispatch(
            [
                ToolCall("e0", "echo", {"key": "a", "delay": 0.1}),
                ToolCall("s0", "echo", {"key": LONE_SURROGATE}),
                ToolCall("s1", "echo", {"key": "b", "nested": ["ok", {"deep": "\udfff"}]}),
                ToolCall("s2", "echo", {"key": "c", LONE_SURROGATE: 1}),
                ToolCall("e1", "echo", {"key": "d", "delay": 0.1}),
            ]
        )
        after = await serving_pid(d)
    for bad in results[1:4]:
        assert bad.status is CallStatus.FAILED and bad.attempts == 0 and bad.started_at is None
        assert str(bad.error).startswith("invalid arguments: they cannot be encoded as JSON"), bad.error
        assert "surrogates not allowed" in str(bad.error)
    assert results[0].ok and results[4].ok
    assert target.connections == 1
    assert before == after


async def test_non_finite_numbers_are_not_sent() -> None:
    """NaN and infinity are not JSON: the call fails as invalid arguments, before it is sent."""
    async with serving("in-process") as target, Dispatcher() as d:
        await d.connect("s", target.client, trusted=True)
        results = await d.dispatch(
            [ToolCall("n", "echo", {"key": "a", "delay": math.nan}), ToolCall("i", "echo", {"key": "NaN Infinity"})]
        )
    assert results[0].status is CallStatus.FAILED and "cannot be encoded as JSON" in str(results[0].error)
    assert results[1].ok and text(results[1]) == "NaN Infinity"


# 10. The dispatcher is not stricter than the server ------------------------------------------------


@TRANSPORTS
@pytest.mark.subprocess
async def test_arguments_the_server_accepts_are_sent(kind: Kind) -> None:
    """A string for an integer, and keys the schema does not list, reach the server, which decides."""
    async with serving(kind) as target, Dispatcher() as d:
        await d.connect("s", target.client, trusted=True)
        results = await d.dispatch(
            [
                ToolCall("str", "log", {"max_count": "2"}),
                ToolCall("bool", "log", {"max_count": "3", "verbose": "true"}),
                ToolCall("extra", "log", {"max_count": 1, "unknown": True}),
                ToolCall("wrong", "log", {"max_count": "two"}),
                ToolCall("missing", "log", {}),
            ]
        )
    assert [text(r) for r in results[:3]] == ["2 entries (int)", "3 entries (verbose) (int)", "1 entries (int)"]
    # The server refused this one itself: its answer reaches the model.
    assert results[3].status is CallStatus.TOOL_ERROR and results[3].attempts == 1
    # A missing required argument fails every server: rejected before it is sent.
    assert results[4].status is CallStatus.FAILED and results[4].attempts == 0
    assert results[4].error == "invalid arguments: missing required 'max_count'"


# 11. Sync local functions obey call_timeout and cancellation ----------------------------------------


async def wait_for_no_abandoned_threads(d: Dispatcher) -> None:
    """Wait (up to 10 s) until every abandoned worker thread has returned."""
    with anyio.fail_after(10):
        while d.abandoned_threads:  # noqa: ASYNC110 - the count changes on a worker thread: no event to wait on
            await anyio.sleep(0.01)


async def test_a_blocking_sync_function_times_out_and_its_thread_is_counted() -> None:
    """A sync function that blocks ends TIMEOUT on time; its thread is counted until it returns."""
    gate = threading.Event()

    def block() -> str:
        gate.wait(30)
        return "late"

    async with Dispatcher(call_timeout=1.0) as d:  # room for a loaded machine to run "after" in a thread
        d.add_function(block)
        d.add_function(lambda: "after", name="after")
        try:
            with anyio.fail_after(10):
                results = await d.dispatch([ToolCall("b", "block"), ToolCall("a", "after")])
            assert results[0].status is CallStatus.TIMEOUT
            assert results[1].ok  # the write behind it was not held up
            assert d.abandoned_threads == 1
        finally:
            gate.set()
        await wait_for_no_abandoned_threads(d)


async def test_a_blocking_sync_function_is_cancelled_and_the_dispatcher_closes() -> None:
    """Cancelling a blocked sync call ends it CANCELLED at once; the dispatcher then closes without waiting for it."""
    gate = threading.Event()
    started = threading.Event()

    def block() -> str:
        started.set()
        gate.wait(30)
        return "late"

    try:
        with anyio.fail_after(10):
            async with Dispatcher(call_timeout=None) as d:
                d.add_function(block)
                batch = d.batch()
                pending = batch.submit(ToolCall("b", "block"))
                await anyio.to_thread.run_sync(started.wait)
                batch.cancel()
                result = await pending.wait()
                assert result.status is CallStatus.CANCELLED
                assert d.abandoned_threads == 1
                batch.submit(ToolCall("b2", "block"))  # still blocked when the dispatcher closes
                await anyio.wait_all_tasks_blocked()
        assert d.abandoned_threads >= 1
    finally:
        gate.set()
    await wait_for_no_abandoned_threads(d)


# 12. Caller mistakes are clear errors ---------------------------------------------------------------


async def test_registering_after_close_raises() -> None:
    """add_mcp_server, add_function and connect on a closed dispatcher raise DispatcherClosedError."""
    server = transport_server.build()
    async with Dispatcher() as d:
        pass
    async with Client(server) as client:
        with pytest.raises(DispatcherClosedError):
            await d.add_mcp_server("s", client)
    with pytest.raises(DispatcherClosedError):
        d.add_function(lambda: 1, name="one")
    with pytest.raises(DispatcherClosedError):
        await d.connect("s", server)


async def test_a_dict_for_annotations_names_the_tool() -> None:
    """A dict where ToolAnnotations is expected raises ConfigurationError naming the tool."""
    server = transport_server.build()
    async with Dispatcher() as d:
        with pytest.raises(ConfigurationError, match=r"annotations of tool 'one' must be an mcp.types.ToolAnnotations"):
            d.add_function(lambda: 1, name="one", annotations={"readOnlyHint": True})  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=r"annotations of tool 'echo' must be"):
            await d.connect("s", server, overrides={"echo": {"readOnlyHint": True}})  # type: ignore[dict-item]
        # Nothing was registered: both names are still free.
        d.add_function(lambda: 1, name="one", annotations=ToolAnnotations(read_only_hint=True))
        await d.connect("s", server)


async def test_a_single_call_instead_of_a_list_raises_batch_error() -> None:
    """dispatch(a_single_ToolCall) raises BatchError saying to wrap it in a list."""
    async with Dispatcher() as d:
        d.add_function(lambda: 1, name="one")
        with pytest.raises(BatchError, match="single ToolCall"):
            await d.dispatch(ToolCall("a", "one"))  # type: ignore[arg-type]
        with pytest.raises(BatchError, match="single ToolCall"):
            d.batch().submit_all(ToolCall("a", "one"))  # type: ignore[arg-type]


async def test_a_client_that_was_not_entered_is_a_configuration_error() -> None:
    """add_mcp_server with a Client outside its async with raises ConfigurationError saying so."""
    server = transport_server.build()
    client = Client(server)
    async with Dispatcher() as d:
        with pytest.raises(ConfigurationError, match="not entered"):
            await d.add_mcp_server("s", client)
        async with client:
            await d.add_mcp_server("s", client)
        assert "s" in {entry.server for entry in d.tools()}


async def test_a_dict_batch_says_how_to_build_tool_calls() -> None:
    """A dict, or a list of dicts, where ToolCalls are expected raises BatchError pointing to ToolCall and formats."""
    async with Dispatcher() as d:
        d.add_function(lambda: 1, name="one")
        with pytest.raises(BatchError, match=r"got a dict: build ToolCall\(id, name, arguments\).*dispatcher.formats"):
            await d.dispatch({"id": "a", "name": "one"})  # type: ignore[arg-type]
        with pytest.raises(BatchError, match=r"item 0 is a dict, not a ToolCall: build ToolCall"):
            await d.dispatch([{"id": "a", "name": "one"}])  # type: ignore[list-item]
        assert [r.ok for r in await d.dispatch([ToolCall("a", "one")])] == [True]


async def test_a_server_where_a_client_is_expected_points_to_connect() -> None:
    """add_mcp_server with an MCPServer (not a Client) raises ConfigurationError pointing to Dispatcher.connect."""
    server = transport_server.build()
    async with Dispatcher() as d:
        with pytest.raises(
            ConfigurationError, match=r"must be an entered mcp.Client, got MCPServer.*Dispatcher.connect"
        ):
            await d.add_mcp_server("s", server)  # type: ignore[arg-type]
        await d.connect("s", server)  # the name was not taken by the failed registration
        assert "s" in {entry.server for entry in d.tools()}


async def test_a_command_string_target_points_to_stdio_parameters() -> None:
    """connect with a command line as a string raises ConfigurationError naming StdioServerParameters."""
    async with Dispatcher() as d:
        with pytest.raises(ConfigurationError, match=r"URL of a streamable HTTP endpoint.*StdioServerParameters"):
            await d.connect("s", "python -m dispatcher.examples.workspace")
        await d.connect("s", transport_server.build())


# ReconnectPolicy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"wait_initial": -1}, "wait_initial must be a finite number of seconds >= 0"),
        ({"wait_initial": 2.0, "wait_max": 1.0}, r"wait_max must be a finite number of seconds >= wait_initial"),
        ({"ping_timeout": 0}, "ping_timeout must be a finite number of seconds > 0"),
        ({"close_grace": math.inf}, "close_grace must be a finite number of seconds > 0"),
        ({"listen_timeout": True}, "listen_timeout must be a finite number of seconds > 0"),
    ],
)
def test_reconnect_policy_rejects_values_out_of_range(options: dict[str, Any], message: str) -> None:
    """An invalid ReconnectPolicy setting raises ConfigurationError saying what is accepted."""
    with pytest.raises(ConfigurationError, match=message):
        ReconnectPolicy(**options)


async def test_connect_rejects_a_reconnect_that_is_not_a_policy() -> None:
    """connect(reconnect=...) takes a ReconnectPolicy or None, and the name stays free after a bad one."""
    server = transport_server.build()
    async with Dispatcher() as d:
        with pytest.raises(ConfigurationError, match="reconnect must be a ReconnectPolicy"):
            await d.connect("s", server, reconnect={"wait_initial": 1})  # type: ignore[arg-type]
        await d.connect("s", server, reconnect=ReconnectPolicy(ping_timeout=1.0))


def test_reconnect_backoff_has_the_retry_policy_shape() -> None:
    """The reconnect waits double from wait_initial up to wait_max, like RetryPolicy's waits without jitter."""
    reconnect = ReconnectPolicy(wait_initial=0.5, wait_max=3.0)
    retry = RetryPolicy(wait_initial=0.5, wait_max=3.0, jitter=False)
    rng = __import__("random").Random(0)
    assert [reconnect.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [retry.backoff(n, rng) for n in range(1, 6)] == [reconnect.backoff(n) for n in range(1, 6)]


@pytest.mark.backends("trio-mockclock")
async def test_the_reconnect_policy_sets_the_backoff() -> None:
    """Failed reconnects wait as the connection's ReconnectPolicy says (capped at wait_max)."""
    server = Crashable(Workspace())
    async with Dispatcher() as d:
        await d.connect("ws", server.client, trusted=True, reconnect=ReconnectPolicy(wait_initial=0.5, wait_max=0.5))
        server.down = True
        server.crash()
        await anyio.wait_all_tasks_blocked()
        read = ToolCall("r", "search_notes", {"query": "x"})
        [first] = await d.dispatch([read])
        [fast] = await d.dispatch([read])
        await anyio.sleep(0.5)
        [second] = await d.dispatch([read])
        [capped] = await d.dispatch([read])
        server.down = False
        await anyio.sleep(0.5)
        [back] = await d.dispatch([read])
    assert "could not reconnect" in str(first.error)
    assert "next reconnect attempt is in 0.5s" in str(fast.error)
    assert "could not reconnect" in str(second.error)
    assert "next reconnect attempt is in 0.5s" in str(capped.error)
    assert back.ok


# No SDK private names ---------------------------------------------------------------------------


def test_the_package_imports_no_private_sdk_names() -> None:
    """No module of the package imports a private name or module of the mcp SDK."""
    root = pathlib.Path(dispatcher.__file__).parent
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("mcp", "mcp_types"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or any(part.startswith("_") for part in node.module.split(".")):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: from {node.module} import {private}")
    assert not found, found
