"""A streamable-HTTP endpoint that refuses every request as unauthenticated (401) or forbidden (403).

Served on 127.0.0.1 by uvicorn in a worker thread (as `dispatcher.examples._http.serve_http` serves an
`MCPServer`), for the tests of how `Dispatcher.connect` reports an authentication failure.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from dispatcher.examples._http import _listen, _Server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from mcp.server.mcpserver import MCPServer
    from starlette.requests import Request
    from starlette.types import Receive, Scope, Send

CHALLENGE = 'Bearer realm="mcp", error="invalid_token", resource_metadata="http://127.0.0.1/.well-known/oauth"'


def refusing_app(status: int, challenge: str | None, seen: list[dict[str, str]]) -> Starlette:
    """An app whose /mcp answers every request with `status` and, when given, a `WWW-Authenticate` challenge."""

    async def endpoint(request: Request) -> JSONResponse:
        seen.append(dict(request.headers))
        headers = {"WWW-Authenticate": challenge} if challenge is not None else {}
        return JSONResponse({"error": "invalid_token", "error_description": "no token"}, status, headers=headers)

    return Starlette(routes=[Route("/mcp", endpoint, methods=["GET", "POST", "DELETE"])])


def guarded_app(server: MCPServer[Any], token: str) -> Starlette:
    """`server` over streamable HTTP, answering 401 with a Bearer challenge unless the request carries `token`."""
    inner = server.streamable_http_app(host="127.0.0.1")

    async def guard(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != f"Bearer {token}".encode():
            refusal = JSONResponse({"error": "invalid_token"}, 401, headers={"WWW-Authenticate": CHALLENGE})
            await refusal(scope, receive, send)
            return
        await inner(scope, receive, send)

    # The MCP app's lifespan (its session manager) runs as the wrapper's.
    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with inner.router.lifespan_context(inner):
            yield

    return Starlette(routes=[Mount("/", app=guard)], lifespan=lifespan)


@asynccontextmanager
async def serve_refusing(
    status: int = 401, challenge: str | None = CHALLENGE, seen: list[dict[str, str]] | None = None
) -> AsyncIterator[str]:
    """Serve `refusing_app` on a free port of 127.0.0.1; yield its MCP URL."""
    async with serve_app(lambda: refusing_app(status, challenge, [] if seen is None else seen)) as url:
        yield url


@asynccontextmanager
async def serve_app(app: Callable[[], Starlette]) -> AsyncIterator[str]:
    """Serve the ASGI app `app()` builds on a free port of 127.0.0.1 in a worker thread; yield the URL of its /mcp.

    `app` is called on uvicorn's own event loop, where the app's anyio primitives must belong.
    """
    uv = _Server(uvicorn.Config(app, factory=True, log_config=None, access_log=False, lifespan="on"))
    with _listen("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, uv.run_in_thread, sock)
            try:
                with anyio.fail_after(10):
                    await anyio.to_thread.run_sync(uv.ready.wait, abandon_on_cancel=True)
                yield f"http://127.0.0.1:{port}/mcp"
            finally:
                uv.should_exit = True


__all__ = ["CHALLENGE", "guarded_app", "refusing_app", "serve_app", "serve_refusing"]
