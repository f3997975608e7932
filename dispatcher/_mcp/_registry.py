"""MCP servers in the catalogue: their listings checked against pins, their changes reviewed, kept current.

A server is registered in one of two ways:

- `Dispatcher.add_mcp_server` with an entered `mcp.Client` that the user owns. Its tools are listed on
  registration and again on `Dispatcher.refresh`.
- `Dispatcher.connect` with a target: the dispatcher owns the client, a `Connection` (`_connections`)
  that lists the tools on each connection and whenever the server says they changed.

Every listing goes through `ServerRegistry`: each tool is checked against its pin (`_pins`), changed
tools are blocked, tools that disappeared leave a tombstone, and the catalogue is updated in one step.
A tool that appears once the server's tools were seen (after its first listing, or with pins imported
for it) is new: for an untrusted server, or a trusted one registered with ``review_new_tools``, it is a
change like any other, blocked (hidden from the catalogue's entries, its calls failing) until accepted.

The server's `on_definition_change` callback is asked about pending changes by one asker per server,
one change at a time, always about the tool's newest pending definition; an answer applies only to the
definition it was asked about (its hash), so a change made while the callback decides leaves the tool
blocked and is asked about next. A connection's follower does not wait for the asker: listings go on
while a person decides, so a newer definition replaces the pending one at once.
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from mcp import Client, StdioServerParameters
from mcp.server import Server
from mcp.server.mcpserver import MCPServer

from .._core import _checks as checks
from .._core._annotations import check_annotations, effective_annotations
from .._core._catalog import ToolEntry, sanitize
from .._core._errors import ConfigurationError
from .._core._keys import check_domain, check_key_functions
from ._connections import Connection
from ._online import LimitedTool
from ._pins import DefinitionChange, Pins
from ._questions import Flights
from ._reconnect import ReconnectPolicy
from ._session import MCPTool, list_all_tools
from ._tasks import TaskBound, serves_tasks, wants_task
from ._transport import DEFAULT_MAX_ANSWER_BYTES

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping

    from mcp.types import Tool, ToolAnnotations

    from .._core._catalog import Catalog, ToolImpl
    from .._core._keys import KeyFunction
    from ._online import OnlineLimit
    from ._questions import Asker
    from ._session import ToolCaller

__all__ = ["ServerRegistry", "check_entered", "check_reconnect"]

logger = logging.getLogger("dispatcher")


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
    # Whether a tool that appears after the first sight of the server's tools is a change to review.
    review_new: bool = True
    # Set when the running asker (one per server at a time) has no change left to ask about.
    asker: anyio.Event | None = None
    # The task the asker runs in: a callback that refreshes the server must not wait for itself.
    asker_task: int | None = None
    # The user's conflict domain and key functions (see `_keys`); never taken from the server.
    domain: str | None = None
    keys: Mapping[str, KeyFunction] = field(default_factory=dict)
    # Whether the server advertises task-augmented tool calls (read at each listing), and the bound of
    # each task (`Dispatcher.connect(task_timeout=...)`).
    serves_tasks: bool = False
    task_timeout: float | None = None
    # Seconds a call may go without progress from the server (`Dispatcher.connect(idle_timeout=...)`).
    idle_timeout: float | None = None
    # The server's adaptive limit (`max_concurrency=AdaptiveLimit(...)`), if it has one.
    online: OnlineLimit | None = None
    # The arguments the dispatcher fills in (an idempotency key's), hidden from the model's schemas.
    filled: frozenset[str] = frozenset()
    # Its calls in flight, to which its questions to the person are attributed (`_questions`).
    flights: Flights = field(default_factory=Flights)


class ServerRegistry:
    """The MCP servers of one dispatcher, their pins, and how their listings reach the catalogue."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._servers: dict[str, _Server] = {}
        # The channel for servers' questions to the person (`Dispatcher(ask_user=...)`), or None.
        self.asker: Asker | None = None
        self.pins = Pins()
        # Told (server, its callable tools) whenever a listing, an accepted change or imported pins
        # reach the catalogue, so that queued calls follow definitions approved since they queued.
        self.on_update: Callable[[str, list[str]], None] | None = None

    def __contains__(self, name: object) -> bool:
        return name in self._servers

    async def aclose(self) -> None:
        """Close every connection the dispatcher owns, cleanly, each within its grace period.

        Shielded: it runs while the dispatcher exits, perhaps because its task is being cancelled.
        Whatever is still open after the grace period is closed by the task group's cancellation.
        """
        connections = [server.connection for server in self._servers.values() if server.connection is not None]
        if not connections:
            return
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for connection in connections:
                    tg.start_soon(_close_within_grace, connection)

    def reserve(
        self,
        name: str,
        *,
        trusted: bool,
        overrides: Mapping[str, ToolAnnotations],
        on_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None,
        domain: str | None = None,
        keys: Mapping[str, KeyFunction] | None = None,
        review_new_tools: bool = False,
        online: OnlineLimit | None = None,
        filled: frozenset[str] = frozenset(),
    ) -> _Server:
        """Claim a server name before its first listing, so that two registrations cannot race for it.

        New tools are reviewed for an untrusted server whatever `review_new_tools` says; for a trusted
        one, only with it. `online`: the server's adaptive limit, which every call of its tools reports to.
        """
        if name in self._servers or name in self._catalog.servers:
            raise ConfigurationError(f"a server named {name!r} is already registered")
        # Names that read alike in server__tool names ("my.bank", "my_bank") would let an untrusted
        # server's tools pass for a trusted one's, whichever is numbered.
        spelled = sanitize(name)
        alike = next((other for other in self._servers if sanitize(other) == spelled), None)
        if alike is not None:
            raise ConfigurationError(
                f"server names {alike!r} and {name!r} both read {spelled!r} in tool names ({spelled}__tool): "
                "rename one, so that the model can tell their tools apart"
            )
        checks.flag("review_new_tools", review_new_tools)
        domain = check_domain(domain, f"server {name!r}")
        key_functions = check_key_functions(keys, domain, f"server {name!r}")
        if on_change is not None and not callable(on_change):
            raise ConfigurationError(f"on_definition_change must be callable, got {type(on_change).__name__}")
        for tool, override in overrides.items():
            check_annotations(override, tool)
        server = self._servers[name] = _Server(
            name,
            trusted,
            overrides,
            on_change,
            domain=domain,
            keys=key_functions,
            review_new=review_new_tools or not trusted,
            online=online,
            filled=filled,
        )
        return server

    def release(self, server: _Server) -> None:
        """Forget a server whose registration failed."""
        if self._servers.get(server.name) is server:
            del self._servers[server.name]
        if server.listed:
            self._catalog.remove_server(server.name)

    async def add_client(self, server: _Server, client: Client) -> None:
        """Register a server reached through a client the user owns, and list its tools."""
        check_entered(client, server.name)
        server.caller = client
        if await self.sync(server, client):
            await self.ask(server)

    def connection(
        self,
        server: _Server,
        target: Any,
        *,
        mode: str,
        follow: bool,
        timeout: float | None,
        policy: ReconnectPolicy | None = None,
        max_answer_bytes: int | None = DEFAULT_MAX_ANSWER_BYTES,
        task_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> Connection:
        """The connection for a server the dispatcher will own; its `run` must be started."""
        server.task_timeout = task_timeout
        server.idle_timeout = idle_timeout
        connection = Connection(
            server.name,
            target,
            mode=mode,
            sync=functools.partial(self.sync, server),
            ask=functools.partial(self.ask, server),
            unavailable=functools.partial(self._catalog.unavailable, server.name),
            follow=follow,
            timeout=timeout,
            policy=check_reconnect(policy),
            max_answer_bytes=max_answer_bytes,
            elicit=None if self.asker is None else self.asker.callback(server.name, server.trusted, server.flights),
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
            server.serves_tasks = serves_tasks(client)
            if not server.listed:
                for what, named in (("overrides", server.overrides), ("keys", server.keys)):
                    unknown = sorted(set(named) - {tool.name for tool in tools})
                    if unknown:
                        have = ", ".join(sorted(tool.name for tool in tools)) or "no tools"
                        raise ConfigurationError(
                            f"{what} name tools server {server.name!r} does not have: {unknown} (it has {have})"
                        )
            return self._apply(server, tools)

    async def ask(self, server: _Server, *, wait: bool = True) -> None:
        """Ask the server's callback about each pending change not asked about yet, accepting those it approves.

        One change at a time per server, the newest pending definition of each tool: a change that was
        replaced while the callback decided is never asked about. If an asker is running already, it
        takes the changes pending now too; with `wait`, this returns once it has none left.
        """
        if server.on_change is None:
            return
        task = anyio.get_current_task().id
        if server.asker is not None:
            if wait and server.asker_task != task:
                await server.asker.wait()
            return
        server.asker = done = anyio.Event()
        server.asker_task = task
        try:
            # Pass after pass over the pending tools, each asked about its newest definition when its
            # turn comes: a scan from the start for each change would cost a listing of n new tools
            # n * n / 2 steps, and a callback that answers at once (`lambda change: False`) never
            # yields, so each change is followed by a checkpoint, letting other servers' calls run.
            asking = True
            while asking:
                asking = False
                for tool in list(server.pending):
                    found = server.pending.get(tool)
                    if found is None or server.asked.get(tool) == found[0].current:
                        continue
                    asking = True
                    await self._ask(server, found[0])
                    await anyio.lowlevel.checkpoint()
        finally:
            server.asker = server.asker_task = None
            done.set()

    async def refresh(self, name: str) -> None:
        """List a server's tools again now."""
        server = self._get(name)
        if server.connection is not None:
            await server.connection.refresh()
        else:
            assert isinstance(server.caller, Client)
            if await self.sync(server, server.caller):
                await self.ask(server)

    def _apply(self, server: _Server, tools: list[Tool]) -> list[DefinitionChange]:
        """Put a listing into the catalogue; return the changes the callback has not been asked about."""
        listing = {tool.name: tool for tool in tools}
        rows: list[tuple[ToolEntry, ToolImpl, str | None]] = []
        pending: dict[str, tuple[DefinitionChange, dict[str, Any]]] = {}
        fresh: list[DefinitionChange] = []
        # The first listing of a server with no imported pins is the user's first sight of its tools.
        review_new = server.review_new and (server.listed or self.pins.loaded(server.name))
        self.pins.seen(server.name)
        for tool in listing.values():
            data, change = self.pins.check(server.name, tool, review_new=review_new)
            if change is not None:
                pending[tool.name] = (change, data)
                if server.asked.get(tool.name) != change.current:
                    fresh.append(change)
            entry = self._entry(server, tool)
            rows.append((entry, self._impl(server, tool, read=entry.concurrent), _blocked(change)))
        if not server.listed:
            self._catalog.add_server(server.name)
            server.listed = True
        self._catalog.set_server_tools(server.name, rows)
        server.tools = listing
        server.pending = pending
        # What the callback was asked about, only for tools still listed: a server that renames its
        # tools at every listing must not grow it without end (a tool that comes back is asked again).
        for gone in [name for name in server.asked if name not in listing]:
            del server.asked[gone]
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
            filled_arguments=server.filled,
        )

    def _impl(self, server: _Server, tool: Tool, *, read: bool) -> ToolImpl:
        assert server.caller is not None
        guard = functools.partial(self._catalog.unavailable, server.name, tool.name)
        task = TaskBound(server.task_timeout, server.idle_timeout) if server.serves_tasks and wants_task(tool) else None
        impl = MCPTool(
            server.caller,
            tool.name,
            tool.input_schema,
            guard=guard,
            task=task,
            idle_timeout=server.idle_timeout,
            flights=server.flights,
        )
        if server.online is None:
            return impl
        return LimitedTool(impl, server.online, tool.name, read=read)

    async def _ask(self, server: _Server, change: DefinitionChange) -> None:
        """Ask the server's callback about a change, and accept it if the callback says so."""
        assert server.on_change is not None
        previous = server.asked.get(change.tool)
        server.asked[change.tool] = change.current
        answered = False
        try:
            verdict = server.on_change(change)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            answered = True
        except Exception:
            answered = True
            logger.exception(
                "on_definition_change raised for tool %r of server %r; it stays blocked", change.tool, server.name
            )
            return
        finally:
            if not answered and server.asked.get(change.tool) == change.current:
                # Cancelled before it answered (the connection was lost, the dispatcher closes): the
                # next listing asks again.
                if previous is None:
                    del server.asked[change.tool]
                else:
                    server.asked[change.tool] = previous
        if verdict is True:
            self._accept(server, [change])

    def accept(
        self, name: str | DefinitionChange | Iterable[DefinitionChange], tool: str | None = None
    ) -> list[DefinitionChange]:
        """Approve pending changes and unblock their tools.

        `name` is a server (all its pending changes, or `tool`'s), or the reviewed changes themselves:
        each is accepted only while it is still its tool's pending change (the same definition hash).
        """
        if isinstance(name, str):
            server = self._get(name)
            if tool is not None and tool not in server.pending:
                waiting = ", ".join(sorted(server.pending)) or "none"
                raise ConfigurationError(f"tool {tool!r} of server {name!r} has no pending change (pending: {waiting})")
            return self._accept(
                server, [change for tool_name, (change, _) in server.pending.items() if tool in (None, tool_name)]
            )
        if tool is not None:
            raise ConfigurationError("pass tool= only with a server's name, not with DefinitionChange objects")
        reviewed = [name] if isinstance(name, DefinitionChange) else list(name)
        for change in reviewed:
            if not isinstance(change, DefinitionChange):
                raise ConfigurationError(
                    f"accept_changes takes a server's name or DefinitionChange objects, got {type(change).__name__}"
                )
        by_server: dict[str, list[DefinitionChange]] = {}
        for change in reviewed:
            by_server.setdefault(change.server, []).append(change)
        servers = [(self._get(server), changes) for server, changes in by_server.items()]
        return [accepted for server, changes in servers for accepted in self._accept(server, changes)]

    def _accept(self, server: _Server, changes: list[DefinitionChange]) -> list[DefinitionChange]:
        """Pin exactly the reviewed definitions of those changes that are still pending; return them."""
        accepted: list[DefinitionChange] = []
        for change in changes:
            pending = server.pending.get(change.tool)
            if pending is None or pending[0].current != change.current:
                continue  # accepted already, or replaced by a newer definition that nobody has reviewed
            self.pins.approve(server.name, change.tool, pending[1])
            del server.pending[change.tool]
            accepted.append(pending[0])
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
    if change.added:
        tool = change.tool if len(change.tool) <= 100 else f"{change.tool[:100]}... ({len(change.tool)} characters)"
        return (
            f"tool {tool!r} of server {change.server!r} is blocked: it is new since the server's tools were "
            "reviewed, and stays unavailable until it is reviewed and accepted"
        )
    return (
        f"tool {change.tool!r} of server {change.server!r} is blocked: its definition changed since it was "
        f"approved ({change}); it stays unavailable until the change is accepted"
    )


async def _close_within_grace(connection: Connection) -> None:
    with anyio.move_on_after(connection.policy.close_grace):
        await connection.aclose()


_DEFAULT_RECONNECT = ReconnectPolicy()


def check_reconnect(policy: object) -> ReconnectPolicy:
    """The policy to use: `policy`, or the default for None; raise `ConfigurationError` for anything else."""
    if policy is None:
        return _DEFAULT_RECONNECT
    if not isinstance(policy, ReconnectPolicy):
        raise ConfigurationError(f"reconnect must be a ReconnectPolicy or None, got {type(policy).__name__}")
    return policy


def check_entered(client: object, server: str) -> None:
    """Raise `ConfigurationError` if `client` is an `mcp.Client` outside its ``async with`` block."""
    if isinstance(client, MCPServer | Server | StdioServerParameters | str):
        raise ConfigurationError(
            f"the client of server {server!r} must be an entered mcp.Client, got {type(client).__name__}: "
            "wrap it in `async with Client(...) as client:`, or pass it to Dispatcher.connect, which connects it"
        )
    if not isinstance(client, Client):
        return  # another object with the client's methods (a test double): it knows its own state
    try:
        client.session  # noqa: B018 - the SDK's way to tell an entered client from one that is not
    except RuntimeError:
        raise ConfigurationError(
            f"the client of server {server!r} is not entered (or already closed): register it inside "
            "`async with Client(...) as client:`, or let the dispatcher own it with Dispatcher.connect"
        ) from None
