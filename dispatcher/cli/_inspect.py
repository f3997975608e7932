"""`inspect`: how the dispatcher would treat a server's tools, and what to worry about.

For each tool: the hints the server declares, the hints the dispatcher will act on under the chosen
trust, whether its calls run concurrently or exclusively, and whether they may be retried. Warnings
point at hints that contradict each other, names that model APIs reject, tools serialized only because
the server is untrusted, and a toolset that combines the three legs of the lethal trifecta (judged as
`SessionGuard` judges a session, see `dispatcher._core._trifecta`), and tools that need MCP tasks
(`execution.taskSupport` "required", which the dispatcher does not send, so their calls fail). A note
says when tools declare no annotations at all: every call of theirs runs alone. The user's own
overrides (`add_mcp_server(overrides=...)`, ``--override TOOL=HINTS``) are applied, so their effect
shows before any code is written.

It also shows what the model will read: each tool's title, description and input schema as the
catalogue holds them (what `dispatcher.formats` sends), and each definition's pin, the hash
`Dispatcher.export_pins` saves. Given earlier pins (`compare`), it says which tools changed, which are
new and which are gone: against an `export_pins` file it can only tell that a definition differs;
against an earlier ``inspect --json`` report it also says which parts (title, description, schemas,
each annotation).

The analysis (`analyze`, `compare`) is a pure function of catalogue entries; `inspect_server` registers
the server with a `Dispatcher`, so names, trust and pins are exactly what a dispatcher would use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from dispatcher._core._annotations import HINTS, effective_annotations
from dispatcher._core._catalog import NAME_PATTERN
from dispatcher._core._errors import ConfigurationError, DispatcherError
from dispatcher._core._keys import rule as key_rule
from dispatcher._core._trifecta import communicates_externally, ingests_untrusted_content, reads_private_data
from dispatcher._dispatcher import Dispatcher
from dispatcher._mcp._session import list_all_tools
from dispatcher._mcp._tasks import serves_tasks

from ..tuning._connection import connected, describe_target

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mcp.types import ToolAnnotations

    from dispatcher._core._catalog import ToolEntry

    from ..tuning._connection import Target

__all__ = ["Finding", "Pinned", "Report", "ToolReport", "analyze", "compare", "inspect_server", "load_pins"]

Code = Literal[
    "contradictory_hints", "invalid_name", "untrusted_serialized", "lethal_trifecta", "needs_tasks", "no_annotations"
]
PinStatus = Literal["unchanged", "changed", "new"]
# The parts of a definition an earlier report holds, compared one by one (annotations hint by hint).
_PARTS = (
    ("title", "title"),
    ("description", "description"),
    ("input_schema", "input schema"),
    ("output_schema", "output schema"),
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One warning: a stable code for scripts and a sentence for people."""

    code: Code
    message: str


@dataclass(frozen=True, slots=True)
class ToolReport:
    """How one tool will be treated."""

    tool: str
    name: str
    declared: dict[str, bool | None]
    effective: dict[str, bool]
    scheduling: Literal["concurrent", "exclusive"]
    retryable: bool
    warnings: tuple[Finding, ...]
    # How its calls are keyed for conflicts (docs/conflicts.md): "root", a domain, or domain/<fn(arguments)>.
    keys: str = "root"
    # What the model reads, as the server wrote it (untrusted text: escape it before printing).
    title: str | None = None
    description: str | None = None
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    output_schema: Mapping[str, Any] | None = None
    # The definition's pin ("sha256:..."), as `Dispatcher.export_pins` saves it.
    pin: str | None = None
    # Against earlier pins (`compare`): unchanged, changed or new, and what changed when it is known.
    pinned: PinStatus | None = None
    changes: tuple[str, ...] = ()
    # The hints the user's override sets (spec names), or None without an override.
    override: dict[str, bool] | None = None
    # The tool's `execution.taskSupport` ("forbidden", "optional", "required"), None when it declares none.
    task_support: str | None = None


@dataclass(frozen=True, slots=True)
class Pinned:
    """Earlier pins of one server: a hash per tool, and the definition when the source has it.

    Attributes:
        source: Where they come from, for people (a file name).
        pins: Tool name (the server's) -> pinned hash.
        definitions: Tool name -> the parts of its definition an earlier ``inspect --json`` showed
            (``title``, ``description``, ``input_schema``, ``output_schema``, ``declared``); empty for an
            `export_pins` file, which holds hashes only.
    """

    source: str
    pins: Mapping[str, str]
    definitions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Report:
    """A server's tools as the dispatcher sees them, and the warnings about the toolset as a whole.

    Attributes:
        server: The name the server was registered under (yours, not the server's).
        target: What was connected to, for people.
        trusted: Whether the server's annotations were trusted.
        protocol: The protocol version negotiated.
        tools: One report per tool.
        warnings: Warnings about the toolset as a whole.
        server_name: The name the server gives itself (`serverInfo.name`), if any: a self-report.
        server_version: The version it gives itself, if any.
        domain: The conflict-key domain the server was registered with (docs/conflicts.md), or None for
            the root key (its calls that may mutate run alone).
        pins: Where the pins compared against came from, or None when none were given.
        removed: Tools the pins hold that the server no longer lists.
        notes: What the user should know that is no fault of the server's (tools without annotations).
    """

    server: str
    target: str
    trusted: bool
    protocol: str | None
    tools: tuple[ToolReport, ...]
    warnings: tuple[Finding, ...]
    server_name: str | None = None
    server_version: str | None = None
    domain: str | None = None
    pins: str | None = None
    removed: tuple[str, ...] = ()
    notes: tuple[Finding, ...] = ()

    @property
    def differs(self) -> bool:
        """Whether the tools differ from the pins compared against (changed, new or removed)."""
        return bool(self.removed) or any(tool.pinned in ("changed", "new") for tool in self.tools)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data (what `--json` prints): texts whole, JSON escaping their characters."""
        pins = None
        if self.pins is not None:
            pins = {
                "source": self.pins,
                "differs": self.differs,
                "removed": list(self.removed),
            }
        return {
            "server": self.server,
            "target": self.target,
            "trusted": self.trusted,
            "protocol": self.protocol,
            "domain": self.domain,
            "server_info": {"name": self.server_name, "version": self.server_version},
            "tools": [
                {
                    "tool": tool.tool,
                    "name": tool.name,
                    "declared": tool.declared,
                    "effective": tool.effective,
                    "scheduling": tool.scheduling,
                    "retryable": tool.retryable,
                    "keys": tool.keys,
                    "warnings": [{"code": w.code, "message": w.message} for w in tool.warnings],
                    "title": tool.title,
                    "description": tool.description,
                    "input_schema": dict(tool.input_schema),
                    "output_schema": dict(tool.output_schema) if tool.output_schema is not None else None,
                    "pin": tool.pin,
                    "override": tool.override,
                    "task_support": tool.task_support,
                    **({"pinned": tool.pinned, "changes": list(tool.changes)} if self.pins is not None else {}),
                }
                for tool in self.tools
            ],
            "warnings": [{"code": w.code, "message": w.message} for w in self.warnings],
            "notes": [{"code": n.code, "message": n.message} for n in self.notes],
            "pins": pins,
        }


def _hints(annotations: ToolAnnotations | None) -> dict[str, bool | None]:
    return {spec: getattr(annotations, attr) if annotations is not None else None for spec, attr in HINTS}


def _tool_findings(entry: ToolEntry, task_support: str | None = None, *, tasks_served: bool = False) -> list[Finding]:
    findings: list[Finding] = []
    # The dispatcher runs such a call as a task when the server advertises task-augmented tools/call; only a
    # server that requires tasks and does not advertise them refuses every call.
    if task_support == "required" and not tasks_served:
        findings.append(
            Finding(
                "needs_tasks",
                "needs MCP tasks (execution.taskSupport is 'required'), but the server does not advertise "
                "task-augmented tool calls, so the dispatcher cannot run it as a task: every call of it will fail",
            )
        )
    declared = entry.declared_annotations
    # A read-only tool has no effects, so it cannot be destructive, and repeating it cannot add one: it is
    # idempotent. destructiveHint false and idempotentHint true agree with that (and are what careful
    # servers declare); only the opposite values contradict it.
    if declared is not None and declared.read_only_hint:
        if declared.destructive_hint is True:
            findings.append(
                Finding(
                    "contradictory_hints",
                    "readOnlyHint is true but destructiveHint is true: a tool that does not modify its environment "
                    "cannot destroy anything; the dispatcher goes by readOnlyHint",
                )
            )
        if declared.idempotent_hint is False:
            findings.append(
                Finding(
                    "contradictory_hints",
                    "readOnlyHint is true but idempotentHint is false: repeating a tool that does not modify its "
                    "environment has no additional effect; the dispatcher goes by readOnlyHint",
                )
            )
    if not NAME_PATTERN.match(entry.tool):
        findings.append(
            Finding(
                "invalid_name",
                f"model APIs reject the name {entry.tool!r} (they accept ^[A-Za-z0-9_-]{{1,64}}$); "
                f"the dispatcher shows it to the model as {entry.name!r}",
            )
        )
    if not entry.trusted and declared is not None and declared.read_only_hint and entry.exclusive:
        # One line for all such tools in the text report (`_present`): the cause is the server's trust.
        findings.append(
            Finding(
                "untrusted_serialized",
                "declared read-only, but runs exclusive because the server is untrusted; trust the server "
                "(--trusted) or declare the tool read-only in an override to run its calls concurrently",
            )
        )
    return findings


def _trifecta(entries: Sequence[ToolEntry]) -> Finding | None:
    """The lethal trifecta, judged from the declared hints (spec defaults for missing ones).

    The legs are those `SessionGuard` tracks, so with the server trusted this warns exactly when a guarded
    session using these tools could trip: a private read and an open-world answer, then an open-world write.
    """
    reads, ingests, writes = [], [], []
    for entry in entries:
        hints = effective_annotations(entry.declared_annotations, trusted=True)
        if reads_private_data(hints):
            reads.append(entry.name)
        if ingests_untrusted_content(hints):
            ingests.append(entry.name)
        if communicates_externally(hints):
            writes.append(entry.name)
    if not (reads and ingests and writes):
        return None
    return Finding(
        "lethal_trifecta",
        f"lethal trifecta: these tools can read private data ({', '.join(reads)}), ingest open-world content "
        f"({', '.join(ingests)}) and write to the open world ({', '.join(writes)}); instructions injected into "
        "fetched content could make the model send private data out. Keep them out of one session, or ask "
        "for approval before the writes (SessionGuard does once a session has done both)",
    )


def _unannotated(entries: Sequence[ToolEntry], overrides: Mapping[str, ToolAnnotations]) -> Finding | None:
    """A note when tools declare no hint at all (and no override covers them): their calls all run alone."""
    bare = [
        entry
        for entry in entries
        if entry.tool not in overrides
        and (entry.declared_annotations is None or all(v is None for v in _hints(entry.declared_annotations).values()))
    ]
    if not bare:
        return None
    example = bare[0].tool
    how = (
        f"if you know a tool is read-only, say so: --override {example}=readOnly here, "
        f'add_mcp_server(..., overrides={{"{example}": ToolAnnotations(readOnlyHint=True)}}) in code'
    )
    if len(bare) == len(entries):
        return Finding(
            "no_annotations",
            "the server declares no annotations, so every call will run alone (one at a time, in order) and none "
            f"is retried: the spec's worst case for every tool; {how}",
        )
    names = ", ".join(entry.name for entry in bare)
    return Finding(
        "no_annotations",
        f"{len(bare)} of {len(entries)} tools declare no annotations ({names}), so their calls will run alone and "
        f"are never retried; {how}",
    )


def analyze(
    entries: Sequence[ToolEntry],
    pins: Mapping[str, str] | None = None,
    *,
    overrides: Mapping[str, ToolAnnotations] | None = None,
    task_support: Mapping[str, str | None] | None = None,
    tasks_served: bool = False,
) -> tuple[tuple[ToolReport, ...], tuple[Finding, ...]]:
    """Report on catalogue entries: each tool, then the warnings about the toolset.

    Args:
        entries: The catalogue entries of one server.
        pins: Their pins (tool name on the server -> hash), from `Dispatcher.export_pins`.
        overrides: The user's overrides they were registered with (by the server's tool name).
        task_support: Each tool's `execution.taskSupport`, by the server's tool name.
        tasks_served: Whether the server advertises task-augmented `tools/call` (then a tool that requires
            tasks runs as one, and gets no warning).
    """
    pins = pins or {}
    overrides = overrides or {}
    task_support = task_support or {}
    tools = tuple(
        ToolReport(
            tool=entry.tool,
            name=entry.name,
            declared=_hints(entry.declared_annotations),
            effective={spec: bool(value) for spec, value in _hints(entry.annotations).items()},
            scheduling="concurrent" if entry.concurrent else "exclusive",
            # What a RetryPolicy acts on: the effective idempotentHint, which only trusted sources set.
            retryable=entry.idempotent,
            warnings=tuple(_tool_findings(entry, task_support.get(entry.tool), tasks_served=tasks_served)),
            keys=key_rule(entry),
            title=entry.title,
            description=entry.description,
            input_schema=dict(entry.input_schema),
            output_schema=dict(entry.output_schema) if entry.output_schema is not None else None,
            pin=pins.get(entry.tool),
            override=_set_hints(overrides.get(entry.tool)),
            task_support=task_support.get(entry.tool),
        )
        for entry in entries
    )
    trifecta = _trifecta(entries)
    return tools, (trifecta,) if trifecta is not None else ()


def _set_hints(annotations: ToolAnnotations | None) -> dict[str, bool] | None:
    if annotations is None:
        return None
    return {spec: value for spec, value in _hints(annotations).items() if value is not None}


def _show(value: object) -> str:
    return "unset" if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _differences(old: Mapping[str, Any], tool: ToolReport) -> tuple[str, ...]:
    """What differs between a definition an earlier report showed and this tool's, part by part."""
    changes = [f"{label} changed" for key, label in _PARTS if old.get(key) != getattr(tool, key)]
    declared = old.get("declared")
    if isinstance(declared, Mapping) and declared != tool.declared:
        details = [
            f"{hint} {_show(declared.get(hint))} -> {_show(value)}"
            for hint, value in tool.declared.items()
            if declared.get(hint) != value
        ]
        changes.append("annotations changed: " + ", ".join(details))
    return tuple(changes)


def compare(tools: Sequence[ToolReport], pinned: Pinned) -> tuple[tuple[ToolReport, ...], tuple[str, ...]]:
    """Compare tools with earlier pins: each tool unchanged, changed or new, and the pinned tools gone.

    A changed tool says which parts changed when the pins come with definitions (an earlier
    ``inspect --json``); against hashes alone, only that its definition differs.
    """
    compared = []
    for tool in tools:
        approved = pinned.pins.get(tool.tool)
        if approved is None:
            compared.append(replace(tool, pinned="new", changes=("not in the pins: a tool the server added",)))
        elif approved == tool.pin:
            compared.append(replace(tool, pinned="unchanged"))
        else:
            old = pinned.definitions.get(tool.tool)
            changes = _differences(old, tool) if old is not None else ()
            if not changes:
                # Hashes alone, or a part an earlier report does not show (such as an annotation's title).
                changes = (f"definition differs from the pinned one ({approved[:15]}...)",)
            compared.append(replace(tool, pinned="changed", changes=changes))
    listed = {tool.tool for tool in tools}
    return tuple(compared), tuple(name for name in pinned.pins if name not in listed)


def load_pins(data: object, *, server: str, source: str) -> Pinned:
    """Earlier pins of `server` from parsed JSON: an `export_pins` file or an earlier ``inspect --json``.

    Raises:
        ConfigurationError: The data is neither, or holds no pins for `server`.
    """
    if isinstance(data, Mapping) and isinstance(data.get("tools"), list):
        if data.get("server") != server:
            raise ConfigurationError(
                f"{source} is an inspect report of server {data.get('server')!r}, not {server!r}; "
                f"use --name {data.get('server')!r}"
            )
        pins: dict[str, str] = {}
        definitions: dict[str, Mapping[str, Any]] = {}
        for tool in data["tools"]:
            valid = isinstance(tool, Mapping) and isinstance(tool.get("tool"), str)
            if not valid or not isinstance(tool.get("pin"), str):
                raise ConfigurationError(
                    f"{source}: every tool of an inspect report needs 'tool' and 'pin' (reports from this "
                    "version of dispatcher inspect --json have them)"
                )
            pins[tool["tool"]] = tool["pin"]
            definitions[tool["tool"]] = tool
        return Pinned(source, pins, definitions)
    if not isinstance(data, Mapping) or not all(isinstance(tools, Mapping) for tools in data.values()):
        raise ConfigurationError(
            f"{source} is neither pins saved from Dispatcher.export_pins() ({{server: {{tool: hash}}}}) "
            "nor a report of dispatcher inspect --json"
        )
    if server not in data:
        known = ", ".join(repr(name) for name in data) or "none"
        raise ConfigurationError(f"{source} has no pins for server {server!r} (it has {known}); use --name")
    tools = data[server]
    if not all(isinstance(name, str) and isinstance(pin, str) for name, pin in tools.items()):
        raise ConfigurationError(f"{source}: the pins of server {server!r} must map tool names to hashes")
    return Pinned(source, dict(tools))


async def inspect_server(
    target: Target,
    *,
    server: str = "server",
    trusted: bool = False,
    domain: str | None = None,
    mode: Literal["auto", "legacy"] = "auto",
    connect_timeout: float | None = 30.0,
    pins: Pinned | None = None,
    overrides: Mapping[str, ToolAnnotations] | None = None,
) -> Report:
    """Connect to a server, register it with a dispatcher, and report on its tools.

    Args:
        target: What to connect to (see `tune`'s target): an entered `mcp.Client`, an in-process server,
            a `StdioServerParameters`, a URL, or a function returning a new `mcp.Client`.
        server: The name to register the server under.
        trusted: Whether to believe the server's annotations.
        domain: The conflict-key domain to register the server with (see `Dispatcher.add_mcp_server`).
        mode: The protocol negotiation when `inspect_server` connects.
        connect_timeout: Seconds to connect, or None.
        pins: Earlier pins of this server to compare the tools with (see `load_pins`).
        overrides: Your own annotations for some of its tools, by the server's tool name, as
            `add_mcp_server(overrides=...)` takes them: the report shows their effect.

    Raises:
        ServerConnectionError: The server could not be reached or listed.
        ConfigurationError: An argument is invalid, or an override names a tool the server lacks.
    """
    overrides = dict(overrides or {})
    failure: DispatcherError | None = None
    tasks: dict[str, str | None] = {}
    tasks_served = False
    description = f"server {server!r} ({describe_target(target)})"
    async with connected(target, mode=mode, connect_timeout=connect_timeout, description=description) as client:
        async with Dispatcher() as dispatcher:
            try:
                entries = await dispatcher.add_mcp_server(
                    server, client, trusted=trusted, domain=domain, overrides=overrides
                )
                # Pinned from the same listing as the entries (trust on first use), so a server cannot
                # show the report one definition and the pin another.
                hashes = dispatcher.export_pins().get(server, {})
                # The catalogue keeps no `execution`; the listing does (from the client's cache when it
                # has one). It only adds a warning, so a server that answers differently fools nobody.
                for tool in await list_all_tools(client):
                    if tool.execution is not None and tool.execution.task_support is not None:
                        tasks[tool.name] = str(tool.execution.task_support)
                tasks_served = serves_tasks(client)
            except DispatcherError as exc:
                # Raised once the dispatcher is closed: its task group would wrap it in an exception group.
                failure = exc
        info = client.server_info
        protocol = client.protocol_version
    if failure is not None:
        raise failure
    tools, warnings = analyze(entries, hashes, overrides=overrides, task_support=tasks, tasks_served=tasks_served)
    note = _unannotated(entries, overrides)
    removed: tuple[str, ...] = ()
    if pins is not None:
        tools, removed = compare(tools, pins)
    return Report(
        server,
        describe_target(target),
        trusted,
        protocol,
        tools,
        warnings,
        server_name=info.name if info is not None else None,
        server_version=info.version if info is not None else None,
        domain=domain,
        pins=pins.source if pins is not None else None,
        removed=removed,
        notes=(note,) if note is not None else (),
    )
