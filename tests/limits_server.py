"""An MCP server that tries to exhaust its client: huge answers, tools/list_changed storms, churning names.

Served in process, as a stdio subprocess (``python tests/limits_server.py [--churn]``) or over HTTP. It
counts the listings it serves, so a test can tell how many a storm of announcements cost.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import sys
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import Tool, ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

if TYPE_CHECKING:
    from mcp import StdioServerParameters

SAFE = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

_SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[1]


class LimitsServer(MCPServer[Any]):
    """The server; `many` more tools (`record_<i>_get`, ...), and with `churn`, every listing also offers a
    fresh set of `churn` tool names."""

    def __init__(self, *, many: int = 0, churn: int = 0, list_delay: float = 0.0) -> None:
        super().__init__("limits-test")
        self.listings = 0
        self.list_delay = list_delay
        self.bigs = 0
        self.churn = churn
        verbs = ("get", "list", "create", "update", "delete")
        self._many = [
            Tool(name=f"{verbs[i % 5]}_record_{i}", input_schema={"type": "object"}, description="one of many")
            for i in range(many)
        ]
        self._generation = itertools.count()
        self.add_tool(self.big, annotations=SAFE)
        self.add_tool(self.echo, annotations=SAFE)
        self.add_tool(self.storm, annotations=SAFE)
        self.add_tool(self.listed, annotations=SAFE)
        self.add_tool(self.pid, annotations=SAFE)
        self.add_tool(self.shout, annotations=SAFE)

    async def list_tools(self) -> list[Tool]:
        self.listings += 1
        if self.list_delay:
            await anyio.sleep(self.list_delay)
        tools = [*await super().list_tools(), *self._many]
        if self.churn:
            generation = next(self._generation)
            tools += [
                Tool(name=f"gen{generation}_{i}", input_schema={"type": "object"}, description="churn")
                for i in range(self.churn)
            ]
        return tools

    async def big(self, size: int) -> str:
        """Answers with `size` characters."""
        self.bigs += 1
        return "A" * size

    async def echo(self, text: str) -> str:
        """Answers with its text."""
        return text

    async def storm(self, ctx: Context, count: int, pause_every: int = 0, pause: float = 0.001) -> str:
        """Announces a tool list change `count` times, sleeping `pause` seconds every `pause_every` of them."""
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        for i in range(count):
            if modern:
                await ctx.notify_tools_changed()
            else:
                await ctx.session.send_tool_list_changed()
            if pause_every and i % pause_every == 0:
                await anyio.sleep(pause)
        return f"announced {count} changes"

    async def pid(self) -> int:
        """The id of the process serving the call (a restarted stdio server has a new one)."""
        return os.getpid()

    async def shout(self, ctx: Context, size: int) -> str:
        """Sends a log notification of `size` characters, then answers briefly."""
        await ctx.info("B" * size)
        return "shouted"

    async def listed(self) -> int:
        """How many listings this server has served."""
        return self.listings


def stdio(*options: str) -> StdioServerParameters:
    """This server as a stdio subprocess of this checkout: a fresh process each time, forked from
    tests/forkserver.py's zygote, which imported the SDK once (a fresh interpreter costs 1.4 s or more)."""
    from tests import forkserver

    pythonpath = os.pathsep.join(p for p in (str(_SOURCE_ROOT), os.environ.get("PYTHONPATH")) if p)
    return forkserver.params([__file__, *options], {"PYTHONPATH": pythonpath})


if __name__ == "__main__":
    server = LimitsServer(churn=200 if "--churn" in sys.argv else 0, many=5000 if "--many" in sys.argv else 0)
    anyio.run(server.run_stdio_async)
