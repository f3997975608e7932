"""`@modelcontextprotocol/server-everything`, the reference server from npm, for the tests that run it over stdio.

`npm_server` finds the other pinned reference servers (filesystem, memory: tests/test_npm_servers.py).
`.ci/node-servers` (run by `make test` and `.ci/run`) installs the versions pinned in `.ci/node/package-lock.json`
into `.node/`. Where node or the installed server is missing the tests skip with a reason, except under
`CI=true`, where that fails them: CI must run them.
"""

from __future__ import annotations

import os
import shutil
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.message import SessionMessage
from mcp.types import INTERNAL_ERROR, ErrorData, JSONRPCError

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parent.parent


def npm_server(package: str, *args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    """The stdio parameters of the installed `@modelcontextprotocol/server-<package>` (skips, or fails under CI)."""
    entry = ROOT / ".node" / "node_modules" / "@modelcontextprotocol" / f"server-{package}" / "dist" / "index.js"
    node = shutil.which("node")
    reason = None
    if node is None:
        reason = "node is not on PATH: install Node.js 18 or newer, then run .ci/node-servers"
    elif not entry.is_file():
        reason = f"server-{package} is not installed at {entry}: run .ci/node-servers (or make test)"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    assert node is not None
    return StdioServerParameters(command=node, args=[str(entry), *args], env=env)


def everything() -> StdioServerParameters:
    """The stdio parameters of the installed server-everything (skips, or fails under CI, when it is missing)."""
    return npm_server("everything", "stdio")


@dataclass
class Sent:
    """One message the client wrote, as the wire log saw it."""

    at: float
    method: str | None
    id: Any
    params: dict[str, Any] | None


@dataclass
class WireLog:
    """The messages a client sent and received, with the time each was written or read, and an event per method.

    `refuse` names request methods the log answers itself with an error instead of passing them on (a
    server that refuses them), for fault injection.
    """

    sent: list[Sent] = field(default_factory=list)
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    events: dict[str, anyio.Event] = field(default_factory=dict)

    def event(self, method: str) -> anyio.Event:
        """Set when the client first sends `method`."""
        return self.events.setdefault(method, anyio.Event())

    def methods(self) -> list[str | None]:
        return [entry.method for entry in self.sent]

    def first(self, method: str) -> Sent:
        return next(entry for entry in self.sent if entry.method == method)

    def answer_to(self, request: Any) -> dict[str, Any] | None:
        """The server's answer to the request with this id, if it came."""
        for _, message in self.received:
            if message.get("id") == request and ("result" in message or "error" in message):
                return message
        return None


class LoggedTransport:
    """A transport with every message through it recorded in a `WireLog` (and some refused, see `WireLog.refuse`)."""

    def __init__(self, inner: Any, log: WireLog) -> None:
        self._inner = inner
        self._log = log
        self._stack: AsyncExitStack | None = None

    async def __aenter__(self) -> tuple[Any, Any]:
        stack = AsyncExitStack()
        read, write = await stack.enter_async_context(self._inner)
        to_client, client_read = anyio.create_memory_object_stream[SessionMessage | Exception](100)
        client_write, from_client = anyio.create_memory_object_stream[SessionMessage](100)
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        log = self._log

        async def inbound() -> None:
            async with to_client:
                async for item in read:
                    if isinstance(item, SessionMessage):
                        log.received.append((anyio.current_time(), item.message.model_dump(by_alias=True)))
                    await to_client.send(item)

        async def outbound() -> None:
            async with from_client:
                async for item in from_client:
                    data = item.message.model_dump(by_alias=True, exclude_none=True)
                    method = data.get("method")
                    log.sent.append(Sent(anyio.current_time(), method, data.get("id"), data.get("params")))
                    if method is not None:
                        log.event(method).set()
                    if method in log.refuse and "id" in data:
                        error = ErrorData(code=INTERNAL_ERROR, message=f"{method} refused (test fault)")
                        await to_client.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=data["id"], error=error)))
                        continue
                    await write.send(item)

        tg.start_soon(inbound)
        tg.start_soon(outbound)
        self._stack = stack
        return client_read, client_write

    async def __aexit__(self, *exc_info: Any) -> None:
        assert self._stack is not None
        await self._stack.__aexit__(*exc_info)


def logged_everything(log: WireLog, *, mode: Literal["auto", "legacy"] = "auto") -> Callable[[], Client]:
    """A client factory for `Dispatcher.connect`: server-everything over stdio, its messages in `log`."""
    params = everything()
    return lambda: Client(LoggedTransport(stdio_client(params), log), mode=mode)
