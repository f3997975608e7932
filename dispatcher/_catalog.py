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
    _: KW_ONLY
    # The error quotes text a server wrote (a changed definition, a tool's own name): untrusted content.
    untrusted: bool = False


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
    """Registered tools, indexed for resolution by catalogue name, server or bare tool name.

    Names are issued once and kept: a tool gets its catalogue name when it is first registered, keeps it
    while it is listed (blocked or not), and keeps it reserved while it is removed (its tombstone), so
    no later registration of any server can take it over. Only removing the server frees its names.
    """

    def __init__(self) -> None:
        # (server, tool) -> registration; insertion order is registration order.
        self._tools: dict[tuple[str | None, str], _Registered] = {}
        self._by_name: dict[str, _Registered] = {}
        self._by_tool: dict[str, list[_Registered]] = {}
        self._servers: set[str] = set()
        # (server, tool) -> why calls to it fail, for tools their server stopped offering.
        self._removed: dict[tuple[str, str], str] = {}
        # Every name issued and not freed: catalogue name -> (server, tool), listed or removed.
        self._issued: dict[str, tuple[str | None, str]] = {}
        self._names: dict[tuple[str | None, str], str] = {}
        # The next counter to try per prefixed base name, so that many clashing names cost linear time.
        self._counters: dict[str, int] = {}
        # (name, server) -> the resolution of a call that found its tool, until the tools change: a
        # model calls the same few tools over and over. Failures are not kept (a model can send any
        # number of names that resolve to nothing), so this holds at most a few entries per tool.
        self._resolved: dict[tuple[str, str | None], Resolution] = {}

    @property
    def servers(self) -> frozenset[str]:
        return frozenset(self._servers)

    def entries(self) -> list[ToolEntry]:
        """The callable tools: blocked ones are left out."""
        return [registered.entry for registered in self._by_name.values() if registered.blocked is None]

    def has(self, server: str | None, tool: str) -> bool:
        return (server, tool) in self._tools

    def known(self, server: str | None, tool: str) -> bool:
        """Whether a tool is registered: listed (blocked or not), or removed by its server (a tombstone)."""
        return (server, tool) in self._names

    def tool_names(self, server: str | None) -> list[str]:
        """The own names of a server's registered tools (listed, blocked or removed), in registration order."""
        return [tool for key_server, tool in self._names if key_server == server]

    def get(self, server: str | None, tool: str) -> ToolEntry | None:
        """The entry of a server's tool, by the server's own tool name."""
        registered = self._tools.get((server, tool))
        return registered.entry if registered is not None else None

    def add_server(self, server: str) -> None:
        self._servers.add(server)

    def remove_server(self, server: str) -> None:
        """Forget a server: its tools, its tombstones and the names they held."""
        self._servers.discard(server)
        for key in [key for key in self._tools if key[0] == server]:
            del self._tools[key]
        for key in [key for key in self._removed if key[0] == server]:
            del self._removed[key]
        for key in [key for key in self._names if key[0] == server]:
            del self._issued[self._names.pop(key)]
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
            del self._tools[(server, tool)]
            self._removed[(server, tool)] = f"tool {tool!r} was removed by server {server!r}"
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
        if server is not None:
            return self._removed.get((server, tool))
        return None

    def put(self, entries: Iterable[tuple[ToolEntry, ToolImpl]]) -> None:
        """Add or replace tools; a new one gets a name, one already known keeps its own."""
        for entry, impl in entries:
            self._tools[(entry.server, entry.tool)] = _Registered(entry, impl)
        self._rebuild()

    def _issue(self, server: str | None, tool: str) -> str:
        """The name for a tool registered for the first time: never a name issued before.

        A server's tool keeps its own name when that name is valid, free, and does not contain
        ``__``: that form is reserved for the ``server__tool`` names that disambiguate, so that no
        server can offer a tool whose name reads as another server's. (A local function's name is
        the user's own choice, so it may contain ``__``.)
        """
        if NAME_PATTERN.match(tool) and (server is None or "__" not in tool) and tool not in self._issued:
            return tool
        key = f"{server}/{tool}"
        base = _shorten(f"{_sanitize(server or 'local')}__{_sanitize(tool)}", key)
        name = base
        counter = self._counters.get(base, 2)
        while name in self._issued:
            name = _shorten(f"{base}_{counter}", f"{key}#{counter}")
            counter += 1
        self._counters[base] = counter
        return name

    def _rebuild(self) -> None:
        by_tool: dict[str, list[_Registered]] = {}
        by_name: dict[str, _Registered] = {}
        for key, registered in self._tools.items():
            name = self._names.get(key)
            if name is None:
                name = self._names[key] = self._issue(*key)
                self._issued[name] = key
            if registered.entry.name != name:
                registered.entry = dataclasses.replace(registered.entry, name=name)
            by_tool.setdefault(registered.entry.tool, []).append(registered)
            by_name[name] = registered
        self._by_name = by_name
        self._by_tool = by_tool
        self._resolved = {}

    def resolve(self, name: str, server: str | None = None) -> Resolution:
        """Find the one tool a call means, or explain why there is none.

        Without a server, a name is first a catalogue name; failing that, a tool's own name when exactly
        one listed tool has it and it has no ``__`` (a name of that form is only ever a catalogue name,
        so that ``bank__transfer`` never reaches a tool that another server named so).
        """
        # Only exact strings are looked up or kept: a str subclass may hash and compare as it likes.
        exact = type(name) is str and (server is None or type(server) is str)
        if exact:
            found = self._resolved.get((name, server))
            if found is not None:
                return found
        resolution = self._resolve(name, server)
        if exact and resolution.entry is not None:
            self._resolved[(name, server)] = resolution
        return resolution

    def _resolve(self, name: str, server: str | None) -> Resolution:
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
            key: tuple[str | None, str] = (server, name)
            if key not in self._names:
                issued = self._issued.get(name)
                if issued is not None and issued[0] == server:
                    key = issued
            return self._at(key) or Resolution(None, None, f"server {server!r} has no tool {_shown(name)}")
        issued = self._issued.get(name)
        if issued is not None:
            resolution = self._at(issued)
            assert resolution is not None
            return resolution
        group = self._by_tool.get(name)
        if group is not None and len(group) > 1:
            choices = ", ".join(repr(r.entry.name) for r in group)
            return Resolution(
                None,
                None,
                f"tool name {name!r} is ambiguous: it is offered by {len(group)} servers; "
                f"call one of {choices}, or set ToolCall.server",
            )
        if "__" not in name:
            if group is not None:
                return self._found(group[0])
            for key in self._removed:
                if key[1] == name:
                    resolution = self._at(key)
                    assert resolution is not None
                    return resolution
        message = f"unknown tool {_shown(name)}"
        # Only callable tools: a blocked one may be new, its name text that nobody has reviewed.
        close = difflib.get_close_matches(name, [n for n, r in self._by_name.items() if r.blocked is None], n=3)
        if close:
            message += f"; did you mean {', '.join(repr(c) for c in close)}?"
        return Resolution(None, None, message)

    def _at(self, key: tuple[str | None, str]) -> Resolution | None:
        """The resolution of a registered tool (listed, blocked or removed), or None if it is unknown."""
        registered = self._tools.get(key)
        if registered is not None:
            return self._found(registered)
        if key[0] is not None and key in self._removed:
            return Resolution(None, None, self._removed[(key[0], key[1])], untrusted=True)
        return None

    @staticmethod
    def _found(registered: _Registered) -> Resolution:
        if registered.blocked is not None:
            return Resolution(None, None, registered.blocked, untrusted=True)
        return Resolution(registered.entry, registered.impl, None)
