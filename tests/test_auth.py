"""Authentication failures of streamable HTTP servers are readable, and credentials pass through a client factory."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer

from dispatcher import Dispatcher, ServerConnectionError, ToolCall

from .auth_server import CHALLENGE, guarded_app, serve_app, serve_refusing

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio


async def test_401_says_authentication_is_required_and_what_was_asked() -> None:
    """A 401 fails connect with ServerConnectionError naming the status and the server's WWW-Authenticate."""
    async with serve_refusing(401) as url, Dispatcher() as dispatcher:
        with pytest.raises(ServerConnectionError) as caught:
            await dispatcher.connect("remote", url, connect_timeout=20)
    text = str(caught.value)
    assert "server 'remote' requires authentication" in text
    assert "HTTP 401 Unauthorized" in text and CHALLENGE in text
    assert "-32603" not in text and "client factory" in text


async def test_403_without_a_challenge() -> None:
    """A 403 with no challenge says so, not a bare internal error."""
    async with serve_refusing(403, challenge=None) as url, Dispatcher() as dispatcher:
        with pytest.raises(ServerConnectionError, match="HTTP 403 Forbidden; it sent no WWW-Authenticate") as caught:
            await dispatcher.connect("remote", url, connect_timeout=20)
    assert "-32603" not in str(caught.value)


async def test_a_hostile_challenge_is_cut_short() -> None:
    """The server's challenge is its own text: it reaches the message escaped and at most 500 characters long."""
    challenge = "Bearer " + "x" * 5000
    async with serve_refusing(401, challenge=challenge) as url, Dispatcher() as dispatcher:
        with pytest.raises(ServerConnectionError) as caught:
            await dispatcher.connect("remote", url, connect_timeout=20)
    assert "x" * 490 in str(caught.value) and "x" * 501 not in str(caught.value)
    assert len(str(caught.value)) < 1000


def _server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("guarded")

    @server.tool()
    def whoami() -> str:
        """Say hello."""
        return "authorized"

    return server


async def test_a_token_through_a_client_factory_gets_in() -> None:
    """A real MCP server behind a bearer check: no token fails readably; a factory that sends it connects and calls."""

    @asynccontextmanager
    async def authorized(url: str, token: str) -> AsyncIterator[Any]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
            streamable_http_client(url, http_client=http) as streams,
        ):
            yield streams

    async with serve_app(lambda: guarded_app(_server(), "s3cret")) as url, Dispatcher() as dispatcher:
        with pytest.raises(ServerConnectionError, match="requires authentication: it answered HTTP 401"):
            await dispatcher.connect("anonymous", url, connect_timeout=20)
        await dispatcher.connect("guarded", lambda: Client(authorized(url, "s3cret")), trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", "whoami", {})])
    assert result.ok, result.error
    assert result.result is not None and "authorized" in str(result.result.content)


@pytest.mark.parametrize("built", ["url", "http_client"])
async def test_a_client_factory_gets_the_readable_401_too(built: str) -> None:
    """A factory's Client on a URL, or on the SDK's HTTP transport over the user's client, reads 401, not -32603."""
    opened: list[httpx2.AsyncClient] = []
    async with serve_refusing(401) as url, Dispatcher() as dispatcher:

        def factory() -> Client:
            if built == "url":
                return Client(url)
            http = httpx2.AsyncClient(headers={"Authorization": "Bearer expired"})
            opened.append(http)
            return Client(streamable_http_client(url, http_client=http))

        with pytest.raises(ServerConnectionError) as caught:
            await dispatcher.connect("remote", factory, connect_timeout=20)
        for http in opened:  # the user's HTTP client is the user's to close
            await http.aclose()
    text = str(caught.value)
    assert "server 'remote' requires authentication" in text and "HTTP 401 Unauthorized" in text
    assert "-32603" not in text
