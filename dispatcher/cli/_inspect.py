"""`inspect`: how the dispatcher would treat a server's tools, and what to worry about.

For each tool: the hints the server declares, the hints the dispatcher will act on under the chosen
trust, whether its calls run concurrently or exclusively, and whether they may be retried. Warnings
point at hints that contradict each other, names that model APIs reject, tools serialized only because
the server is untrusted, and a toolset that combines the three legs of the lethal trifecta (judged as
`SessionGuard` judges a session, see `dispatcher._trifecta`).

The analysis (`analyze`) is a pure function of catalogue entries; `inspect_server` registers the server
with a `Dispatcher`, so names and trust are exactly what a dispatcher would use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from dispatcher._annotations import HINTS, effective_annotations
from dispatcher._catalog import NAME_PATTERN
from dispatcher._dispatcher import Dispatcher
from dispatcher._errors import DispatcherError
from dispatcher._keys import rule as key_rule
from dispatcher._trifecta import communicates_externally, ingests_untrusted_content, reads_private_data

from ._connection import connected, describe_target

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mcp.types import ToolAnnotations

    from dispatcher._catalog import ToolEntry

    from ._connection import Target

__all__ = ["Finding", "Report", "ToolReport", "analyze", "inspect_server"]

Code = Literal["contradictory_hints", "invalid_name", "untrusted_serialized", "lethal_trifecta"]


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

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data (what `--json` prints)."""
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
                }
                for tool in self.tools
            ],
            "warnings": [{"code": w.code, "message": w.message} for w in self.warnings],
        }


def _hints(annotations: ToolAnnotations | None) -> dict[str, bool | None]:
    return {spec: getattr(annotations, attr) if annotations is not None else None for spec, attr in HINTS}


def _tool_findings(entry: ToolEntry) -> list[Finding]:
    findings: list[Finding] = []
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


def analyze(entries: Sequence[ToolEntry]) -> tuple[tuple[ToolReport, ...], tuple[Finding, ...]]:
    """Report on catalogue entries: each tool, then the warnings about the toolset."""
    tools = tuple(
        ToolReport(
            tool=entry.tool,
            name=entry.name,
            declared=_hints(entry.declared_annotations),
            effective={spec: bool(value) for spec, value in _hints(entry.annotations).items()},
            scheduling="concurrent" if entry.concurrent else "exclusive",
            # What a RetryPolicy acts on: the effective idempotentHint, which only trusted sources set.
            retryable=entry.idempotent,
            warnings=tuple(_tool_findings(entry)),
            keys=key_rule(entry),
        )
        for entry in entries
    )
    trifecta = _trifecta(entries)
    return tools, (trifecta,) if trifecta is not None else ()


async def inspect_server(
    target: Target,
    *,
    server: str = "server",
    trusted: bool = False,
    domain: str | None = None,
    mode: Literal["auto", "legacy"] = "auto",
    connect_timeout: float | None = 30.0,
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

    Raises:
        ServerConnectionError: The server could not be reached or listed.
        ConfigurationError: An argument is invalid.
    """
    failure: DispatcherError | None = None
    description = f"server {server!r} ({describe_target(target)})"
    async with connected(target, mode=mode, connect_timeout=connect_timeout, description=description) as client:
        async with Dispatcher() as dispatcher:
            try:
                entries = await dispatcher.add_mcp_server(server, client, trusted=trusted, domain=domain)
            except DispatcherError as exc:
                # Raised once the dispatcher is closed: its task group would wrap it in an exception group.
                failure = exc
        info = client.server_info
        protocol = client.protocol_version
    if failure is not None:
        raise failure
    tools, warnings = analyze(entries)
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
    )
