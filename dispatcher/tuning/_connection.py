"""The one connection a `tune` sweep or an `inspect` report runs over, and how targets are described.

A target is an entered `mcp.Client` (the caller's, left open), anything `mcp.Client` connects to (an
in-process `MCPServer` or `Server`, a `StdioServerParameters`, a streamable HTTP URL), or a function that
returns a new, unentered `mcp.Client` (how the command line sends a server's stderr to a file).
"""

from __future__ import annotations

import contextlib
import math
import shlex
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

from dispatcher._core._errors import ConfigurationError, DispatcherError, ServerConnectionError
from dispatcher._mcp._failures import explain, innermost

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

__all__ = ["LOST", "Target", "connected", "describe_target", "lost_connection"]

Target: TypeAlias = "Client | MCPServer[Any] | Server[Any] | StdioServerParameters | str | Callable[[], Client]"
"""What `tune` and `inspect` connect to."""

LOST = (MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
"""What an entered client raises when its server exited, closed the connection or refused to list its tools."""

# What the client's own tasks raise when the transport under it fails (an HTTP server gone mid-request).
_TRANSPORT = (*LOST, httpx2.TransportError, OSError)

_CONNECTABLE = (MCPServer, Server, StdioServerParameters, str)


@contextlib.asynccontextmanager
async def connected(
    target: Target,
    *,
    mode: Literal["auto", "legacy"],
    connect_timeout: float | None,
    description: str | None = None,
) -> AsyncIterator[Client]:
    """The caller's entered client, or a client connected to `target` for as long as the context lasts.

    Raises:
        ConfigurationError: `target` is nothing a client can connect to.
        ServerConnectionError: The connection failed, or took longer than `connect_timeout` seconds.
    """
    if isinstance(target, Client):
        yield target
        return
    description = description or describe_target(target)
    try:
        client = Client(target, mode=mode) if isinstance(target, _CONNECTABLE) else target()
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot connect to {description}: {exc}") from None
    if not isinstance(client, Client):
        raise ConfigurationError(f"the client factory returned {type(client).__name__}, not an mcp.Client")
    connected = False
    deadline = math.inf if connect_timeout is None else anyio.current_time() + connect_timeout
    try:
        # One scope around the whole session: its deadline bounds connecting, and is lifted once
        # connected (a scope cannot end while the client it encloses is still open).
        with anyio.CancelScope(deadline=deadline) as scope:
            async with client:
                scope.deadline = math.inf
                connected = True
                yield client
    except Exception as exc:
        if connected:
            raise
        raise ServerConnectionError(f"could not connect to {description}: {innermost(exc)}") from exc
    if scope.cancelled_caught and not connected:
        raise ServerConnectionError(f"could not connect to {description} within {connect_timeout} s")


def describe_target(target: object) -> str:
    """A target, for people: the command line, the URL, or what kind of object it is."""
    if isinstance(target, Client):
        return "an entered mcp.Client"
    if isinstance(target, StdioServerParameters):
        return shlex.join([target.command, *target.args])
    if isinstance(target, str):
        return target
    if isinstance(target, MCPServer | Server):
        return f"in-process {type(target).__name__}"
    # A factory may say what it connects to (the command line's do).
    description = getattr(target, "description", None)
    return description if isinstance(description, str) else "a client factory"


def lost_connection(exc: BaseException) -> str | None:
    """How the server stopped answering, when `exc` (a group, perhaps) is only that; else None.

    A connection that could not be made is not a lost one: `connected` raises a `ServerConnectionError`
    (a `DispatcherError`) for it, which is never taken for a loss.
    """
    if isinstance(exc, BaseExceptionGroup):
        leaves = [lost_connection(inner) for inner in exc.exceptions]
        return explain(exc) if leaves and all(leaves) else None
    if isinstance(exc, DispatcherError) or not isinstance(exc, _TRANSPORT):
        return None
    return explain(exc)
