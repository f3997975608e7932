"""The workspace's plumbing: changes delivered on each listener's own loop, and the root logger left alone."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.subscriptions import InMemorySubscriptionBus, ServerEvent

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator

    from anyio.lowlevel import EventLoopToken

__all__ = ["LoopAwareBus", "on_loop", "root_logger_kept"]


class LoopAwareBus(InMemorySubscriptionBus):
    """A subscription bus whose listen streams may be served by different event loops.

    `serve_http` serves from a thread with its own loop, while the workspace is changed from the
    caller's loop. Each listener is called on the loop it subscribed from, since the SDK's listeners
    write to memory streams that belong to that loop.
    """

    def __init__(self) -> None:
        super().__init__()
        self._loops: dict[object, EventLoopToken] = {}
        self._guard = threading.Lock()

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        token = anyio.lowlevel.current_token()
        key = object()
        with self._guard:
            self._loops[key] = token
        unsubscribe = super().subscribe(functools.partial(self._deliver, key, listener))

        def release() -> None:
            with self._guard:
                self._loops.pop(key, None)
            unsubscribe()

        return release

    def _deliver(self, key: object, listener: Callable[[ServerEvent], None], event: ServerEvent) -> None:
        with self._guard:
            token = self._loops.get(key)
        if token is None:
            return
        if token == anyio.lowlevel.current_token():
            listener(event)
        else:
            # The listener only queues the event, so waiting for the other loop is brief.
            with contextlib.suppress(anyio.RunFinishedError):
                anyio.from_thread.run_sync(listener, event, token=token)


async def on_loop(token: EventLoopToken, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Await `fn()` on the event loop of `token`, from any loop; nothing if that loop has ended."""
    if token == anyio.lowlevel.current_token():
        await fn()
        return
    run = functools.partial(anyio.from_thread.run, fn, token=token)
    with contextlib.suppress(anyio.RunFinishedError):
        await anyio.to_thread.run_sync(run)


@contextlib.contextmanager
def root_logger_kept() -> Iterator[None]:
    """Leave the root logger as it was: `MCPServer()` configures it, which a library must not do.

    The SDK's constructor calls `logging.basicConfig(level=INFO)` with a handler of its own (its
    `configure_logging`; it does something only when the root has no handler, as in a plain script),
    after which every INFO line of the SDK, httpx and uvicorn is printed, in the middle of a prompt if
    one is on screen. The root's level and handlers are put back as they were; the application's own
    logging configuration, before or after, is left alone.
    """
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        for handler in [handler for handler in root.handlers if handler not in handlers]:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)
