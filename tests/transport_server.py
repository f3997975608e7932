"""A small MCP server for the transport tests: served in process, as a stdio subprocess or over HTTP.

Its tools answer with server-defined JSON-RPC errors, take typed arguments the way a pydantic server
does (laxly), and report which process serves them, so a test can tell whether a connection was torn
down and a stdio server restarted. Run ``python tests/transport_server.py`` to serve it over stdio.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND, ToolAnnotations

if TYPE_CHECKING:
    from mcp import StdioServerParameters

# Read-only and idempotent, so that a trusted server's calls run together and may be retried.
SAFE = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

_SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[1]


def build() -> MCPServer[Any]:
    """A fresh server (state is per server object, or per process over stdio)."""
    server: MCPServer[Any] = MCPServer("transport-test")
    counts = {"limited": 0}

    @server.tool(annotations=SAFE)
    async def limited(key: str) -> str:
        """Answers every call with -32000, a server-defined error, like a rate limiter."""
        counts["limited"] += 1
        raise MCPError(-32000, f"rate limit exceeded for {key}")

    @server.tool(annotations=SAFE)
    async def echo(key: str, delay: float = 0.0) -> str:
        """Answers with its key, after `delay` seconds."""
        await anyio.sleep(delay)
        return key

    @server.tool(annotations=SAFE)
    async def bad_params(key: str) -> str:
        """Answers every call with -32602 (invalid params)."""
        raise MCPError(INVALID_PARAMS, f"the server does not like {key!r}")

    @server.tool(annotations=SAFE)
    async def unsupported(key: str) -> str:
        """Answers every call with -32601 (method not found)."""
        raise MCPError(METHOD_NOT_FOUND, f"nothing serves {key!r}")

    @server.tool(annotations=SAFE)
    async def log(max_count: int, verbose: bool = False) -> str:
        """Takes an integer, as the reference git server's git_log does."""
        return f"{max_count} entries{' (verbose)' if verbose else ''} ({type(max_count).__name__})"

    @server.tool(annotations=SAFE)
    async def pid() -> int:
        """The id of the process serving the call."""
        return os.getpid()

    @server.tool(annotations=SAFE)
    async def tries() -> int:
        """How many times `limited` ran on this server."""
        return counts["limited"]

    return server


def stdio() -> StdioServerParameters:
    """This server as a stdio subprocess of this checkout: a fresh process each time, forked from
    tests/forkserver.py's zygote, which imported the SDK once (a fresh interpreter costs 1.4 s or more)."""
    from tests import forkserver

    pythonpath = os.pathsep.join(p for p in (str(_SOURCE_ROOT), os.environ.get("PYTHONPATH")) if p)
    return forkserver.params([__file__], {"PYTHONPATH": pythonpath})


if __name__ == "__main__":
    anyio.run(build().run_stdio_async)
