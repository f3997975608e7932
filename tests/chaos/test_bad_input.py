"""Bad input, fuzzed: every bad call gets a clear error of its own, and the rest of its batch runs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import TextContent, ToolAnnotations

from dispatcher import BatchError, CallStatus, Dispatcher, ToolCall
from dispatcher.examples import Workspace
from tests.batches import mixed_batch

from . import harness
from .harness import FIGURES, scale

if TYPE_CHECKING:
    from collections.abc import Sequence

    from dispatcher import ToolResult

pytestmark = pytest.mark.anyio

READ = ToolAnnotations(read_only_hint=True)
# An error message a model can read: it says what went wrong without echoing megabytes of input.
MAX_ERROR = 2_000

SETTINGS = settings(
    max_examples=scale(30, 400),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _nest(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


# Values JSON cannot carry, or that a tool's schema forbids.
bad_values = st.one_of(
    st.sets(st.integers(), max_size=3),
    st.binary(max_size=8),
    st.complex_numbers(allow_nan=False),
    st.builds(object),
    st.just(math.nan),
    st.just(math.inf),
    st.frozensets(st.text(max_size=3), max_size=2),
    st.lists(st.builds(object), min_size=1, max_size=2),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
    st.integers(min_value=2**70),
    # Huge: a megabyte of text, a long list, a deep nest.
    st.integers(1, 3).map(lambda n: "ab" * (n * 500_000)),
    st.integers(1, 3).map(lambda n: list(range(n * 100_000))),
    st.integers(200, 2_000).map(lambda depth: _nest(depth)),
)
# Anything a model (or a buggy loop) may put where the arguments go.
arguments = st.one_of(
    st.dictionaries(st.text(max_size=10), json_values | bad_values, max_size=5),
    st.dictionaries(st.sampled_from(["name", "text", "query", "url", "to", "n", "key"]), json_values | bad_values),
    st.dictionaries(st.integers() | st.none() | st.tuples(st.integers()), json_values, min_size=1, max_size=2),
    json_values.filter(lambda value: not isinstance(value, dict)),
    st.text(max_size=30),
    st.just('{"name": "unterminated'),
    st.just(b"\x00\xff"),
    bad_values,
)
odd_names = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=10),
    st.sampled_from(["", " ", "\x00", "../etc/passwd", "read_note ", "READ_NOTE", "ws__read_note", "__", "a" * 10_000]),
)


def clear(result: ToolResult) -> bool:
    """A result that is a clear error: not OK, with a short readable message."""
    return result.status is not CallStatus.OK and isinstance(result.error, str) and 0 < len(result.error) <= MAX_ERROR


def check_batch(calls: Sequence[ToolCall], results: Sequence[ToolResult], *, bad: int = 0) -> None:
    """One result per call in order, and every error message bounded; counted in the figures (`bad` inputs too)."""
    FIGURES.batches += 1
    FIGURES.calls += len(calls)
    FIGURES.fault("bad-input", bad)
    assert not harness.check_results(calls, results)
    for result in results:
        if result.status is not CallStatus.OK:
            assert isinstance(result.error, str) and 0 < len(result.error) <= MAX_ERROR, (
                result.call_id,
                result.status,
                (result.error or "")[:300],
                len(result.error or ""),
            )


def counter(text: str, n: int = 1) -> int:
    """A typed local tool: the arguments it gets are checked against its signature."""
    return len(text) * n


@SETTINGS
@given(
    batch=st.lists(
        st.tuples(st.sampled_from(["search_notes", "set_note", "counter", "fetch_url", "good"]), arguments),
        min_size=1,
        max_size=12,
    )
)
@pytest.mark.slow
async def test_fuzzed_arguments_fail_their_own_call_only(anyio_backend: Any, batch: list[tuple[str, Any]]) -> None:
    """Malformed, non-JSON, huge and mistyped arguments each fail their own call clearly; good calls succeed."""
    workspace = Workspace()
    calls = []
    for i, (tool, args) in enumerate(batch):
        if tool == "good":
            calls.append(ToolCall(f"c{i}", "search_notes", {"query": "x"}))
        else:
            calls.append(ToolCall(f"c{i}", tool, args))
    async with Client(workspace.server) as client, Dispatcher(call_timeout=30) as d:
        await d.add_mcp_server("ws", client, trusted=True)
        d.add_function(counter, annotations=READ)
        with anyio.fail_after(60):
            results = await d.dispatch(calls)
        check_batch(calls, results, bad=sum(1 for tool, _ in batch if tool != "good"))
        assert not harness.check_idle(d)
    for (tool, _), result in zip(batch, results, strict=True):
        if tool == "good":
            assert result.ok, result.error
        elif not result.ok:
            assert clear(result)
    # Only what passed the dispatcher's checks reached the server, and every call it answered OK ran. The
    # server stays the authority on its own schema: a call it rejects by its own validation (a set where
    # a string is declared) is sent, answered as a tool error, and never runs.
    sent = sum(1 for r in results if r.attempts and r.server == "ws")
    answered = sum(1 for r in results if r.ok and r.server == "ws")
    assert answered <= len(workspace.ledger) <= sent


# What a loop may pass as a call's name or server when it forwards a model's JSON unchecked.
not_strings = st.one_of(st.none(), st.integers(), st.lists(st.text(max_size=3), max_size=2), st.binary(max_size=4))


@SETTINGS
@given(
    names=st.lists(
        st.tuples(odd_names | not_strings, st.none() | st.sampled_from(["ws", "nope"]) | odd_names | not_strings),
        min_size=1,
        max_size=8,
    )
)
async def test_unknown_and_odd_tool_names(anyio_backend: Any, names: list[tuple[Any, Any]]) -> None:
    """Calls to names no tool has (odd characters, empty, huge, not strings) fail with a bounded message."""
    workspace = Workspace()
    calls = [ToolCall(f"c{i}", name, {"name": "x"}, server=server) for i, (name, server) in enumerate(names)]
    calls.append(ToolCall("known", "read_note", {"name": "x"}))
    async with Client(workspace.server) as client, Dispatcher() as d:
        await d.add_mcp_server("ws", client, trusted=True)
        known = {entry.name for entry in d.tools()}
        with anyio.fail_after(60):
            results = await d.dispatch(calls)
    check_batch(calls, results, bad=len(names))
    for (name, server), result in zip(names, results, strict=False):
        if not isinstance(name, str) or name not in known or server not in (None, "ws"):
            assert result.status is CallStatus.FAILED and clear(result), result
    assert results[-1].status is CallStatus.TOOL_ERROR  # ran: there is no note "x"


@SETTINGS
@given(tool_names=st.lists(odd_names.filter(bool), min_size=1, max_size=6, unique=True))
async def test_servers_offering_tools_with_odd_names(anyio_backend: Any, tool_names: list[str]) -> None:
    """Tools whose names models reject are shown under valid names, and calls by either name reach them."""
    server = MCPServer("odd")
    for name in tool_names:
        server.add_tool(_named(name), name=name, annotations=READ, structured_output=False)
    async with Client(server) as client, Dispatcher() as d:
        entries = await d.add_mcp_server("odd", client, trusted=True)
        assert sorted(entry.tool for entry in entries) == sorted(tool_names)
        assert all(harness_name_ok(entry.name) for entry in entries)
        by_catalogue = [ToolCall(f"a{i}", entry.name, {"x": i}) for i, entry in enumerate(entries)]
        by_own_name = [ToolCall(f"b{i}", entry.tool, {"x": i}, server="odd") for i, entry in enumerate(entries)]
        with anyio.fail_after(60):
            results = await d.dispatch(by_catalogue + by_own_name)
    check_batch(by_catalogue + by_own_name, results, bad=len(tool_names))
    for call, result in zip(by_catalogue + by_own_name, results, strict=True):
        assert result.ok, (call, result.error)
        content = result.result.content[0] if result.result is not None else None
        assert isinstance(content, TextContent) and content.text.endswith(f":{call.arguments['x']}")  # type: ignore[index]


def _named(name: str) -> Any:
    def tool(x: int = 0) -> str:
        """Answer with the tool's name and x."""
        return f"{name}:{x}"

    return tool


def harness_name_ok(name: str) -> bool:
    """Whether a catalogue name is one model APIs accept."""
    import re

    return re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) is not None


async def test_duplicate_ids_and_bad_items_are_refused_before_anything_runs(anyio_backend: Any) -> None:
    """Duplicate ids, empty ids and non-ToolCall items raise BatchError; nothing runs; the dispatcher goes on."""
    workspace = Workspace()
    good = ToolCall("a", "set_note", {"name": "n", "text": "x"})
    async with Client(workspace.server) as client, Dispatcher() as d:
        await d.add_mcp_server("ws", client, trusted=True)
        for bad in (
            [good, ToolCall("a", "read_note", {"name": "n"})],
            [good, ToolCall("", "read_note", {"name": "n"})],
            [good, {"id": "b", "name": "read_note"}],
            [good, None],
            [good, ToolCall(7, "read_note")],  # type: ignore[arg-type]
        ):
            with pytest.raises(BatchError) as raised:
                await d.dispatch(bad)  # type: ignore[arg-type]
            assert "item 1" in str(raised.value) or "duplicate call id 'a'" in str(raised.value)
            FIGURES.fault("bad-input")
        assert workspace.ledger == ()
        assert await d.dispatch([]) == []
        assert await d.dispatch(()) == []
        [result] = await d.dispatch([good])
        assert not harness.check_idle(d)
    assert result.ok


@pytest.mark.slow
async def test_a_huge_mixed_batch_returns_every_result_in_order(anyio_backend: Any) -> None:
    """A 20,000-call batch (100,000 under `make stress`) of reads, writes, unknown tools and bad arguments:
    every result, in order.

    The same mix at every size; the 100,000-call figure itself is measured by `make bench`
    (benchmarks/scale.py and benchmarks/executors.py, recorded in benchmarks/reference.json).
    """
    size = scale(20_000, 100_000)
    seen = 0

    async def peek(key: int) -> int:
        """A read-only local tool."""
        return key

    def bump(key: int) -> int:
        """A mutating local tool (sync: it runs in a worker thread)."""
        nonlocal seen
        seen += 1
        return key

    calls = mixed_batch(size)
    async with Dispatcher(max_concurrency=64) as d:
        d.add_function(peek, annotations=READ)
        d.add_function(bump)
        with anyio.fail_after(300):
            results = await d.dispatch(calls)
        assert not harness.check_idle(d)
    check_batch(calls, results, bad=2 * size // 50)
    statuses = [result.status for result in results]
    assert statuses.count(CallStatus.FAILED) == 2 * size // 50
    assert statuses.count(CallStatus.OK) == size - 2 * size // 50
    assert seen == size // 50


async def test_enormous_arguments_and_results_in_process(anyio_backend: Any) -> None:
    """A 20 MB argument and a 20 MB result go through whole, beside small calls."""
    big = "x" * 20_000_000

    def echo(text: str) -> str:
        """Return the text."""
        return text

    def make(size: int) -> str:
        """Return a text of `size` characters."""
        return "y" * size

    workspace = Workspace()
    async with Client(workspace.server) as client, Dispatcher() as d:
        await d.add_mcp_server("ws", client, trusted=True)
        d.add_function(echo, annotations=READ)
        d.add_function(make, annotations=READ)
        calls = [
            ToolCall("big-arg", "echo", {"text": big}),
            ToolCall("big-result", "make", {"size": 20_000_000}),
            ToolCall("mcp-big-note", "set_note", {"name": "big", "text": big}),
            ToolCall("mcp-read", "read_note", {"name": "big"}),
            ToolCall("small", "echo", {"text": "hi"}),
        ]
        with anyio.fail_after(120):
            results = await d.dispatch(calls)
    check_batch(calls, results, bad=3)
    assert all(result.ok for result in results), [r.error for r in results]
    texts = [r.result.content[0].text for r in results if r.result is not None]  # type: ignore[union-attr]
    assert [len(text) for text in texts] == [20_000_000, 20_000_000, len("set note 'big'"), 20_000_000, 2]
