"""Run the example server and a dispatcher in a fresh process, and report what became of its logging.

``python tests/quiet_probe.py BACKEND [--unguarded]`` builds a `Workspace`, dispatches a batch to it in
process, over stdio (the workspace as a subprocess, its stderr shared with this one) and over streamable
HTTP, with a handler on the root logger that records every record reaching it, and prints one JSON line:
the root's level and handlers and the SDK loggers' levels before and after, and the records. Nothing
configures logging here, as in a user's script. ``--unguarded`` also builds a bare `MCPServer`, which
configures the root logger: the test uses it to show its checks catch that.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from dispatcher import Dispatcher, ToolCall
from dispatcher.examples import Workspace, serve_http

SDK_LOGGERS = ("mcp", "mcp.server", "mcp.client", "mcp.server.lowlevel.server", "httpx", "uvicorn", "uvicorn.error")


def state() -> dict[str, Any]:
    root = logging.getLogger()
    return {
        "root_level": root.level,
        "root_handlers": [type(handler).__name__ for handler in root.handlers],
        "sdk_levels": {name: logging.getLogger(name).level for name in SDK_LOGGERS},
    }


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[tuple[str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelname, record.name, record.getMessage()[:200]))


async def batch(dispatcher: Dispatcher, server: str) -> list[str]:
    calls = [
        ToolCall(f"{server}-1", f"{server}__set_note", {"name": "a", "text": "b"}),
        ToolCall(f"{server}-2", f"{server}__read_note", {"name": "a"}),
    ]
    names = {entry.name for entry in dispatcher.tools()}
    calls = [
        call if call.name in names else ToolCall(call.id, call.name.split("__")[1], call.arguments) for call in calls
    ]
    return [result.status.value for result in await dispatcher.dispatch(calls)]


async def main(unguarded: bool) -> None:
    before = state()
    workspace = Workspace()
    if unguarded:
        from mcp.server.mcpserver import MCPServer

        MCPServer("bare")
    created = state()
    recorder = Recorder()
    logging.getLogger().addHandler(recorder)
    stdio = StdioServerParameters(
        command=sys.executable,
        args=["-m", "dispatcher.examples.workspace"],
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    statuses = []
    async with serve_http(Workspace(name="over-http").server) as url:
        async with Client(workspace.server) as local, Dispatcher() as dispatcher:
            await dispatcher.add_mcp_server("local", local, trusted=True)
            statuses += await batch(dispatcher, "local")
        async with Client(stdio) as piped, Dispatcher() as dispatcher:
            await dispatcher.add_mcp_server("piped", piped, trusted=True)
            statuses += await batch(dispatcher, "piped")
        async with Client(url) as remote, Dispatcher() as dispatcher:
            await dispatcher.add_mcp_server("remote", remote, trusted=True)
            statuses += await batch(dispatcher, "remote")
    logging.getLogger().removeHandler(recorder)
    after = state()
    print(
        json.dumps(
            {"before": before, "created": created, "after": after, "records": recorder.records, "statuses": statuses}
        )
    )


if __name__ == "__main__":
    anyio.run(main, "--unguarded" in sys.argv[2:], backend=sys.argv[1])
