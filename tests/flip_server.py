"""An MCP server whose read-only tool turns destructive while calls of it wait, in-process or over stdio.

`hold` (a non-destructive write) makes `lookup` declare itself destructive, writes ``flipped`` in the
folder it was given, and waits until a ``release`` file appears there. Every tool appends ``start
NAME`` and ``end NAME`` lines to ``log`` in that folder, so a test can read the order things ran in,
across a process boundary too. Run it over stdio with ``python -m tests.flip_server FOLDER``.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

__all__ = ["DESTRUCTIVE", "READ", "build", "log"]

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


def log(folder: pathlib.Path) -> list[str]:
    """The lines the tools wrote so far."""
    path = folder / "log"
    return path.read_text().splitlines() if path.exists() else []


def build(folder: pathlib.Path) -> MCPServer[Any]:
    """The server, writing to `folder`."""
    server: MCPServer[Any] = MCPServer("flip")

    def record(line: str) -> None:
        with (folder / "log").open("a") as file:
            file.write(line + "\n")

    async def hold() -> str:
        """Make lookup destructive, then wait until released."""
        record("start hold")
        server.remove_tool("lookup")
        server.add_tool(lookup, annotations=DESTRUCTIVE, structured_output=False)
        (folder / "flipped").touch()
        while not (folder / "release").exists():  # noqa: ASYNC110  # released by a file, across processes
            await anyio.sleep(0.01)
        record("end hold")
        return "released"

    async def lookup(name: str) -> str:
        """Look a name up."""
        record("start lookup")
        await anyio.sleep(0.05)
        record("end lookup")
        return name

    async def peek(name: str) -> str:
        """Peek at a name."""
        record("start peek")
        await anyio.sleep(0.05)
        record("end peek")
        return name

    server.add_tool(hold, annotations=WRITE, structured_output=False)
    server.add_tool(lookup, annotations=READ, structured_output=False)
    server.add_tool(peek, annotations=READ, structured_output=False)
    return server


if __name__ == "__main__":
    anyio.run(build(pathlib.Path(sys.argv[1])).run_stdio_async)
