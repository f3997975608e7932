"""The catalogue: every tool the dispatcher can call, under a name a model can use.

Each registered tool gets a catalogue name that is unique in the dispatcher and matches
``^[A-Za-z0-9_-]{1,64}$`` (what LLM APIs accept). A tool keeps its own name when that name is valid and
no other server offers it; otherwise it is prefixed with its server's name (``server__tool``) and
shortened with a hash when it would be too long. A call resolves to exactly one tool or to a readable
error, never to a guess.

A tool whose definition changed and awaits approval stays in the catalogue, blocked: it keeps its name
(so no other server's tool can take that name meanwhile) but calls to it fail with the reason. A tool
its server stopped offering leaves a tombstone, so calls to it say it was removed.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from mcp.types import CallToolResult, ToolAnnotations

    from ._keys import KeyFunction

__all__ = ["Catalog", "Resolution", "ToolEntry", "ToolImpl"]

# \Z, not $: "$" also matches before a trailing newline, and "read\n" is no name a model API accepts.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
_INVALID = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64
# The most characters of a name from a call that an error message repeats.
_MAX_SHOWN = 100


class ToolImpl(Protocol):
    """How the executor runs one tool (a local function or a tool on an MCP server)."""

    def prepare(self, arguments: Mapping[str, Any]) -> Any:
        """Check arguments before the call is queued; raise `ArgumentError` to reject them."""
        ...

    async def invoke(self, prepared: Any) -> CallToolResult:
        """Run the tool once with prepared arguments."""
        ...


class ArgumentError(Exception):
    """Arguments that the tool would reject: the call is FAILED without running."""


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """One tool in the catalogue, as the scheduler sees it.

    Attributes:
        name: The name to show the model: unique in this dispatcher, ``^[A-Za-z0-9_-]{1,64}$``.
        server: The name the user registered the tool's server under; None for a local function.
        tool: The tool's own name on its server.
        annotations: The effective annotations: spec defaults applied, untrusted hints discarded,
            overrides applied. Every hint is a bool.
        declared_annotations: What the server declared, unfiltered (None when it declared nothing).
        trusted: Whether the tool's own hints are believed (a trusted server or a local function).
        description: The tool's description, for the model.
        input_schema: The JSON Schema of the arguments.
        output_schema: The JSON Schema of structured results, if the tool declares one.
        title: A display name, if any.
        domain: The conflict domain the user gave the tool's server (or local function): its calls
            are keyed under it. None: the root key, which conflicts with every call.
        key_function: The user's function from a call's arguments to its keys within the domain.
    """

    name: str
    server: str | None
    tool: str
    annotations: ToolAnnotations
    _: KW_ONLY
    declared_annotations: ToolAnnotations | None = None
    trusted: bool = False
    description: str | None = None
    input_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    output_schema: Mapping[str, Any] | None = None
    title: str | None = None
    domain: str | None = None
    key_function: KeyFunction | None = None

    @property
    def concurrent(self) -> bool:
        """Whether calls may overlap other concurrent calls (effective readOnlyHint)."""
        return bool(self.annotations.read_only_hint)

    @property
    def exclusive(self) -> bool:
        """Whether each call must run alone, in request order."""
        return not self.annotations.read_only_hint

    @property
    def idempotent(self) -> bool:
        """Whether repeating a call is declared harmless by a trusted source (effective idempotentHint)."""
        return bool(self.annotations.idempotent_hint)


@dataclass(slots=True)
class _Registered:
    entry: ToolEntry
    impl: ToolImpl
    blocked: str | None = None


@dataclass(frozen=True, slots=True)
class Resolution:
    """A call's tool, or why it has none."""

    entry: ToolEntry | None
    impl: ToolImpl | None
    error: str | None


def _shown(name: object) -> str:
    """A name from a call, quoted for an error message: a huge one is cut, so the error stays readable."""
    if isinstance(name, str) and len(name) > _MAX_SHOWN:
        return f"{name[:_MAX_SHOWN]!r}... ({len(name)} characters)"
    return repr(name)


def _sanitize(text: str) -> str:
    return _INVALID.sub("_", text) or "_"


def _shorten(name: str, key: str) -> str:
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9]}_{digest}"


class Catalog:
    """Registered tools, indexed for resolution by catalogue name, server or bare tool name."""

    def __init__(self) -> None:
        # (server, tool) -> registration; insertion order is registration order.
        self._tools: dict[tuple[str | None, str], _Registered] = {}
        self._by_name: dict[str, _Registered] = {}
        self._by_tool: dict[str, list[_Registered]] = {}
        self._servers: set[str] = set()
        # (server, tool) -> (its catalogue name when it was removed, why calls to it fail)
        self._removed: dict[tuple[str, str], tuple[str, str]] = {}

    @property
    def servers(self) -> frozenset[str]:
        return frozenset(self._servers)

    def entries(self) -> list[ToolEntry]:
        """The callable tools: blocked ones are left out."""
        return [registered.entry for registered in self._by_name.values() if registered.blocked is None]

    def has(self, server: str | None, tool: str) -> bool:
        return (server, tool) in self._tools

    def get(self, server: str | None, tool: str) -> ToolEntry | None:
        """The entry of a server's tool, by the server's own tool name."""
        registered = self._tools.get((server, tool))
        return registered.entry if registered is not None else None

    def add_server(self, server: str) -> None:
        self._servers.add(server)

    def remove_server(self, server: str) -> None:
        self._servers.discard(server)
        for key in [key for key in self._tools if key[0] == server]:
            del self._tools[key]
        for key in [key for key in self._removed if key[0] == server]:
            del self._removed[key]
        self._rebuild()

    def set_server_tools(self, server: str, tools: Sequence[tuple[ToolEntry, ToolImpl, str | None]]) -> list[str]:
        """Make a server's tools exactly these ``(entry, impl, blocked reason or None)``.

        Tools of the server that are not among them are removed and leave a tombstone.

        Returns:
            The names of the removed tools.
        """
        listed = {entry.tool for entry, _, _ in tools}
        removed = [key[1] for key in self._tools if key[0] == server and key[1] not in listed]
        for tool in removed:
            registered = self._tools.pop((server, tool))
            self._removed[(server, tool)] = (
                registered.entry.name,
                f"tool {tool!r} was removed by server {server!r}",
            )
        for entry, impl, blocked in tools:
            self._removed.pop((server, entry.tool), None)
            self._tools[(server, entry.tool)] = _Registered(entry, impl, blocked)
        self._rebuild()
        return removed

    def unavailable(self, server: str | None, tool: str) -> str | None:
        """Why a registered tool cannot be called now (blocked or removed), or None if it can."""
        registered = self._tools.get((server, tool))
        if registered is not None:
            return registered.blocked
        if server is not None and (server, tool) in self._removed:
            return self._removed[(server, tool)][1]
        return None

    def put(self, entries: Iterable[tuple[ToolEntry, ToolImpl]]) -> None:
        """Add or replace tools, then recompute every catalogue name."""
        for entry, impl in entries:
            self._tools[(entry.server, entry.tool)] = _Registered(entry, impl)
        self._rebuild()

    def remove(self, server: str | None, tool: str) -> None:
        self._tools.pop((server, tool), None)
        self._rebuild()

    def _rebuild(self) -> None:
        by_tool: dict[str, list[_Registered]] = {}
        for registered in self._tools.values():
            by_tool.setdefault(registered.entry.tool, []).append(registered)
        by_name: dict[str, _Registered] = {}
        # Unprefixed names first, so a prefixed name can never take a tool's own name.
        for tool, group in by_tool.items():
            if len(group) == 1 and NAME_PATTERN.match(tool):
                by_name[tool] = group[0]
        for (server, tool), registered in self._tools.items():
            if len(by_tool[tool]) == 1 and NAME_PATTERN.match(tool):
                continue
            key = f"{server}/{tool}"
            base = _shorten(f"{_sanitize(server or 'local')}__{_sanitize(tool)}", key)
            name = base
            counter = 2
            while name in by_name:
                name = _shorten(f"{base}_{counter}", f"{key}#{counter}")
                counter += 1
            by_name[name] = registered
        for name, registered in by_name.items():
            if registered.entry.name != name:
                registered.entry = dataclasses.replace(registered.entry, name=name)
        # Keep registration order, so the catalogue reads the way the user built it.
        position = {id(registered): i for i, registered in enumerate(self._tools.values())}
        self._by_name = dict(sorted(by_name.items(), key=lambda item: position[id(item[1])]))
        self._by_tool = by_tool

    def resolve(self, name: str, server: str | None = None) -> Resolution:
        """Find the one tool a call means, or explain why there is none."""
        # Calls come from a model: a name that is not a string is that call's error, not the batch's.
        if not isinstance(name, str):
            return Resolution(None, None, f"invalid tool name: expected a string, got {type(name).__name__}")
        if server is not None and not isinstance(server, str):
            return Resolution(
                None, None, f"invalid server name: expected a string or None, got {type(server).__name__}"
            )
        if server is not None:
            if server not in self._servers:
                known = ", ".join(sorted(self._servers)) or "none"
                return Resolution(None, None, f"unknown server {_shown(server)} (servers: {known})")
            registered = self._tools.get((server, name))
            if registered is None:
                by_name = self._by_name.get(name)
                if by_name is not None and by_name.entry.server == server:
                    registered = by_name
            if registered is None:
                return Resolution(
                    None, None, self._gone(name, server) or f"server {server!r} has no tool {_shown(name)}"
                )
            return self._found(registered)
        registered = self._by_name.get(name)
        if registered is not None:
            return self._found(registered)
        group = self._by_tool.get(name)
        if group is not None:
            if len(group) == 1:
                return self._found(group[0])
            choices = ", ".join(repr(r.entry.name) for r in group)
            return Resolution(
                None,
                None,
                f"tool name {name!r} is ambiguous: it is offered by {len(group)} servers; "
                f"call one of {choices}, or set ToolCall.server",
            )
        gone = self._gone(name, None)
        if gone is not None:
            return Resolution(None, None, gone)
        message = f"unknown tool {_shown(name)}"
        close = difflib.get_close_matches(name, list(self._by_name), n=3)
        if close:
            message += f"; did you mean {', '.join(repr(c) for c in close)}?"
        return Resolution(None, None, message)

    @staticmethod
    def _found(registered: _Registered) -> Resolution:
        if registered.blocked is not None:
            return Resolution(None, None, registered.blocked)
        return Resolution(registered.entry, registered.impl, None)

    def _gone(self, name: str, server: str | None) -> str | None:
        """The tombstone message for a removed tool called by its own or its catalogue name."""
        for (removed_server, tool), (catalogue_name, message) in self._removed.items():
            if (server is None or server == removed_server) and name in (tool, catalogue_name):
                return message
        return None
