"""The transports the dispatcher builds to stdio commands and streamable HTTP URLs: capped answers, noted refusals.

`AnswerLimit` caps the size of each message a server sends on a transport the dispatcher builds (stdio
and streamable HTTP): an answer over the cap is replaced, before the SDK's session sees it, by an
error answer to the same request, so that one call fails and the connection goes on. The SDK reads a
message whole before it hands it on (a stdio line, an HTTP body or SSE event), so the cap bounds what
reaches the session, the catalogue and the model, not the transport's own buffer for that message.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Self

import httpx2
import pydantic_core
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED, ErrorData, JSONRPCError, JSONRPCNotification, JSONRPCRequest

from ._failures import ANSWER_TOO_LARGE, AuthenticationRequired

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import TracebackType

    from mcp.client import Transport


__all__ = ["DEFAULT_MAX_ANSWER_BYTES", "AnswerLimit", "AuthRefusals", "capped_transport"]

# The default cap on one message from a server: room for a few large images or documents in one answer.
DEFAULT_MAX_ANSWER_BYTES = 16 * 2**20
# Room above the cap for the SDK's own bound on one SSE event (the event's framing around the message).
_SSE_SLACK = 64 * 1024

logger = logging.getLogger("dispatcher")


def capped_transport(
    target: StdioServerParameters | str, limit: int | None, server: str, refusals: AuthRefusals | None = None
) -> Transport:
    """The transport to a stdio command or a streamable HTTP URL, its messages capped at `limit` bytes (None: not).

    The SDK bounds the buffer of one SSE event by itself (1 MiB unless told otherwise, which would cap
    every HTTP answer sent as an event there): it is set just above `limit`, so that the cap is the one
    limit, and what the SDK refuses beyond it reads as an answer over the cap too. An HTTP transport
    notes in `refusals` each 401 or 403 its server answers.
    """
    if isinstance(target, StdioServerParameters):
        transport: Transport = stdio_client(target)
    else:
        transport = _http_transport(target, None if limit is None else limit + _SSE_SLACK, refusals)
    return transport if limit is None else AnswerLimit(transport, limit, server)


# The most of a server's WWW-Authenticate header that goes into an error.
_CHALLENGE_TEXT = 500


class AuthRefusals:
    """The last 401 or 403 a streamable HTTP server answered (the SDK reports those as a bare -32603)."""

    __slots__ = ("challenge", "status")

    def __init__(self) -> None:
        self.status: int | None = None
        self.challenge: str | None = None

    def clear(self) -> None:
        self.status = self.challenge = None

    async def on_response(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            self.status = response.status_code
            self.challenge = response.headers.get("www-authenticate")

    def error(self, server: str) -> AuthenticationRequired | None:
        """What to tell the user when the last refusal is why connecting failed (None: there was none)."""
        if self.status is None:
            return None
        what = "401 Unauthorized" if self.status == 401 else "403 Forbidden"
        if self.challenge:
            # The server's own text: shown escaped and cut short, since it is untrusted.
            asked = f"; it asked for WWW-Authenticate: {self.challenge[:_CHALLENGE_TEXT]!r}"
        else:
            asked = "; it sent no WWW-Authenticate challenge"
        return AuthenticationRequired(
            f"server {server!r} requires authentication: it answered HTTP {what}{asked}. Pass credentials "
            "with a client factory (headers or the SDK's OAuthClientProvider; see docs/mcp.md)"
        )


@asynccontextmanager
async def _http_transport(url: str, max_sse: int | None, refusals: AuthRefusals | None) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport over an HTTP client of its defaults that reports refusals."""
    hooks = {"response": [refusals.on_response]} if refusals is not None else None
    # The SDK's default HTTP client (`create_mcp_http_client`, in a private module): 30 s to connect,
    # write and wait for a connection, 300 s to read, since a server may hold a response stream open.
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0), event_hooks=hooks)
    async with http, streamable_http_client(url, http_client=http, max_sse_event_size=max_sse) as streams:
        yield streams


class AnswerLimit:
    """A transport whose incoming messages are capped at `limit` bytes of JSON (see the module docstring).

    An answer (result or error) over the cap becomes the error answer `ANSWER_TOO_LARGE` to the same
    request; a notification or a request from the server over the cap is dropped (and logged), since
    nothing waits for it.
    """

    def __init__(self, transport: Transport, limit: int, server: str) -> None:
        self._transport = transport
        self._limit = limit
        self._server = server

    # The SDK's stream protocols live in private modules: the streams are typed loosely here.
    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self._transport.__aenter__()
        return _CappedReadStream(read, self._limit, self._server), write

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._transport.__aexit__(exc_type, exc, tb)


class _CappedReadStream:
    """The transport's read stream with messages over the cap replaced or dropped; `last_context` passes through."""

    __slots__ = ("_inner", "_limit", "_server")

    def __init__(self, inner: Any, limit: int, server: str) -> None:
        self._inner = inner
        self._limit = limit
        self._server = server

    @property
    def last_context(self) -> Any:
        # The SDK's dispatcher runs each message in the context its transport captured with it.
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item: SessionMessage | Exception | None = self._check(await self._inner.receive())
            if item is not None:
                return item

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        while True:
            item: SessionMessage | Exception | None = self._check(await self._inner.__anext__())
            if item is not None:
                return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        suppressed: bool | None = await self._inner.__aexit__(exc_type, exc, tb)
        return suppressed

    def _check(self, item: SessionMessage | Exception) -> SessionMessage | Exception | None:
        if not isinstance(item, SessionMessage):
            return item
        message = item.message
        if isinstance(message, JSONRPCError) and _sse_too_large(message.error):
            # The SDK's HTTP client refused an SSE event over its bound (see `capped_transport`) with
            # -32000, which reads as a lost connection and is retried: it is this answer, too large.
            return self._too_large(item, message.id, None)
        size = len(pydantic_core.to_json(message, by_alias=True, exclude_none=True))
        if size <= self._limit:
            return item
        if isinstance(message, JSONRPCNotification | JSONRPCRequest):
            logger.warning(
                "dropped a %s message of %d bytes from server %r: over max_answer_bytes (%d)",
                message.method[:100],
                size,
                self._server,
                self._limit,
            )
            return None
        return self._too_large(item, message.id, size)

    def _too_large(self, item: SessionMessage, request: Any, size: int | None) -> SessionMessage:
        """The error answer to `request` that replaces an answer of `size` bytes (None: unknown) over the cap."""
        what = f"is {size:,} bytes" if size is not None else "is larger than that"
        error = ErrorData(
            code=ANSWER_TOO_LARGE,
            message=(
                f"the server's answer {what}, over the limit of {self._limit:,} bytes "
                "(Dispatcher.connect(max_answer_bytes=...)); it was discarded"
            ),
            data={"max_answer_bytes": self._limit, "size": size},
        )
        return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request, error=error), metadata=item.metadata)


def _sse_too_large(error: ErrorData) -> bool:
    """Whether an error is the SDK's HTTP client refusing one SSE event over its size bound."""
    text = error.message
    return error.code == CONNECTION_CLOSED and text.startswith("SSE stream failed") and "byte limit" in text
