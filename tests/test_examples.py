"""The example workspace server, exercised through the real MCP SDK."""

from __future__ import annotations

import functools
import os
import pathlib
import socket
import subprocess
import sys
import types
from typing import TYPE_CHECKING

import anyio
import pytest
from mcp import Client, MCPError
from mcp.types import INTERNAL_ERROR, REQUEST_TIMEOUT, CallToolResult, TextContent

import dispatcher.examples
from dispatcher.examples import (
    FaultConfig,
    Workspace,
    saturated_latency,
    serve_http,
)
from dispatcher.examples.workspace import main
from dispatcher.testing import FaultInjector, FaultKind

from . import forkserver

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.anyio

# The folder holding the `dispatcher` package, so subprocesses import this checkout.
_SOURCE_ROOT = str(pathlib.Path(dispatcher.examples.__file__).resolve().parents[2])

# (readOnly, destructive, idempotent, openWorld) as each tool declares them; None is "not declared".
_EXPECTED_HINTS = {
    "search_notes": (True, None, None, False),
    "read_note": (True, None, None, False),
    "create_note": (False, False, False, False),
    "set_note": (False, True, True, False),
    "append_note": (False, False, False, False),
    "delete_note": (False, True, True, False),
    "fetch_url": (True, None, None, True),
    "send_message": (False, False, False, True),
}


def _text(result: CallToolResult) -> str:
    assert len(result.content) == 1
    content = result.content[0]
    assert isinstance(content, TextContent)
    return content.text


async def _ok(client: Client, tool: str, **arguments: str) -> str:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, _text(result)
    return _text(result)


async def _refused(client: Client, tool: str, **arguments: str) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    return _text(result)


async def _run_concurrently(client: Client, count: int, tool: str = "search_notes") -> None:
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(functools.partial(_ok, client, tool, query=str(i)))


def _subprocess_env() -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (_SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": pythonpath}


# -- the public surface ------------------------------------------------------------------------


def test_all_is_the_public_surface() -> None:
    """`__all__` lists exactly the public names of `dispatcher.examples`, sorted."""
    public = {
        name
        for name, value in vars(dispatcher.examples).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert sorted(dispatcher.examples.__all__) == dispatcher.examples.__all__
    assert set(dispatcher.examples.__all__) == public


# -- tools and annotations ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_annotations_declare_each_tools_behaviour(mode: str) -> None:
    """Every tool lists the hints of the table, on both protocol generations."""
    async with Client(Workspace().server, mode=mode) as client:
        tools = (await client.list_tools()).tools
    hints = {}
    for tool in tools:
        assert tool.annotations is not None
        a = tool.annotations
        hints[tool.name] = (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint)
    assert hints == _EXPECTED_HINTS
    assert Workspace.tool_names == tuple(_EXPECTED_HINTS)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_create_then_read_and_create_refuses_existing(mode: str) -> None:
    """create_note adds a note read_note returns; creating it again is an error result that changes nothing."""
    workspace = Workspace()
    async with Client(workspace.server, mode=mode) as client:
        await _ok(client, "create_note", name="plan", text="v1")
        assert await _ok(client, "read_note", name="plan") == "v1"
        assert "already exists" in await _refused(client, "create_note", name="plan", text="v2")
        assert "no note named" in await _refused(client, "read_note", name="other")
    assert workspace.notes == {"plan": "v1"}


async def test_set_note_twice_leaves_the_same_state() -> None:
    """set_note creates or replaces, and repeating it changes nothing more."""
    workspace = Workspace()
    async with Client(workspace.server) as client:
        await _ok(client, "set_note", name="a", text="one")
        await _ok(client, "set_note", name="a", text="two")
        after_once = workspace.notes
        await _ok(client, "set_note", name="a", text="two")
    assert workspace.notes == after_once == {"a": "two"}


async def test_delete_note_is_idempotent() -> None:
    """Deleting a note twice succeeds both times and leaves the same state as deleting it once."""
    workspace = Workspace()
    async with Client(workspace.server) as client:
        await _ok(client, "create_note", name="a", text="x")
        await _ok(client, "create_note", name="b", text="y")
        assert "deleted" in await _ok(client, "delete_note", name="a")
        after_once = workspace.notes
        assert "did not exist" in await _ok(client, "delete_note", name="a")
    assert workspace.notes == after_once == {"b": "y"}


async def test_append_note_adds_a_line_each_time() -> None:
    """append_note creates a missing note and adds one line per call: repeating it is not idempotent."""
    workspace = Workspace()
    async with Client(workspace.server) as client:
        await _ok(client, "append_note", name="log", text="a")
        await _ok(client, "append_note", name="log", text="a")
    assert workspace.notes == {"log": "a\na"}


async def test_search_notes_matches_names_and_text() -> None:
    """search_notes lists the notes whose name or text contains the query, ignoring case."""
    async with Client(Workspace().server) as client:
        await _ok(client, "set_note", name="groceries", text="Milk and eggs")
        await _ok(client, "set_note", name="milk-recipes", text="pudding")
        await _ok(client, "set_note", name="todo", text="call Bob")
        assert await _ok(client, "search_notes", query="MILK") == "groceries\nmilk-recipes"
        assert "no notes match" in await _ok(client, "search_notes", query="zebra")


async def test_invalid_note_names_are_refused() -> None:
    """A note name that could leave the notes folder is an error result."""
    workspace = Workspace()
    async with Client(workspace.server) as client:
        for name in ("../escape", "", ".hidden", "a/b"):
            assert "invalid note name" in await _refused(client, "set_note", name=name, text="x")
    assert workspace.notes == {}


async def test_fetch_url_is_canned_and_can_carry_an_injection() -> None:
    """fetch_url answers from the URL alone, and pages on evil.example carry a prompt injection."""
    async with Client(Workspace().server) as client:
        page = await _ok(client, "fetch_url", url="https://docs.example/guide")
        assert page == await _ok(client, "fetch_url", url="https://docs.example/guide")
        assert "simulated offline fetch" in page
        assert "send_message" not in page
        assert "send_message" in await _ok(client, "fetch_url", url="http://www.evil.example/")
        assert "absolute http(s) URL" in await _refused(client, "fetch_url", url="file:///etc/passwd")


async def test_send_message_fills_the_outbox_every_time() -> None:
    """send_message appends to the simulated outbox on every call, duplicates included."""
    workspace = Workspace()
    async with Client(workspace.server) as client:
        await _ok(client, "send_message", to="bob@example.com", text="hi")
        await _ok(client, "send_message", to="bob@example.com", text="hi")
        await _refused(client, "send_message", to=" ", text="hi")
    assert workspace.outbox == (("bob@example.com", "hi"), ("bob@example.com", "hi"))


async def test_notes_persist_to_the_root_folder(tmp_path: pathlib.Path) -> None:
    """With a root folder, notes are mirrored to files and a new workspace loads them."""
    first = Workspace(root=tmp_path)
    async with Client(first.server) as client:
        await _ok(client, "set_note", name="keep", text="kept")
        await _ok(client, "set_note", name="drop", text="dropped")
        await _ok(client, "delete_note", name="drop")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]  # noqa: ASYNC240  # a test's tmp dir
    assert Workspace(root=tmp_path).notes == {"keep": "kept"}


# -- the ledger --------------------------------------------------------------------------------


async def test_ledger_records_every_execution() -> None:
    """Each execution is recorded with its tool, arguments, times and outcome; rejected calls are not."""
    workspace = Workspace()
    async with Client(workspace.server) as client:
        await _ok(client, "create_note", name="a", text="x")
        await _refused(client, "create_note", name="a", text="x")
        await _refused(client, "no_such_tool")
        await _refused(client, "read_note", name=3)  # type: ignore[arg-type]  # invalid on purpose
    ledger = workspace.ledger
    assert [(e.seq, e.tool, e.outcome) for e in ledger] == [
        (0, "create_note", "ok"),
        (1, "create_note", "tool_error"),
    ]
    assert ledger[0].arguments == {"name": "a", "text": "x"}
    assert all(e.ended is not None and e.started <= e.ended for e in ledger)
    assert not ledger[0].overlaps(ledger[1])
    assert workspace.in_flight == 0
    assert workspace.max_in_flight == 1


@pytest.mark.backends("trio-mockclock")
async def test_ledger_shows_concurrent_executions_overlapping() -> None:
    """Calls made at the same time run concurrently on the server, and the ledger shows them overlapping."""
    workspace = Workspace(latency=1.0)
    async with Client(workspace.server) as client:
        await client.list_tools()
        await _run_concurrently(client, 3)
        await _ok(client, "search_notes", query="after")
    first, second, third, after = workspace.ledger
    assert first.overlaps(second) and second.overlaps(third) and third.overlaps(first)
    assert third.in_flight_at_start == 3
    assert not any(after.overlaps(e) for e in (first, second, third))
    assert workspace.max_in_flight == 3


# -- latency and saturation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_flight", "saturation", "expected"),
    [(1, None, 2.0), (50, None, 2.0), (1, 4, 2.0), (4, 4, 2.0), (6, 4, 3.0), (8, 4, 4.0)],
)
def test_saturated_latency_grows_past_the_knee(in_flight: int, saturation: int | None, expected: float) -> None:
    """Latency stays flat up to `saturation` executions in flight, then grows in proportion."""
    assert saturated_latency(2.0, in_flight, saturation) == expected


@pytest.mark.backends("trio-mockclock")
async def test_saturation_stops_throughput_growing() -> None:
    """Past the saturation point, each batch of concurrent calls takes proportionally longer."""
    workspace = Workspace(latency=1.0, saturation=2)
    makespans = []
    async with Client(workspace.server) as client:
        await client.list_tools()
        for count in (1, 2, 4, 8):
            start = anyio.current_time()
            await _run_concurrently(client, count)
            makespans.append(anyio.current_time() - start)
    assert makespans == pytest.approx([1.0, 1.0, 2.0, 4.0])
    durations = [e.ended - e.started for e in workspace.ledger[3:7] if e.ended is not None]
    assert durations == pytest.approx([1.0, 1.0, 1.5, 2.0])


@pytest.mark.backends("trio-mockclock")
async def test_latency_by_tool_overrides_the_default() -> None:
    """A per-tool latency replaces the default latency for that tool only."""
    workspace = Workspace(latency=1.0, latency_by_tool={"fetch_url": 5.0})
    async with Client(workspace.server) as client:
        await _ok(client, "fetch_url", url="https://a.example/")
        await _ok(client, "search_notes", query="q")
    durations = [e.ended - e.started for e in workspace.ledger if e.ended is not None]
    assert durations == pytest.approx([5.0, 1.0])


# -- faults ------------------------------------------------------------------------------------


async def _fault_pattern(faults: FaultConfig, calls: int) -> tuple[list[str], Workspace]:
    """Make `calls` sequential set_note calls and return how each one ended, as the client saw it."""
    workspace = Workspace(faults=faults)
    seen = []
    async with Client(workspace.server) as client:
        for i in range(calls):
            try:
                result = await client.call_tool("set_note", {"name": f"n{i}", "text": "x"})
            except MCPError as exc:
                assert exc.code == INTERNAL_ERROR
                seen.append("error")
            else:
                seen.append("tool_error" if result.is_error else "ok")
    return seen, workspace


async def test_faults_fire_at_the_rate_and_repeat_for_a_seed() -> None:
    """Faults strike about `rate` of the executions, at the same places for the same seed."""
    faults = FaultConfig(rate=0.3, seed=7, kinds=("error", "tool_error"))
    seen, workspace = await _fault_pattern(faults, 100)
    again, _ = await _fault_pattern(faults, 100)
    other_seed, _ = await _fault_pattern(FaultConfig(rate=0.3, seed=8, kinds=("error", "tool_error")), 100)
    assert seen == again
    assert seen != other_seed
    assert 20 <= seen.count("error") + seen.count("tool_error") <= 40
    assert seen.count("error") > 0 and seen.count("tool_error") > 0
    assert isinstance(workspace.faults, FaultInjector)  # the package's one injector, with its ledger
    assert [e.fault or "ok" for e in workspace.faults.ledger] == seen
    assert [e.outcome for e in workspace.faults.ledger] == seen
    # A fault strikes before the tool runs: only the calls that succeeded ran, and left a note.
    assert [e.outcome for e in workspace.ledger] == ["ok"] * seen.count("ok")
    assert sorted(workspace.notes) == sorted(f"n{i}" for i, how in enumerate(seen) if how == "ok")


async def test_faults_only_hit_the_named_tools() -> None:
    """With `tools` set, only those tools fail, and a failed send_message sends nothing."""
    workspace = Workspace(faults=FaultConfig(rate=1.0, tools=frozenset({"send_message"}), kinds=("tool_error",)))
    async with Client(workspace.server) as client:
        await _ok(client, "set_note", name="a", text="x")
        assert "injected fault" in await _refused(client, "send_message", to="eve", text="secret")
    assert workspace.outbox == ()
    assert workspace.faults is not None
    assert [e.fault for e in workspace.faults.ledger] == [None, "tool_error"]
    assert [e.tool for e in workspace.ledger] == ["set_note"]


@pytest.mark.backends("trio-mockclock")
async def test_hang_fault_waits_until_the_client_gives_up() -> None:
    """A hanging execution never answers; the client's timeout cancels it and the ledger says so."""
    workspace = Workspace(faults=FaultConfig(rate=1.0, kinds=("hang",)))
    async with Client(workspace.server) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("search_notes", {"query": "x"}, read_timeout_seconds=30)
        assert caught.value.code == REQUEST_TIMEOUT
    assert workspace.faults is not None and workspace.ledger == ()
    (execution,) = workspace.faults.ledger
    assert execution.fault == "hang"
    assert execution.outcome == "cancelled"
    assert execution.finished_at == pytest.approx(execution.started_at + 30)


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FaultConfig(rate=1.5), "rate must be between 0 and 1"),
        (lambda: FaultConfig(kinds=()), "at least one fault kind"),
        (lambda: FaultConfig(kinds=("explode",)), "unknown fault kinds ['explode']"),  # type: ignore[arg-type]
        (lambda: FaultConfig(kinds="error"), "not a str"),  # type: ignore[arg-type]
        (lambda: FaultConfig(tools="read_note"), "frozenset({'read_note'})"),  # type: ignore[arg-type]
        (lambda: Workspace(latency=-1), "latency must be a finite number"),
        (lambda: Workspace(latency_by_tool={"read_note": float("inf")}), "latency_by_tool['read_note']"),
        (lambda: Workspace(latency_by_tool={"rm": 1.0}), "latency_by_tool names unknown tools ['rm']"),
        (lambda: Workspace(saturation=0), "use None for no saturation"),
        (lambda: Workspace(faults=FaultConfig(tools=frozenset({"rm"}))), "faults.tools names unknown"),
    ],
)
def test_bad_configuration_is_refused_with_advice(make: Callable[[], object], message: str) -> None:
    """Out-of-range knobs and unknown names raise at construction, saying what is wrong."""
    with pytest.raises((ValueError, TypeError)) as caught:
        make()
    assert message in str(caught.value)


def test_fault_config_stores_frozen_collections() -> None:
    """FaultConfig accepts any collection of tools and kinds, and keeps hashable frozen copies."""
    kinds: list[FaultKind] = ["error", "hang"]
    config = FaultConfig(tools={"read_note"}, kinds=kinds)  # type: ignore[arg-type]  # a set, not a frozenset
    assert config.tools == frozenset({"read_note"})
    assert config.kinds == ("error", "hang")
    assert hash(config) == hash(FaultConfig(tools=frozenset({"read_note"}), kinds=("error", "hang")))


def test_cli_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    """The command line reports an invalid knob as a usage error."""
    with pytest.raises(SystemExit) as caught:
        main(["--fault-tools", "read_note,rm"])
    assert caught.value.code == 2
    assert "faults.tools names unknown tools ['rm']" in capsys.readouterr().err


# -- transports --------------------------------------------------------------------------------


@pytest.mark.subprocess
async def test_stdio_subprocess(tmp_path: pathlib.Path) -> None:
    """The workspace runs as a stdio subprocess, with its knobs and folder set from the command line."""
    # Forked from tests/forkserver.py's zygote: the module runs as `python -m` would run it, in a fresh
    # process, without importing the SDK again.
    params = forkserver.params(
        ["-m", "dispatcher.examples.workspace", "--root", str(tmp_path), "--latency", "0.01"], _subprocess_env()
    )
    async with Client(params) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == set(_EXPECTED_HINTS)
        await _ok(client, "set_note", name="over-stdio", text="hello")
        assert await _ok(client, "read_note", name="over-stdio") == "hello"
    assert (tmp_path / "over-stdio.txt").read_text() == "hello"


async def test_serve_http_in_process() -> None:
    """serve_http serves a workspace on a free port; concurrent calls over HTTP reach its ledger."""
    workspace = Workspace(latency=0.05)
    async with serve_http(workspace.server) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        async with Client(url) as client:
            await client.list_tools()
            await _run_concurrently(client, 4)
    assert [e.outcome for e in workspace.ledger] == ["ok"] * 4
    assert workspace.max_in_flight >= 2


async def test_serve_http_twice_in_a_row() -> None:
    """One server can be served again after the first serve_http block has ended."""
    workspace = Workspace()
    for text in ("first", "second"):
        async with serve_http(workspace.server) as url, Client(url) as client:
            await _ok(client, "set_note", name="a", text=text)
    assert workspace.notes == {"a": "second"}


def _accepted_nodelay(port: int) -> list[bool]:
    """Whether TCP_NODELAY is on, for each connection this process accepted on `port`.

    `serve_http` serves from a thread of this process, so its accepted sockets are among this process's
    open files: each is read through a duplicate of its descriptor (closing that leaves the socket open).
    """
    found = []
    for name in os.listdir("/dev/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue  # not a socket, or closed meanwhile
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            try:
                sock.getpeername()
            except OSError:
                continue  # the listening socket
            if sock.getsockname()[1] == port:
                found.append(bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
    return found


async def test_serve_http_answers_without_delayed_ack_stalls() -> None:
    """Every accepted connection has TCP_NODELAY: a call does not wait ~40 ms for Nagle plus delayed ACK.

    Without it, each response body (written after its headers) waited for the client's delayed ACK, and
    every call took at least 40 ms; with it, about 2 ms on a quiet machine. The calls' times are no proof
    on a loaded one: at load average 24 on two cores the fastest of 400 took 90 ms. So the cause is read
    exactly, on the server's sockets, and the calls show the connections it reads are the ones in use.
    """
    workspace = Workspace()
    async with serve_http(workspace.server) as url, Client(url) as client:
        await _ok(client, "search_notes", query="warm up")
        for _ in range(5):
            await _ok(client, "search_notes", query="q")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        nodelay = _accepted_nodelay(port)
    assert nodelay, "found no connection the server accepted"
    assert all(nodelay), nodelay


@pytest.mark.subprocess
async def test_http_subprocess_prints_its_url() -> None:
    """With --http --port 0 the process prints MCP_URL=... and serves there until terminated."""
    command = [sys.executable, "-m", "dispatcher.examples.workspace", "--http", "--port", "0"]
    env = {**os.environ, **_subprocess_env()}
    # Forked from tests/forkserver.py's zygote (a process of its own, its pid its own, so SIGTERM reaches it).
    process = forkserver.spawn(
        command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    try:
        # Bounds a hang only: at load average 15 on two cores a fresh interpreter took about 50 s to import
        # the SDK and print its URL.
        with anyio.fail_after(120):
            line = await anyio.to_thread.run_sync(process.stdout.readline, abandon_on_cancel=True)
        key, _, url = line.decode().partition("=")
        assert key == "MCP_URL"
        async with Client(url.strip()) as client:
            await _ok(client, "set_note", name="a", text="over http")
            assert await _ok(client, "read_note", name="a") == "over http"
    finally:
        process.terminate()
        returncode = await anyio.to_thread.run_sync(process.wait, 60)
        process.stdout.close()
    # SIGTERM is handled: the server shuts down cleanly instead of dying.
    assert returncode == 0


def test_the_examples_use_the_one_fault_injector() -> None:
    """The workspace's faults come from dispatcher.testing: no second FaultKind, Outcome or Execution to confuse."""
    import dispatcher.testing

    assert not {"FaultKind", "Outcome", "Execution"} & set(dispatcher.examples.__all__)
    workspace = Workspace(faults=FaultConfig(rate=0.5, kinds=("drop", "crash")))
    assert isinstance(workspace.faults, dispatcher.testing.FaultInjector)
    assert workspace.faults.kinds == ("drop", "crash") and workspace.faults.rate == 0.5
    assert Workspace().faults is None
