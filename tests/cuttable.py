"""An in-process JSON-RPC transport whose connection a test can cut, the way a crash cuts a pipe."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
from mcp.client._memory import InMemoryTransport
from mcp.shared.message import SessionMessage

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from mcp.client._transport import TransportStreams
    from mcp.server.mcpserver import MCPServer


class CuttableTransport:
    """Connects a client to `server` in process; cancelling a scope in `live` cuts that connection."""

    def __init__(self, server: MCPServer[Any], live: set[anyio.CancelScope]) -> None:
        self._server = server
        self._live = live
        self._cm: Any = None

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[TransportStreams]:
        async with InMemoryTransport(self._server) as (read, write):
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](100)
            scope = anyio.CancelScope()

            async def pump() -> None:
                async with send:
                    with scope:
                        async for message in read:
                            await send.send(message)

            self._live.add(scope)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump)
                    try:
                        yield receive, write
                    finally:
                        scope.cancel()
            finally:
                self._live.discard(scope)

    async def __aenter__(self) -> TransportStreams:
        self._cm = self._connect()
        return await self._cm.__aenter__()  # type: ignore[no-any-return]

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._cm.__aexit__(*exc_info)
