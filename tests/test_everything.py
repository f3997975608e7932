"""The reference server `@modelcontextprotocol/server-everything` (npm, over stdio) through `Dispatcher.connect`."""

from __future__ import annotations

import pytest
from mcp import Client

from dispatcher import CallStatus, Dispatcher, ToolCall

from .everything import everything

pytestmark = [pytest.mark.reference_servers, pytest.mark.anyio]


async def test_installed_server_offers_the_long_running_tools() -> None:
    """The pinned server-everything lists its task tool (tasks required) and its long-running operation."""
    async with Client(everything()) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        capabilities = client.session.server_capabilities
    research = tools["simulate-research-query"]
    assert research.execution is not None and research.execution.task_support == "required"
    assert "trigger-long-running-operation" in tools
    assert capabilities is not None and capabilities.tasks is not None
    assert capabilities.tasks.requests is not None and capabilities.tasks.requests.tools is not None
    assert capabilities.tasks.cancel is not None


async def test_echo_through_connect() -> None:
    """server-everything over stdio: a plain tool call through `Dispatcher.connect` returns its answer."""
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("everything", everything(), trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", "echo", {"message": "hello"})])
    assert result.status is CallStatus.OK, result.error
    assert result.result is not None
    assert "hello" in "".join(getattr(block, "text", "") for block in result.result.content)
