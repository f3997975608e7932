"""Definition pinning: a tool whose definition changes after approval is blocked until approved again.

A server can change a tool after the user chose to use it (a "rug pull"): a read-only tool that now
writes, a description that now carries instructions for the model. Each tool's definition (name, title,
description, input and output schema, annotations: everything the model or the scheduler reads) is
hashed when first seen and the hash is pinned. When a later listing (after `tools/list_changed`, a
refresh or a reconnect) differs from the pin, the tool is blocked until the change is accepted. Pins
are plain data (server -> tool -> hash), so approvals can be saved and loaded across runs.

A tool with no pin is new. On a server's first listing with no imported pins it is the user's first
sight and is pinned as it is (trust on first use); once the server's tools were seen (listed before, or
pins imported for it), a new tool is a change like any other when the caller asks for review of new
tools (`check(..., review_new=True)`): it stays unpinned, and blocked, until accepted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from .._core._annotations import HINTS
from .._core._errors import ConfigurationError

if TYPE_CHECKING:
    from mcp.types import Tool

__all__ = ["DefinitionChange", "Pins", "definition", "definition_hash", "describe_changes"]

_HASH = re.compile(r"\Asha256:[0-9a-f]{64}\Z")
_HINTS = tuple(spec for spec, _ in HINTS)
_PARTS = (
    ("title", "title"),
    ("description", "description"),
    ("inputSchema", "input schema"),
    ("outputSchema", "output schema"),
)


@dataclass(frozen=True, slots=True)
class DefinitionChange:
    """A tool whose definition differs from the one approved, or a new tool: it is blocked until accepted.

    What a person reviews is `new` (beside `old`); accepting the change approves exactly that
    definition, the one whose hash is `current`. If the server changes the tool again before the
    change is accepted, accepting this one does nothing: the tool stays blocked under a newer change.

    Attributes:
        server: The name the server was registered under.
        tool: The tool's name on that server (the server's text: untrusted).
        changes: What changed, one phrase per part of the definition, such as
            ``"annotations changed: readOnlyHint true -> false"`` or ``"description changed"``;
            ``("new tool",)`` for a tool the server did not offer when its tools were reviewed.
        approved: The pinned hash of the approved definition; None for a new tool.
        current: The hash of the definition the server lists now, the one accepting approves.
        new: The definition the server lists now, as JSON data with the protocol's field names
            (``name``, ``title`` when set, ``description``, ``inputSchema``, ``outputSchema``,
            ``annotations``): the text the model would read and the scheduler would act on. A copy:
            changing it changes nothing.
        old: The approved definition in the same form; None for a new tool, and for one whose
            approval came from imported pins (they carry only hashes).
    """

    server: str
    tool: str
    changes: tuple[str, ...]
    approved: str | None
    current: str
    _: KW_ONLY
    # Not compared: `current` is the hash of `new`, and `approved` that of `old`.
    new: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    old: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def added(self) -> bool:
        """Whether the tool is new: its server did not offer it when its tools were reviewed."""
        return self.approved is None

    def __str__(self) -> str:
        return "; ".join(self.changes)


def definition(tool: Tool) -> dict[str, Any]:
    """The pinned parts of a tool's definition, as JSON data with the protocol's field names.

    These are every part of a tool that the dispatcher reads: what `dispatcher.formats` shows the model
    (name, title, description, input schema) and what scheduling, retries and approvals decide from
    (annotations, input and output schema). The top-level ``title`` is included only when the tool has
    one, so pins saved before it was pinned still match tools without a title.
    """
    annotations = tool.annotations
    data: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "outputSchema": tool.output_schema,
        "annotations": None
        if annotations is None
        else annotations.model_dump(mode="json", by_alias=True, exclude_none=True) or None,
    }
    if tool.title is not None:
        data["title"] = tool.title
    return data


def definition_hash(data: Mapping[str, Any]) -> str:
    """The pin of a definition: ``sha256:`` and the hex digest of its canonical JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _copy(data: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of definition data (JSON by construction), for a change handed to the user."""
    copied: dict[str, Any] = json.loads(json.dumps(data, allow_nan=False))
    return copied


def _show(value: object) -> str:
    if value is None:
        return "unset"
    return json.dumps(value, ensure_ascii=False)


def describe_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any], approved: str) -> tuple[str, ...]:
    """Say what differs between an approved definition and a new one.

    Args:
        old: The approved definition, or None when only its hash is known (pins loaded from a file).
        new: The definition listed now.
        approved: The approved definition's hash, named when `old` is unknown.
    """
    if old is None:
        return (f"definition differs from the approved one ({approved[:15]}...)",)
    changes: list[str] = []
    old_annotations: Mapping[str, Any] = old.get("annotations") or {}
    new_annotations: Mapping[str, Any] = new.get("annotations") or {}
    if old_annotations != new_annotations:
        keys = [*_HINTS, *sorted((set(old_annotations) | set(new_annotations)) - set(_HINTS))]
        details = [
            f"{key} {_show(old_annotations.get(key))} -> {_show(new_annotations.get(key))}"
            for key in keys
            if old_annotations.get(key) != new_annotations.get(key)
        ]
        changes.append("annotations changed: " + ", ".join(details))
    for key, label in _PARTS:
        if old.get(key) != new.get(key):
            changes.append(f"{label} changed")
    return tuple(changes) or ("definition changed",)


class Pins:
    """The approved definition of every tool seen, by server and tool name.

    A tool seen for the first time is approved as it is (trust on first use), unless a pin for it was
    loaded or the caller asks for new tools to be reviewed. Approved definitions are kept in memory, so
    that a change can be described in detail; pins loaded from outside only carry hashes.
    """

    def __init__(self) -> None:
        self._hashes: dict[str, dict[str, str]] = {}
        self._definitions: dict[tuple[str, str], dict[str, Any]] = {}
        # Servers whose pins were loaded: their tools were reviewed in an earlier run.
        self._loaded: set[str] = set()

    def loaded(self, server: str) -> bool:
        """Whether pins were loaded for a server (then a tool without a pin is new to the user)."""
        return server in self._loaded

    def seen(self, server: str) -> None:
        """Note that a server's tools were listed, so that its pins are exported even when it has none.

        A server whose every tool awaits review exports as ``{}``: in the next run its tools are new,
        not a first sight.
        """
        self._hashes.setdefault(server, {})

    def check(
        self, server: str, tool: Tool, *, review_new: bool = False
    ) -> tuple[dict[str, Any], DefinitionChange | None]:
        """Pin a tool on first sight, or compare it with its pin.

        Args:
            server: The server's registered name.
            tool: The tool as listed.
            review_new: Treat a tool without a pin as a change (not pinned until approved) instead of
                pinning it on first sight.

        Returns:
            Its definition, and how it differs from the approved one (None when it does not).
        """
        data = definition(tool)
        digest = definition_hash(data)
        pins = self._hashes.setdefault(server, {})
        approved = pins.get(tool.name)
        if approved is None:
            if review_new:
                return data, DefinitionChange(server, tool.name, ("new tool",), None, digest, new=_copy(data))
            pins[tool.name] = digest
            self._definitions[(server, tool.name)] = data
            return data, None
        if approved == digest:
            self._definitions[(server, tool.name)] = data
            return data, None
        old = self._definitions.get((server, tool.name))
        changes = describe_changes(old, data, approved)
        return data, DefinitionChange(
            server,
            tool.name,
            changes,
            approved,
            digest,
            new=_copy(data),
            old=_copy(old) if old is not None else None,
        )

    def approve(self, server: str, tool: str, data: dict[str, Any]) -> None:
        """Pin a definition as approved."""
        self._hashes.setdefault(server, {})[tool] = definition_hash(data)
        self._definitions[(server, tool)] = data

    def export(self) -> dict[str, dict[str, str]]:
        """Every pin, as ``{server: {tool: hash}}``; a server listed with no approved tool maps to ``{}``."""
        return {server: dict(tools) for server, tools in self._hashes.items()}

    def load(self, pins: Mapping[str, Mapping[str, str]]) -> None:
        """Replace the pins of the servers named in `pins` (others keep theirs).

        Raises:
            ConfigurationError: `pins` is not a ``{server: {tool: "sha256:..."}}`` mapping.
        """
        if not isinstance(pins, Mapping):
            raise ConfigurationError(f"pins must be a mapping of server -> tool -> hash, got {type(pins).__name__}")
        loaded: dict[str, dict[str, str]] = {}
        for server, tools in pins.items():
            if not isinstance(server, str) or not isinstance(tools, Mapping):
                raise ConfigurationError(f"pins[{server!r}] must map tool names to hashes, got {type(tools).__name__}")
            for tool, digest in tools.items():
                if not isinstance(tool, str) or not isinstance(digest, str) or not _HASH.match(digest):
                    raise ConfigurationError(
                        f"pins[{server!r}][{tool!r}] must be a 'sha256:<64 hex digits>' string from export_pins(), "
                        f"got {digest!r}"
                    )
            loaded[server] = dict(tools)
        for server, tools in loaded.items():
            self._hashes[server] = tools
            self._loaded.add(server)
            for key in [key for key in self._definitions if key[0] == server]:
                if tools.get(key[1]) != definition_hash(self._definitions[key]):
                    del self._definitions[key]
