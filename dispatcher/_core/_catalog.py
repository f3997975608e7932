"""The catalogue: every tool the dispatcher can call, under a name a model can use.

Each registered tool gets a catalogue name that is unique in the dispatcher and matches
``^[A-Za-z0-9_-]{1,64}$`` (what LLM APIs accept). A tool keeps its own name when that name is valid and
no other server offers it; otherwise it is prefixed with its server's name (``server__tool``) and
shortened with a hash when it would be too long. A call resolves to exactly one tool or to a readable
error, never to a guess.

Names follow trust: an untrusted server never holds a bare name that a trusted source (a trusted
server or a local function) also offers. An untrusted tool that comes second gets ``server__tool``; a
trusted tool that comes second *withdraws* the bare name from the untrusted one instead of taking it:
both get ``server__tool`` names and the bare name is retired, so a call to it fails with a readable error
naming both. The bare name never moves to another tool: a model that saw it meant the untrusted tool,
and its next call, arguments and all, must not land on the trusted one. With ``qualified=True`` every
server's tool is named ``server__tool`` from the start (local functions keep the names you give them).

A tool whose definition changed and awaits approval stays in the catalogue, blocked: it keeps its name
(so no other server's tool can take that name meanwhile) but calls to it fail with the reason. A tool
its server stopped offering leaves a tombstone, so calls to it say it was removed.

Bounds, so that a server cannot grow the client without end: each server keeps at most
`MAX_TOMBSTONES` tombstones (the oldest is dropped, and its name freed, when a listing removes more),
and suggestions for an unknown name ("did you mean") come from a trigram index that visits at most
`_MAX_POSTINGS` index entries and compares at most `_MAX_CANDIDATES` names per lookup, however large
the catalogue.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import heapq
import itertools
import re
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from mcp.types import CallToolResult, ToolAnnotations

    from .._driver._coordination import Lease
    from ._keys import KeyFunction

__all__ = ["MAX_TOMBSTONES", "Catalog", "Resolution", "ToolEntry", "ToolImpl"]

# \Z, not $: "$" also matches before a trailing newline, and "read\n" is no name a model API accepts.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
_INVALID = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64
# The most characters of a name from a call that an error message repeats.
_MAX_SHOWN = 100
# The most tombstones kept per server: a server that churns its tool names drops its own oldest ones.
MAX_TOMBSTONES = 1000
# Suggestion work per unknown name: characters of it considered, trigram index entries visited, and
# names compared in full (difflib), whatever the size of the catalogue.
_MAX_SUGGESTED_CHARS = 2 * _MAX_NAME
_MAX_POSTINGS = 500
_MAX_CANDIDATES = 12
# The counters of prefixed names are a speed-up only: past this many they are forgotten, not kept forever.
_MAX_COUNTERS = 4096


class ToolImpl(Protocol):
    """How the executor runs one tool (a local function or a tool on an MCP server)."""

    def prepare(self, arguments: Mapping[str, Any]) -> Any:
        """Check arguments before the call is queued; raise `ArgumentError` to reject them."""
        ...

    async def invoke(self, prepared: Any, lease: Lease | None = None) -> CallToolResult:
        """Run the tool once with prepared arguments (inside `lease`, a fleet hold, if not None)."""
        ...


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
        filled_arguments: The arguments the dispatcher fills in itself on every call (an idempotency
            key taken in an argument, `IdempotencyKeys(argument=...)`): left out of the schema shown to
            the model (`dispatcher.formats`), and whatever the model puts there is dropped.
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
    filled_arguments: frozenset[str] = frozenset()

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


def sanitize(text: str) -> str:
    """A server's or tool's name as it reads in a ``server__tool`` name: characters models refuse become ``_``."""
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

    def __init__(self, *, qualified: bool = False) -> None:
        # Whether every server's tool is named server__tool, even when its own name is free.
        self._qualified = qualified
        # (server, tool) -> registration; insertion order is registration order.
        self._tools: dict[tuple[str | None, str], _Registered] = {}
        self._by_name: dict[str, _Registered] = {}
        self._by_tool: dict[str, list[_Registered]] = {}
        self._servers: set[str] = set()
        # The servers whose tools are untrusted (trust is fixed when a server is registered).
        self._untrusted: set[str] = set()
        # server -> tool -> why calls to it fail, for tools their server stopped offering; oldest first.
        self._removed: dict[str, dict[str, str]] = {}
        # A tool's own name -> the first tombstone with it, for calls by a removed tool's own name.
        self._removed_by_tool: dict[str, tuple[str, str]] = {}
        # Bare names withdrawn from an untrusted server because a trusted source offers them too: no
        # tool holds them, and calls to them fail, naming the tools that now have qualified names.
        self._retired: set[str] = set()
        # The trigram index behind "did you mean", built when first needed after the tools change.
        self._suggestions: _Suggestions | None = None
        # Every name issued and not freed: catalogue name -> (server, tool), listed or removed.
        self._issued: dict[str, tuple[str | None, str]] = {}
        self._names: dict[tuple[str | None, str], str] = {}
        # The next counter to try per prefixed base name, so that many clashing names cost linear time.
        self._counters: dict[str, int] = {}
        # (name, server) -> the resolution of a call that found its tool, until the tools change: a
        # model calls the same few tools over and over. Failures are not kept (a model can send any
        # number of names that resolve to nothing), so this holds at most a few entries per tool.
        self._resolved: dict[tuple[str, str | None], Resolution] = {}
        # An untrusted server -> a tool of it that was callable once (see `shown`).
        self._shown_once: dict[str, ToolEntry] = {}

    @property
    def servers(self) -> frozenset[str]:
        return frozenset(self._servers)

    def entries(self) -> list[ToolEntry]:
        """The callable tools: blocked ones are left out."""
        return [registered.entry for registered in self._by_name.values() if registered.blocked is None]

    def shown(self) -> list[ToolEntry]:
        """What a model may have been shown: the callable tools, and a tool of each untrusted server that had
        a callable tool once and has none now.

        A loop may have built its prompt before a server's tool was blocked (its definition changed) or
        removed, and go on sending it (the docs' loops build their tools once): the session guard must
        count what the model read then, not only what is callable now.
        """
        entries = self.entries()
        now = {entry.server for entry in entries}
        return [*entries, *(entry for server, entry in self._shown_once.items() if server not in now)]

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
        self._untrusted.discard(server)
        self._shown_once.pop(server, None)
        for key in [key for key in self._tools if key[0] == server]:
            del self._tools[key]
        self._removed.pop(server, None)
        for key in [key for key in self._names if key[0] == server]:
            del self._issued[self._names.pop(key)]
        # A retired name stays reserved while any tool of that own name is left.
        own = {tool for _, tool in self._names}
        self._retired &= own
        self._rebuild()

    def set_server_tools(self, server: str, tools: Sequence[tuple[ToolEntry, ToolImpl, str | None]]) -> list[str]:
        """Make a server's tools exactly these ``(entry, impl, blocked reason or None)``.

        Tools of the server that are not among them are removed and leave a tombstone.

        Returns:
            The names of the removed tools.
        """
        listed = {entry.tool for entry, _, _ in tools}
        removed = [key[1] for key in self._tools if key[0] == server and key[1] not in listed]
        tombstones = self._removed.setdefault(server, {})
        for tool in removed:
            del self._tools[(server, tool)]
            tombstones[tool] = f"tool {tool!r} was removed by server {server!r}"
        for entry, impl, blocked in tools:
            tombstones.pop(entry.tool, None)
            self._tools[(server, entry.tool)] = _Registered(entry, impl, blocked)
        # A server that churns its names would grow its tombstones without end: its oldest go, and
        # their names are freed (only this server's own names: no other server's can be dropped).
        excess = len(tombstones) - MAX_TOMBSTONES
        if excess > 0:
            for tool in list(itertools.islice(tombstones, excess)):
                del tombstones[tool]
                name = self._names.pop((server, tool), None)
                if name is not None:
                    del self._issued[name]
        self._rebuild()
        return removed

    def unavailable(self, server: str | None, tool: str) -> str | None:
        """Why a registered tool cannot be called now (blocked or removed), or None if it can."""
        registered = self._tools.get((server, tool))
        if registered is not None:
            return registered.blocked
        if server is not None:
            tombstones = self._removed.get(server)
            if tombstones is not None:
                return tombstones.get(tool)
        return None

    def put(self, entries: Iterable[tuple[ToolEntry, ToolImpl]]) -> None:
        """Add or replace tools; a new one gets a name, one already known keeps its own."""
        for entry, impl in entries:
            self._tools[(entry.server, entry.tool)] = _Registered(entry, impl)
        self._rebuild()

    def _issue(self, server: str | None, tool: str, *, trusted: bool, offered_by_trusted: bool) -> str:
        """The name for a tool registered for the first time: never a name issued (or retired) before.

        A server's tool keeps its own name when that name is valid, free, and does not contain
        ``__``: that form is reserved for the ``server__tool`` names that disambiguate, so that no
        server can offer a tool whose name reads as another server's. (A local function's name is
        the user's own choice, so it may contain ``__``.) An untrusted tool whose own name a trusted
        source offers as well, and every server's tool in qualified mode, gets ``server__tool``.
        """
        if (
            NAME_PATTERN.match(tool)
            and (server is None or ("__" not in tool and not self._qualified))
            and tool not in self._issued
            and tool not in self._retired
            and (trusted or not offered_by_trusted)
        ):
            return tool
        return self._prefixed(server, tool)

    def _prefixed(self, server: str | None, tool: str) -> str:
        """A fresh ``server__tool`` name, shortened with a hash when too long, numbered when taken."""
        key = f"{server}/{tool}"
        base = _shorten(f"{sanitize(server or 'local')}__{sanitize(tool)}", key)
        name = base
        counter = self._counters.get(base, 2)
        while name in self._issued or name in self._retired:
            name = _shorten(f"{base}_{counter}", f"{key}#{counter}")
            counter += 1
        if len(self._counters) >= _MAX_COUNTERS:
            self._counters.clear()
        self._counters[base] = counter
        return name

    def _withdraw(self, offered: Iterable[str]) -> None:
        """Take from untrusted tools the bare names that a trusted source offers too (see the module docstring)."""
        for tool in offered:
            holder = self._issued.get(tool)
            if holder is not None and holder[1] == tool and holder[0] in self._untrusted:
                # Withdrawn, not moved: the untrusted tool gets server__tool, the bare name no tool.
                del self._issued[tool]
                self._retired.add(tool)
                name = self._names[holder] = self._prefixed(*holder)
                self._issued[name] = holder

    def _rebuild(self) -> None:
        # The own names that a trusted source offers (listed, blocked or removed): untrusted tools of
        # those names never hold them bare.
        # A dict, not a set: withdrawals happen in registration order, so the names they issue do not
        # depend on string hashing.
        offered = dict.fromkeys(key[1] for key, registered in self._tools.items() if registered.entry.trusted)
        for server, tombstones in self._removed.items():
            if server not in self._untrusted:
                offered.update(dict.fromkeys(tombstones))
        for key, registered in self._tools.items():
            if key not in self._names:
                trusted = registered.entry.trusted
                if not trusted and key[0] is not None:
                    self._untrusted.add(key[0])
                name = self._names[key] = self._issue(*key, trusted=trusted, offered_by_trusted=key[1] in offered)
                self._issued[name] = key
        self._withdraw(offered)
        by_tool: dict[str, list[_Registered]] = {}
        by_name: dict[str, _Registered] = {}
        for key, registered in self._tools.items():
            name = self._names[key]
            if registered.entry.name != name:
                registered.entry = dataclasses.replace(registered.entry, name=name)
            by_tool.setdefault(registered.entry.tool, []).append(registered)
            by_name[name] = registered
            if registered.blocked is None and not registered.entry.trusted and key[0] is not None:
                self._shown_once.setdefault(key[0], registered.entry)
        removed_by_tool: dict[str, tuple[str, str]] = {}
        for server, tombstones in self._removed.items():
            for tool in tombstones:
                removed_by_tool.setdefault(tool, (server, tool))
        self._by_name = by_name
        self._by_tool = by_tool
        self._removed_by_tool = removed_by_tool
        self._resolved = {}
        self._suggestions = None

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
        if name in self._retired:
            choices = ", ".join(repr(r.entry.name) for r in group or ()) or "none listed now"
            return Resolution(
                None,
                None,
                f"tool name {name!r} is no longer in use: an untrusted server and a trusted source (a trusted "
                f"server or a local function) both offer a tool of that name, so each goes by its server's name; "
                f"call one of {choices}, or set ToolCall.server",
            )
        if group is not None and len(group) > 1:
            choices = ", ".join(repr(r.entry.name) for r in group)
            return Resolution(
                None,
                None,
                f"tool name {name!r} is ambiguous: it is offered by {len(group)} servers; "
                f"call one of {choices}, or set ToolCall.server",
            )
        if self._qualified and group is not None and group[0].entry.server is not None:
            # Qualified names are the only names: a server's own name reaches nothing by itself.
            return Resolution(
                None,
                None,
                f"unknown tool {_shown(name)}: tools go by their server's name; call {group[0].entry.name!r}, "
                "or set ToolCall.server",
            )
        if "__" not in name:
            if group is not None:
                return self._found(group[0])
            tombstone = self._removed_by_tool.get(name)
            if tombstone is not None and not self._qualified:
                resolution = self._at(tombstone)
                assert resolution is not None
                return resolution
        message = f"unknown tool {_shown(name)}"
        if self._suggestions is None:
            # Only callable tools: a blocked one may be new, its name text that nobody has reviewed.
            self._suggestions = _Suggestions([n for n, r in self._by_name.items() if r.blocked is None])
        close = self._suggestions.close(name)
        if close:
            message += f"; did you mean {', '.join(repr(c) for c in close)}?"
        return Resolution(None, None, message)

    def _at(self, key: tuple[str | None, str]) -> Resolution | None:
        """The resolution of a registered tool (listed, blocked or removed), or None if it is unknown."""
        registered = self._tools.get(key)
        if registered is not None:
            return self._found(registered)
        if key[0] is not None:
            reason = self._removed.get(key[0], {}).get(key[1])
            if reason is not None:
                return Resolution(None, None, reason, untrusted=True)
        return None

    @staticmethod
    def _found(registered: _Registered) -> Resolution:
        if registered.blocked is not None:
            return Resolution(None, None, registered.blocked, untrusted=True)
        return Resolution(registered.entry, registered.impl, None)


def _grams(word: str) -> set[str]:
    """The character trigrams of a word, its ends marked, case folded."""
    padded = f"\x00{word.lower()}\x00"
    return {padded[i : i + 3] for i in range(max(1, len(padded) - 2))}


class _Suggestions:
    """Close matches for an unknown name, at a cost that does not grow with the catalogue.

    A trigram index narrows the catalogue to the names that share the most trigrams with the unknown
    one: its rarest trigrams are looked up first, up to `_MAX_POSTINGS` index entries in all, and only
    the best `_MAX_CANDIDATES` names are compared in full (difflib, as before): every suggestion is as
    close as difflib requires, but a close name whose trigrams are all common ones may be missed, which
    costs a suggestion, never a call.
    """

    __slots__ = ("_index", "_names")

    def __init__(self, names: list[str]) -> None:
        self._names = names
        self._index: dict[str, list[int]] = {}
        for position, name in enumerate(names):
            for gram in _grams(name):
                self._index.setdefault(gram, []).append(position)

    def close(self, word: str, n: int = 3) -> list[str]:
        word = word[:_MAX_SUGGESTED_CHARS]
        postings = sorted((found for gram in _grams(word) if (found := self._index.get(gram)) is not None), key=len)
        hits: dict[int, int] = {}
        budget = _MAX_POSTINGS
        for found in postings:
            for position in found[:budget]:
                hits[position] = hits.get(position, 0) + 1
            budget -= len(found)
            if budget <= 0:
                break
        best = heapq.nlargest(_MAX_CANDIDATES, hits, key=hits.__getitem__)
        return difflib.get_close_matches(word, [self._names[position] for position in best], n=n)
