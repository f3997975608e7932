"""A dispatcher's MCP servers: what `Dispatcher.add_mcp_server`, `connect`, `refresh` and `server_limit` do.

Each server's name, limit, idempotency keys and connection options are checked here before it is
reserved in the registry (`_registry`); its limit goes to the gate, an adaptive one through its
`OnlineLimit`; a server that fails to register leaves nothing behind. The registry keeps the servers,
their listings, pins and pending changes.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Literal

from ._core import _checks as checks
from ._core._errors import ConfigurationError, ServerConnectionError
from ._core._idempotency import IdempotencyKeys
from ._core._limit_setting import AdaptiveLimit, check_limit
from ._mcp._connections import check_target
from ._mcp._failures import explain as _describe
from ._mcp._failures import innermost as _innermost
from ._mcp._online import OnlineLimit
from ._mcp._registry import ServerRegistry, check_reconnect

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from anyio.abc import TaskGroup
    from mcp import Client, StdioServerParameters
    from mcp.server import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    from ._core._catalog import Catalog, ToolEntry
    from ._core._keys import KeyFunction
    from ._driver._coordination import Coordinator
    from ._driver._execution import Executor
    from ._mcp._pins import DefinitionChange
    from ._mcp._questions import Asker
    from ._mcp._reconnect import ReconnectPolicy

__all__ = ["Servers"]


class Servers:
    """Registers a dispatcher's MCP servers in its registry, gate and executor, and answers about them."""

    __slots__ = ("_call_timeout", "_catalog", "_coordinator", "_executor", "online", "registry")

    def __init__(
        self,
        catalog: Catalog,
        executor: Executor,
        *,
        call_timeout: float | None,
        coordinator: Coordinator | None,
        asker: Asker | None,
    ) -> None:
        self._catalog = catalog
        self._executor = executor
        self._call_timeout = call_timeout
        self._coordinator = coordinator
        self.registry = ServerRegistry(catalog)
        self.registry.on_update = executor.accepted
        self.registry.asker = asker
        # The servers whose limit is adaptive (`AdaptiveLimit`), by name.
        self.online: dict[str, OnlineLimit] = {}

    async def add_mcp_server(
        self,
        name: str,
        client: Client,
        *,
        trusted: bool,
        max_concurrency: int | AdaptiveLimit | Literal["auto"] | None,
        overrides: Mapping[str, ToolAnnotations] | None,
        on_definition_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None,
        domain: str | None,
        keys: Mapping[str, KeyFunction] | None,
        review_new_tools: bool,
        idempotency: IdempotencyKeys | None,
    ) -> list[ToolEntry]:
        """What `Dispatcher.add_mcp_server` does."""
        idempotency = self._check_idempotency(name, idempotency)
        overrides = self._check_server(name, max_concurrency, overrides)
        limit, online = self._limit_setting(name, max_concurrency, trusted)
        server = self._reserve(
            name, trusted, overrides, on_definition_change, domain, keys, review_new_tools, online, idempotency
        )
        self._apply(name, limit, idempotency)
        try:
            await self.registry.add_client(server, client)
        except BaseException:
            self._release(server, name)
            raise
        return self.entries(name)

    async def connect(
        self,
        tg: TaskGroup,
        name: str,
        target: MCPServer[Any] | Server[Any] | StdioServerParameters | str | Callable[[], Client],
        *,
        trusted: bool,
        max_concurrency: int | AdaptiveLimit | Literal["auto"] | None,
        overrides: Mapping[str, ToolAnnotations] | None,
        mode: Literal["auto", "legacy"],
        follow_changes: bool,
        on_definition_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None,
        connect_timeout: float | None,
        reconnect: ReconnectPolicy | None,
        domain: str | None,
        keys: Mapping[str, KeyFunction] | None,
        max_answer_bytes: int | None,
        review_new_tools: bool,
        task_timeout: float | None,
        idle_timeout: float | None,
        idempotency: IdempotencyKeys | None,
    ) -> list[ToolEntry]:
        """What `Dispatcher.connect` does, its connection run in `tg`."""
        overrides = self._check_server(name, max_concurrency, overrides)
        limit, online = self._limit_setting(name, max_concurrency, trusted)
        check_target(target)
        if mode not in ("auto", "legacy"):
            raise ConfigurationError(f"mode must be 'auto' or 'legacy', got {mode!r}")
        if mode != "auto" and callable(target) and not isinstance(target, str):
            raise ConfigurationError("mode cannot be set for a client factory: pass mode=... to the Client it builds")
        connect_timeout = checks.seconds("connect_timeout", connect_timeout, none="no bound")
        policy = check_reconnect(reconnect)
        self._check_task_timeout(task_timeout)
        idempotency = self._check_idempotency(name, idempotency)
        idle_timeout = checks.seconds("idle_timeout", idle_timeout, none="no idle bound")
        max_answer_bytes = checks.whole("max_answer_bytes", max_answer_bytes, minimum=1024, none="no limit")
        server = self._reserve(
            name, trusted, overrides, on_definition_change, domain, keys, review_new_tools, online, idempotency
        )
        connection = self.registry.connection(
            server,
            target,
            mode=mode,
            follow=follow_changes,
            timeout=connect_timeout,
            policy=policy,
            max_answer_bytes=max_answer_bytes,
            task_timeout=task_timeout,
            idle_timeout=idle_timeout,
        )
        self._apply(name, limit, idempotency)
        try:
            await tg.start(connection.run)
        except BaseException as exc:
            self._release(server, name)
            cause = _innermost(exc)
            if isinstance(cause, ConfigurationError):
                raise cause from None  # the caller's mistake, found in the listing
            if isinstance(exc, Exception):
                raise ServerConnectionError(f"could not connect to server {name!r}: {_describe(exc)}") from exc
            raise
        return self.entries(name)

    async def refresh(self, name: str) -> list[ToolEntry]:
        """What `Dispatcher.refresh` does."""
        try:
            await self.registry.refresh(name)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise ServerConnectionError(f"could not list the tools of server {name!r}: {_describe(exc)}") from exc
        return self.entries(name)

    def limit(self, name: str) -> int | None:
        """What `Dispatcher.server_limit` answers."""
        if name not in self._catalog.servers:
            known = ", ".join(sorted(self._catalog.servers)) or "none"
            raise ConfigurationError(f"no MCP server named {name!r} (servers: {known})")
        online = self.online.get(name)
        return online.limit if online is not None else self._executor.gate.server_limit(name)

    def entries(self, name: str) -> list[ToolEntry]:
        """The server's callable catalogue entries."""
        return [entry for entry in self._catalog.entries() if entry.server == name]

    def _release(self, server: Any, name: str) -> None:
        """Undo a registration that failed: the server leaves no trace in the registry, gate or executor."""
        self.registry.release(server)
        self._executor.gate.set_server_limit(name, None)
        self.online.pop(name, None)
        self._executor.set_idempotency(name, None)

    def _check_idempotency(self, name: str, idempotency: object) -> IdempotencyKeys | None:
        keys = _check_idempotency(idempotency)
        # A fleet coordinator that fences the server says where its token goes: a key sent in the same
        # place would be overwritten by the token, and the server could not deduplicate the retries.
        fencing = getattr(self._coordinator, "fencing", None)
        if keys is None or fencing is None:
            return keys
        argument, meta = fencing(name)
        if (keys.argument is not None and keys.argument == argument) or (keys.meta is not None and keys.meta == meta):
            where = f"argument {argument!r}" if keys.argument is not None else f"_meta entry {meta!r}"
            raise ConfigurationError(
                f"server {name!r} takes its idempotency key and its fleet fencing token in the same {where}: "
                "the token would overwrite the key; give IdempotencyKeys and FleetServer different names"
            )
        return keys

    def _check_task_timeout(self, task_timeout: object) -> None:
        task_timeout = checks.seconds("task_timeout", task_timeout, none="the call timeout alone")
        if task_timeout is None:
            return
        if self._call_timeout is not None and task_timeout > self._call_timeout:
            raise ConfigurationError(
                f"task_timeout={task_timeout}s exceeds the dispatcher's call_timeout={self._call_timeout}s, "
                "which caps every call, tasks included: raise Dispatcher(call_timeout=...) or set it to None"
            )

    def _check_server(
        self, name: str, max_concurrency: object, overrides: Mapping[str, ToolAnnotations] | None
    ) -> dict[str, ToolAnnotations]:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a server needs a non-empty name, got {name!r}")
        if name in self._catalog.servers or name in self.registry:
            raise ConfigurationError(f"a server named {name!r} is already registered")
        check_limit(max_concurrency, name)
        return dict(overrides or {})

    def _reserve(
        self,
        name: str,
        trusted: bool,
        overrides: Mapping[str, ToolAnnotations],
        on_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None,
        domain: str | None,
        keys: Mapping[str, KeyFunction] | None,
        review_new_tools: bool,
        online: OnlineLimit | None,
        idempotency: IdempotencyKeys | None,
    ) -> Any:
        """Claim the server's name in the registry, with what both ways of adding a server set."""
        return self.registry.reserve(
            name,
            trusted=trusted,
            overrides=overrides,
            on_change=on_change,
            domain=domain,
            keys=keys,
            review_new_tools=review_new_tools,
            online=online,
            filled=_filled(idempotency),
        )

    def _apply(self, name: str, limit: int | None, idempotency: IdempotencyKeys | None) -> None:
        """Give the executor the server's limit and idempotency keys, once its name is reserved."""
        self._executor.gate.set_server_limit(name, limit)
        self._executor.set_idempotency(name, idempotency)

    def _limit_setting(
        self, name: str, max_concurrency: object, trusted: bool
    ) -> tuple[int | None, OnlineLimit | None]:
        """The gate's limit for a server and, for an adaptive one, its `OnlineLimit` (registered here)."""
        setting = check_limit(max_concurrency, name)
        if not isinstance(setting, AdaptiveLimit):
            return setting, None
        online = self.online[name] = OnlineLimit(
            name,
            setting,
            trusted=trusted,
            apply=functools.partial(self._executor.gate.set_server_limit, name),
            waiting=functools.partial(self._executor.gate.server_waiting, name),
            call_timeout=self._call_timeout,
            coordinator=self._coordinator,
        )
        return online.limit, online


def _filled(keys: IdempotencyKeys | None) -> frozenset[str]:
    """The arguments of a server's calls that the dispatcher fills in: its idempotency key's, if any."""
    return frozenset() if keys is None or keys.argument is None else frozenset({keys.argument})


def _check_idempotency(value: object) -> IdempotencyKeys | None:
    if value is not None and not isinstance(value, IdempotencyKeys):
        raise ConfigurationError(
            f"idempotency must be an IdempotencyKeys (how the server takes a key) or None, got {type(value).__name__}"
        )
    return value
