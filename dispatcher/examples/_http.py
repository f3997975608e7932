"""Serve an `MCPServer` over streamable HTTP for the length of an `async with` block."""

from __future__ import annotations

import contextlib
import socket
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import uvicorn

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from mcp.server.mcpserver import MCPServer
    from starlette.applications import Starlette


@asynccontextmanager
async def serve_http(
    server: MCPServer[Any],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    path: str = "/mcp",
    startup_timeout: float = 10.0,
    shutdown_timeout: float = 2.0,
) -> AsyncIterator[str]:
    """Serve `server` over streamable HTTP and yield its URL; stop serving on exit.

    The listening socket is bound before the server starts, so `port=0` picks a free port and the
    URL names it. uvicorn runs only on asyncio, so it runs on its own event loop in a worker
    thread: this works under trio as well as asyncio, and the server keeps serving while the caller's
    loop is busy. Tool handlers therefore run on that thread; `Workspace` guards its state for this.

    On exit the server stops accepting connections, closes the open ones and finishes its in-flight
    requests (for at most `shutdown_timeout` seconds) before the block is left. Open streams (a legacy
    client's GET stream, a 2026-07-28 client's `subscriptions/listen`) count as in flight: close
    clients first for a quick exit, or lower `shutdown_timeout` to make the server vanish abruptly.

    Args:
        server: The server to serve. Each `serve_http` builds a fresh app from it, so one server
            may be served several times, one after the other.
        host: The address to listen on.
        port: The port to listen on; 0 picks a free one.
        path: The HTTP path of the MCP endpoint.
        startup_timeout: Seconds to wait for the server to start before giving up.
        shutdown_timeout: Seconds in-flight requests get to finish on exit before they are cancelled.

    Yields:
        The endpoint's URL, such as `http://127.0.0.1:54321/mcp`.

    Raises:
        OSError: The address cannot be bound.
        TimeoutError: The server did not start within `startup_timeout`.
        RuntimeError: The server stopped while starting.
    """

    def app() -> Starlette:
        # Called by uvicorn on its own loop: the app's anyio primitives must belong to that loop.
        return server.streamable_http_app(streamable_http_path=path, host=host)

    config = uvicorn.Config(
        app,
        factory=True,
        # Leave the host process's logging configuration alone; uvicorn's loggers still propagate.
        log_config=None,
        access_log=False,
        lifespan="on",
        # Typed int, but passed to asyncio.wait_for as a timeout, where fractions work.
        timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]
    )
    uv = _Server(config)
    with _listen(host, port) as sock:
        bound_port = sock.getsockname()[1]
        url_host = f"[{host}]" if ":" in host else host
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, uv.run_in_thread, sock)
            try:
                with anyio.fail_after(startup_timeout):
                    await anyio.to_thread.run_sync(uv.ready.wait, abandon_on_cancel=True)
                if not uv.started:
                    raise RuntimeError("the HTTP server stopped while starting; see the uvicorn log")
                yield f"http://{url_host}:{bound_port}{path}"
            finally:
                # uvicorn checks this flag every 0.1 s, then shuts down and its thread returns,
                # which the task group waits for.
                uv.should_exit = True


class _Server(uvicorn.Server):
    """uvicorn's server, made to run in a worker thread and report when it is listening."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    def run_in_thread(self, sock: socket.socket) -> None:
        try:
            self.run(sockets=[sock])
        except SystemExit as exc:
            # uvicorn exits the process when its app fails to start; in a thread that is an error.
            raise RuntimeError(f"the HTTP server failed to start (exit status {exc.code})") from exc
        finally:
            self.ready.set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.ready.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The `async with` block owns the server's lifetime: leave the process's signals alone.
        yield


@contextlib.contextmanager
def _listen(host: str, port: int) -> Iterator[socket.socket]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family)
    # create_server leaves the socket's `proto` at 0 and accepted sockets inherit it, but asyncio
    # turns on TCP_NODELAY only for sockets whose `proto` is IPPROTO_TCP. Under Nagle's algorithm
    # uvicorn's response body, written after its headers, waits for the client's delayed ACK: about
    # 40 ms a call. Naming the protocol gets every accepted connection TCP_NODELAY.
    with socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=listener.detach()) as sock:
        yield sock
