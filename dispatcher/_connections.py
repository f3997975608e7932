"""MCP servers in the catalogue: their tool lists kept current, and the connections the dispatcher owns.

A server is registered in one of two ways:

- `Dispatcher.add_mcp_server` with an entered `mcp.Client` that the user owns. Its tools are listed on
  registration and again on `Dispatcher.refresh`.
- `Dispatcher.connect` with a target (an in-process server, a stdio command, a URL or a client
  factory). The dispatcher owns the client: a supervisor task in the dispatcher's task group enters it,
  lists the tools, follows `tools/list_changed`, and exits it when the connection is lost or the
  dispatcher closes. A `Client` can be entered only once, so the next call that needs the server
  connects a fresh one, which lists the tools again and re-checks their pins. There is one reconnect at
  a time per server, shared by every call that waits for it; after a failed attempt, calls fail at
  once until a doubling, bounded backoff has passed, so a dead server is not hammered.

Every listing goes through `ServerRegistry`: each tool is checked against its pin (`_pins`), changed
tools are blocked, tools that disappeared leave a tombstone, and the catalogue is updated in one step.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from mcp import Client, StdioServerParameters
from mcp.client.subscriptions import SubscriptionLost
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ._annotations import effective_annotations
from ._catalog import ToolEntry
from ._errors import ConfigurationError
from ._mcp import CONNECTION_CLOSED, MCPTool, ToolUnavailableError, is_connection_loss, list_all_tools
from ._pins import DefinitionChange, Pins

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from anyio.abc import TaskStatus
    from mcp.client.session import IncomingMessage, MessageHandlerFnT
    from mcp.types import CallToolResult, Tool, ToolAnnotations

    from ._catalog import Catalog, ToolImpl
    from ._keys import KeyFunction
    from ._mcp import ToolCaller

__all__ = ["Connection", "ServerRegistry", "check_target"]

logger = logging.getLogger("dispatcher")

# Reconnect backoff after failed attempts: 1 s, 2 s, 4 s, ... up to 30 s. A lost connection is
# reconnected at once; only attempts that fail make the next one wait.
_BACKOFF_FIRST = 1.0
_BACKOFF_MAX = 30.0
# Seconds the dispatcher gives its clients to close cleanly on exit before cancelling them.
_CLOSE_GRACE = 5.0
# Seconds a server has to answer the ping sent after a call was given up on; no answer is a lost connection.
_PING_TIMEOUT = 10.0
# Seconds a 2026-07-28 server has to acknowledge `subscriptions/listen` before changes go unfollowed.
_LISTEN_ACK_TIMEOUT = 10.0


def check_target(target: object) -> None:
    """Raise `ConfigurationError` unless `target` is something `Dispatcher.connect` can connect to."""
    if isinstance(target, MCPServer | Server | StdioServerParameters | str) or callable(target):
        return
    raise ConfigurationError(
        "target must be an MCPServer, a StdioServerParameters, a URL string, or a function that returns a new "
        f"mcp.Client; got {type(target).__name__}"
    )


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        code = exc.error.code
        return exc.error.message if code == CONNECTION_CLOSED else f"{exc.error.message} (MCP error {code})"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(eq=False)
class _Attempt:
    done: anyio.Event = field(default_factory=anyio.Event)
    error: str | None = None


class Connection:
    """A client the dispatcher owns, entered and exited by one supervisor task (`run`).

    Calls go through `call_tool`, which waits for a connection (connecting one if needed) and reports a
    lost connection so that the next call connects afresh.
    """

    def __init__(
        self,
        server: str,
        target: MCPServer[Any] | Server[Any] | StdioServerParameters | str | Callable[[], Client],
        *,
        mode: str,
        sync: Callable[[Client], Awaitable[list[DefinitionChange]]],
        ask: Callable[[list[DefinitionChange]], Awaitable[None]],
        unavailable: Callable[[str], str | None],
        follow: bool,
        timeout: float | None,
    ) -> None:
        self.server = server
        self._target = target
        self._mode = mode
        self._sync = sync
        self._ask = ask
        self._unavailable = unavailable
        self._follow = follow
        self._timeout = timeout
        self._client: Client | None = None
        self._drop = anyio.Event()
        self._demand = anyio.Event()
        self._attempt: _Attempt | None = None
        self._retry_at = -math.inf
        self._failures = 0
        self._error = ""
        self._closed = False
        self._closing = False
        self._running = False
        self._ended = anyio.Event()
        self._list_changed = anyio.Event()
        # Set when a call on the current client was given up on: the client is then asked to prove it is alive.
        self._suspect = anyio.Event()

    @property
    def protocol_version(self) -> str | None:
        """The protocol version of the current connection, if connected."""
        return self._client.protocol_version if self._client is not None else None

    # The supervisor ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect, then keep a client for as long as the dispatcher runs, reconnecting on demand.

        The first connection is made before `task_status.started()`; if it fails, this raises.
        """
        self._running = True
        try:
            await self._session(task_status)
            while not self._closing:
                await self._demand.wait()
                self._demand = anyio.Event()
                if self._closing:
                    break
                try:
                    await self._session(None)
                except Exception as exc:
                    self._failed(exc)
        finally:
            self._closed = True
            self._client = None
            self._end_attempt("the dispatcher is closing")
            self._ended.set()

    async def aclose(self) -> None:
        """Close the client normally (not by cancellation) and stop the supervisor."""
        self._closing = True
        self._client = None
        self._drop.set()
        self._demand.set()
        if self._running:
            await self._ended.wait()

    async def _session(self, task_status: TaskStatus[None] | None) -> None:
        """Enter one client, list its tools, serve calls until it is dropped, and exit it."""
        client = self._new_client()
        connected = False
        if not self._closing:
            self._drop = anyio.Event()
        deadline = math.inf if self._timeout is None else anyio.current_time() + self._timeout
        try:
            # One scope around the whole session: its deadline bounds connecting and listing, and is
            # lifted once connected (a scope cannot end while the client it encloses is still open).
            with anyio.CancelScope(deadline=deadline) as scope:
                async with client, anyio.create_task_group() as tg:
                    self._list_changed = anyio.Event()
                    self._suspect = anyio.Event()
                    if self._follow:
                        # Listen first, then list: a change made in between is not missed.
                        await tg.start(self._follow_changes, client)
                    changes = await self._sync(client)
                    scope.deadline = math.inf
                    self._client = client
                    connected = True
                    tg.start_soon(self._check_alive, client)
                    self._failures = 0
                    self._retry_at = -math.inf
                    if task_status is None:
                        # Calls waiting for this reconnect go ahead while the user decides: the
                        # changed tools stay blocked meanwhile.
                        self._end_attempt(None)
                        await self._ask(changes)
                    else:
                        # The first connection: `connect` returns once the user has decided.
                        await self._ask(changes)
                        task_status.started()
                    await self._drop.wait()
                    tg.cancel_scope.cancel()
            if scope.cancelled_caught and not connected:
                raise TimeoutError(f"no connection within {self._timeout}s")
        except Exception as exc:
            if not connected:
                raise
            # The transport failed under the session (a crashed server, a refused HTTP request).
            self._lost(client, exc)
        finally:
            if self._client is client:
                self._client = None

    def _new_client(self) -> Client:
        target = self._target
        if isinstance(target, MCPServer | Server | StdioServerParameters | str):
            return Client(target, mode=self._mode, message_handler=self._on_message)
        client = target()
        if not isinstance(client, Client):
            raise TypeError(
                f"the client factory of server {self.server!r} returned {type(client).__name__}, not a Client"
            )
        client.message_handler = self._chain(client.message_handler)
        return client

    def _chain(self, user: MessageHandlerFnT | None) -> MessageHandlerFnT:
        if user is None:
            return self._on_message

        async def handler(message: IncomingMessage) -> None:
            await self._on_message(message)
            await user(message)

        return handler

    async def _on_message(self, message: IncomingMessage) -> None:
        # Runs in the session's receive loop: only note the change; the follower does the listing.
        if isinstance(message, ToolListChangedNotification):
            self._list_changed.set()
        await anyio.lowlevel.checkpoint()

    async def _follow_changes(self, client: Client, *, task_status: TaskStatus[None]) -> None:
        """List the tools again whenever the server says they changed; started once listening."""
        started = False
        try:
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                async with contextlib.AsyncExitStack() as stack:
                    subscription = None
                    # A server that never acknowledges must not hold up connecting: go on without.
                    with anyio.move_on_after(_LISTEN_ACK_TIMEOUT):
                        subscription = await stack.enter_async_context(client.listen(tools_list_changed=True))
                    task_status.started()
                    started = True
                    if subscription is None or not subscription.honored.tools_list_changed:
                        logger.debug("server %r does not announce tool list changes", self.server)
                        return
                    async for _ in subscription:
                        await self._resync(client)
            else:
                # Legacy servers send notifications/tools/list_changed unasked; `_on_message` notes them.
                task_status.started()
                started = True
                while True:
                    await self._list_changed.wait()
                    self._list_changed = anyio.Event()
                    await self._resync(client)
        except Exception as exc:
            if not started:
                task_status.started()
            if isinstance(exc, SubscriptionLost) or is_connection_loss(exc):
                self._lost(client, exc)
            else:
                # For example a server that does not serve subscriptions/listen: nothing to follow.
                logger.debug("not following tool list changes of server %r: %s", self.server, _describe(exc))

    async def _check_alive(self, client: Client) -> None:
        """Ping the server after each call that was given up on; no answer in time means the connection is lost.

        A call that times out (or whose caller gives up) proves nothing about the connection, and a
        connection can stay open while nothing gets through any more: a stdio server that writes bytes
        that are not UTF-8 stops the SDK reading its output for good, while the process runs on. Without
        this check every later call would time out as well, for as long as the dispatcher runs. Any
        answer proves the connection alive, an error included (2026-07-28 servers no longer serve ping).
        """
        while True:
            await self._suspect.wait()
            self._suspect = anyio.Event()
            with anyio.move_on_after(_PING_TIMEOUT) as scope:
                try:
                    await client.session.send_ping()
                except Exception as exc:
                    if is_connection_loss(exc):
                        self._lost(client, exc)
                        return
            if scope.cancelled_caught:
                self._lost(client, TimeoutError(f"the server did not answer a ping within {_PING_TIMEOUT}s"))
                return

    async def _resync(self, client: Client) -> None:
        try:
            await self._ask(await self._sync(client))
        except Exception as exc:
            if isinstance(exc, SubscriptionLost) or is_connection_loss(exc):
                raise
            logger.warning("could not list the tools of server %r again: %s", self.server, _describe(exc))

    def _lost(self, client: Client, exc: BaseException) -> None:
        if client is self._client:
            self._client = None
            self._error = _describe(exc)
            self._drop.set()

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        self._error = _describe(exc)
        self._retry_at = anyio.current_time() + min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** (self._failures - 1))
        self._end_attempt(self._error)

    def _end_attempt(self, error: str | None) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            attempt.error = error
            attempt.done.set()

    # What calls use ------------------------------------------------------------------------------

    async def client(self) -> Client:
        """The connected client, after connecting a fresh one if the last was lost.

        Raises:
            ToolUnavailableError: The server cannot be reached now.
        """
        while True:
            client = self._client
            if client is not None:
                return client
            if self._closed:
                raise ToolUnavailableError(f"the connection to server {self.server!r} is closed")
            attempt = self._attempt
            if attempt is None:
                wait = self._retry_at - anyio.current_time()
                if wait > 0:
                    raise ToolUnavailableError(
                        f"server {self.server!r} is unreachable ({self._error}); "
                        f"the next reconnect attempt is in {wait:.1f}s"
                    )
                attempt = self._attempt = _Attempt()
                self._demand.set()
            await attempt.done.wait()
            if attempt.error is not None:
                raise ToolUnavailableError(f"could not reconnect to server {self.server!r}: {attempt.error}")

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
        """Call a tool on the current client; a lost connection is noted and the error re-raised."""
        client = await self.client()
        # Checked again now: connecting lists the tools anew, which may have blocked or removed this one.
        reason = self._unavailable(name)
        if reason is not None:
            raise ToolUnavailableError(reason)
        try:
            return await client.call_tool(name, arguments)
        except anyio.get_cancelled_exc_class():
            # Given up on (a timeout, or its caller's cancellation): check that the connection still answers.
            if client is self._client:
                self._suspect.set()
            raise
        except Exception as exc:
            if is_connection_loss(exc):
                self._lost(client, exc)
            elif client is self._client:
                raise
            # Still -32000, so that retry rules treat it as what it is: an outcome nobody knows.
            raise MCPError(
                CONNECTION_CLOSED, f"{self._error} (server {self.server!r}; the next call reconnects)"
            ) from exc

    async def refresh(self) -> None:
        """List the tools again now (connecting first if needed)."""
        client = await self.client()
        try:
            changes = await self._sync(client)
        except Exception as exc:
            if is_connection_loss(exc):
                self._lost(client, exc)
            raise
        await self._ask(changes)


@dataclass(eq=False)
class _Server:
    """One registered MCP server, as the registry keeps it."""

    name: str
    trusted: bool
    overrides: Mapping[str, ToolAnnotations]
    on_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None
    caller: ToolCaller | None = None
    connection: Connection | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    # Blocked tools: what changed, and the new definition to pin if it is accepted.
    pending: dict[str, tuple[DefinitionChange, dict[str, Any]]] = field(default_factory=dict)
    # The definition hash the callback was last asked about, per tool: each change is asked once.
    asked: dict[str, str] = field(default_factory=dict)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    listed: bool = False
    # The user's conflict domain and key functions (see `_keys`); never taken from the server.
    domain: str | None = None
    keys: Mapping[str, KeyFunction] = field(default_factory=dict)


class ServerRegistry:
    """The MCP servers of one dispatcher, their pins, and how their listings reach the catalogue."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._servers: dict[str, _Server] = {}
        self.pins = Pins()
        # Told (server, its callable tools) whenever a listing, an accepted change or imported pins
        # reach the catalogue, so that queued calls follow definitions approved since they queued.
        self.on_update: Callable[[str, list[str]], None] | None = None

    def __contains__(self, name: object) -> bool:
        return name in self._servers

    async def aclose(self) -> None:
        """Close every connection the dispatcher owns, cleanly, within a grace period.

        Shielded: it runs while the dispatcher exits, perhaps because its task is being cancelled.
        Whatever is still open after the grace period is closed by the task group's cancellation.
        """
        connections = [server.connection for server in self._servers.values() if server.connection is not None]
        if not connections:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_GRACE):
            async with anyio.create_task_group() as tg:
                for connection in connections:
                    tg.start_soon(connection.aclose)

    def reserve(
        self,
        name: str,
        *,
        trusted: bool,
        overrides: Mapping[str, ToolAnnotations],
        on_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None,
        domain: str | None = None,
        keys: Mapping[str, KeyFunction] | None = None,
    ) -> _Server:
        """Claim a server name before its first listing, so that two registrations cannot race for it."""
        if name in self._servers or name in self._catalog.servers:
            raise ConfigurationError(f"a server named {name!r} is already registered")
        if on_change is not None and not callable(on_change):
            raise ConfigurationError(f"on_definition_change must be callable, got {type(on_change).__name__}")
        server = self._servers[name] = _Server(name, trusted, overrides, on_change, domain=domain, keys=keys or {})
        return server

    def release(self, server: _Server) -> None:
        """Forget a server whose registration failed."""
        if self._servers.get(server.name) is server:
            del self._servers[server.name]
        if server.listed:
            self._catalog.remove_server(server.name)

    async def add_client(self, server: _Server, client: Client) -> None:
        """Register a server reached through a client the user owns, and list its tools."""
        server.caller = client
        await self.ask(server, await self.sync(server, client))

    def connection(self, server: _Server, target: Any, *, mode: str, follow: bool, timeout: float | None) -> Connection:
        """The connection for a server the dispatcher will own; its `run` must be started."""
        connection = Connection(
            server.name,
            target,
            mode=mode,
            sync=functools.partial(self.sync, server),
            ask=functools.partial(self.ask, server),
            unavailable=functools.partial(self._catalog.unavailable, server.name),
            follow=follow,
            timeout=timeout,
        )
        server.caller = server.connection = connection
        return connection

    async def sync(self, server: _Server, client: Client) -> list[DefinitionChange]:
        """List a server's tools through `client` and bring the catalogue up to date.

        Returns:
            The changes that the server's callback has yet to be asked about (see `ask`).
        """
        async with server.lock:
            tools = await list_all_tools(client, refresh=server.listed)
            if not server.listed:
                for what, named in (("overrides", server.overrides), ("keys", server.keys)):
                    unknown = sorted(set(named) - {tool.name for tool in tools})
                    if unknown:
                        have = ", ".join(sorted(tool.name for tool in tools)) or "no tools"
                        raise ConfigurationError(
                            f"{what} name tools server {server.name!r} does not have: {unknown} (it has {have})"
                        )
            return self._apply(server, tools)

    async def ask(self, server: _Server, changes: list[DefinitionChange]) -> None:
        """Ask the server's callback about each change, accepting those it approves."""
        for change in changes:
            await self._ask(server, change)

    async def refresh(self, name: str) -> None:
        """List a server's tools again now."""
        server = self._get(name)
        if server.connection is not None:
            await server.connection.refresh()
        else:
            assert isinstance(server.caller, Client)
            await self.ask(server, await self.sync(server, server.caller))

    def _apply(self, server: _Server, tools: list[Tool]) -> list[DefinitionChange]:
        """Put a listing into the catalogue; return the changes the callback has not been asked about."""
        listing = {tool.name: tool for tool in tools}
        rows: list[tuple[ToolEntry, ToolImpl, str | None]] = []
        pending: dict[str, tuple[DefinitionChange, dict[str, Any]]] = {}
        fresh: list[DefinitionChange] = []
        for tool in listing.values():
            data, change = self.pins.check(server.name, tool)
            if change is not None:
                pending[tool.name] = (change, data)
                if server.asked.get(tool.name) != change.current:
                    fresh.append(change)
            rows.append((self._entry(server, tool), self._impl(server, tool), _blocked(change)))
        if not server.listed:
            self._catalog.add_server(server.name)
            server.listed = True
        self._catalog.set_server_tools(server.name, rows)
        server.tools = listing
        server.pending = pending
        if self.on_update is not None:
            self.on_update(server.name, [name for name in listing if name not in pending])
        return fresh

    def _entry(self, server: _Server, tool: Tool) -> ToolEntry:
        return ToolEntry(
            tool.name,
            server.name,
            tool.name,
            effective_annotations(tool.annotations, trusted=server.trusted, override=server.overrides.get(tool.name)),
            declared_annotations=tool.annotations,
            trusted=server.trusted,
            description=tool.description,
            input_schema=tool.input_schema,
            output_schema=tool.output_schema,
            title=tool.title or (tool.annotations.title if tool.annotations else None),
            domain=server.domain,
            key_function=server.keys.get(tool.name),
        )

    def _impl(self, server: _Server, tool: Tool) -> MCPTool:
        assert server.caller is not None
        guard = functools.partial(self._catalog.unavailable, server.name, tool.name)
        return MCPTool(server.caller, tool.name, tool.input_schema, guard=guard)

    async def _ask(self, server: _Server, change: DefinitionChange) -> None:
        """Ask the server's callback about a change, and accept it if the callback says so."""
        if server.on_change is None:
            return
        server.asked[change.tool] = change.current
        try:
            verdict = server.on_change(change)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception:
            logger.exception(
                "on_definition_change raised for tool %r of server %r; it stays blocked", change.tool, server.name
            )
            return
        pending = server.pending.get(change.tool)
        if verdict is True and pending is not None and pending[0].current == change.current:
            self.accept(server.name, change.tool)

    def accept(self, name: str, tool: str | None = None) -> list[DefinitionChange]:
        """Approve the pending changes of a server (or of one of its tools) and unblock those tools."""
        server = self._get(name)
        if tool is not None and tool not in server.pending:
            waiting = ", ".join(sorted(server.pending)) or "none"
            raise ConfigurationError(f"tool {tool!r} of server {name!r} has no pending change (pending: {waiting})")
        accepted: list[DefinitionChange] = []
        for tool_name, (change, data) in list(server.pending.items()):
            if tool is None or tool_name == tool:
                self.pins.approve(name, tool_name, data)
                del server.pending[tool_name]
                accepted.append(change)
        if accepted:
            self._apply(server, list(server.tools.values()))
        return accepted

    def pending(self, name: str | None = None) -> list[DefinitionChange]:
        """The changes awaiting approval, of one server or of all."""
        servers = [self._get(name)] if name is not None else list(self._servers.values())
        return [change for server in servers for change, _ in server.pending.values()]

    def load_pins(self, pins: Mapping[str, Mapping[str, str]]) -> None:
        """Load saved pins and check the tools already listed against them."""
        self.pins.load(pins)
        for name in pins:
            server = self._servers.get(name)
            if server is not None and server.listed:
                self._apply(server, list(server.tools.values()))

    def protocol_version(self, name: str) -> str | None:
        """The negotiated protocol version of a server's current connection, if known."""
        server = self._get(name)
        if server.connection is not None:
            return server.connection.protocol_version
        return server.caller.protocol_version if isinstance(server.caller, Client) else None

    def _get(self, name: str) -> _Server:
        server = self._servers.get(name)
        if server is None or not server.listed:
            known = ", ".join(sorted(s.name for s in self._servers.values() if s.listed)) or "none"
            raise ConfigurationError(f"no MCP server named {name!r} (servers: {known})")
        return server


def _blocked(change: DefinitionChange | None) -> str | None:
    if change is None:
        return None
    return (
        f"tool {change.tool!r} of server {change.server!r} is blocked: its definition changed since it was "
        f"approved ({change}); it stays unavailable until the change is accepted"
    )
