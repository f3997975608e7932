"""Bugs the chaos suite found, one regression test each (the suite's fuzzing found them first)."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, ToolCall

pytestmark = pytest.mark.anyio


def double(x: int) -> int:
    """Twice x."""
    return 2 * x


@pytest.mark.parametrize("name", [None, 7, ["double"], {"a": 1}, b"double", ("double",)])
async def test_a_name_that_is_not_a_string_fails_its_call_only(anyio_backend: Any, name: Any) -> None:
    """A call whose tool name is not a string gets a FAILED result; it used to raise TypeError out of dispatch()."""
    async with Dispatcher() as d:
        d.add_function(double, annotations=ToolAnnotations(read_only_hint=True))
        calls = [
            ToolCall("ok-before", "double", {"x": 1}),
            ToolCall("bad", name),
            ToolCall("ok-after", "double", {"x": 2}),
        ]
        with anyio.fail_after(10):
            results = await d.dispatch(calls)
        assert d.idle
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.FAILED, CallStatus.OK]
    assert results[1].error == f"invalid tool name: expected a string, got {type(name).__name__}"


@pytest.mark.parametrize("server", [7, ["ws"], {"ws": 1}])
async def test_a_server_that_is_not_a_string_fails_its_call_only(anyio_backend: Any, server: Any) -> None:
    """A call whose server is neither a string nor None gets a FAILED result, not an exception."""
    async with Dispatcher() as d:
        d.add_function(double, annotations=ToolAnnotations(read_only_hint=True))
        results = await d.dispatch(
            [ToolCall("bad", "double", {"x": 1}, server=server), ToolCall("ok", "double", {"x": 1})]
        )
    assert [r.status for r in results] == [CallStatus.FAILED, CallStatus.OK]
    assert results[0].error == f"invalid server name: expected a string or None, got {type(server).__name__}"


async def test_a_huge_unknown_name_is_cut_in_its_error(anyio_backend: Any) -> None:
    """The error for an unknown 1 MB tool name quotes 100 characters of it, not the whole megabyte."""
    name = "a" * 1_000_000
    async with Dispatcher() as d:
        d.add_function(double)
        results = await d.dispatch(
            [ToolCall("1", name), ToolCall("2", name, server="nope"), ToolCall("3", "double", {"x": 1}, server=name)]
        )
    assert results[0].error == f"unknown tool {'a' * 100!r}... (1000000 characters)"
    assert results[1].error == "unknown server 'nope' (servers: none)"
    assert results[2].error == f"unknown server {'a' * 100!r}... (1000000 characters) (servers: none)"
    assert all(r.status is CallStatus.FAILED for r in results)


@pytest.mark.parametrize("tool", ["read\n", "0\n", "a" * 63 + "\n"])
async def test_a_tool_name_ending_in_a_newline_gets_a_valid_catalogue_name(anyio_backend: Any, tool: str) -> None:
    """A tool named "read\\n" is shown under a valid name; it kept its own ("$" matched before the newline)."""
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    from dispatcher._inspect import _tool_findings

    server = MCPServer("odd")
    server.add_tool(double, name=tool, annotations=ToolAnnotations(read_only_hint=True), structured_output=False)
    async with Client(server) as client, Dispatcher() as d:
        [entry] = await d.add_mcp_server("odd", client, trusted=True)
        [by_name] = await d.dispatch([ToolCall("1", entry.name, {"x": 2})])
        findings = _tool_findings(entry)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", entry.name), entry.name
    assert entry.tool == tool and by_name.ok
    assert any(finding.code == "invalid_name" for finding in findings)  # `dispatcher inspect` warns too
