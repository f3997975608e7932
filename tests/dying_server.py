"""An MCP server whose process exits in the middle of a `tune` sweep, over stdio or streamable HTTP.

`lookup` takes 10 ms; call number N+1 ends the process at once (no answer, no goodbye), as a server
that crashes under load does. Run ``python -m tests.dying_server N`` for stdio, or
``python -m tests.dying_server N PORT`` to serve it over HTTP on 127.0.0.1:PORT.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

__all__ = ["build"]


def build(calls: int) -> MCPServer[Any]:
    """The server, answering `calls` calls before it exits."""
    server: MCPServer[Any] = MCPServer("dying")
    count = 0

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def lookup(name: str) -> str:
        """Look a name up."""
        nonlocal count
        count += 1
        if count > calls:
            os._exit(3)
        await anyio.sleep(0.01)
        return name

    return server


if __name__ == "__main__":
    server = build(int(sys.argv[1]))
    if len(sys.argv) > 2:
        import uvicorn

        uvicorn.run(
            server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
        )
    else:
        anyio.run(server.run_stdio_async)
