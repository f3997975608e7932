"""`dispatcher inspect`: how the dispatcher would treat a server's tools, and what to worry about.

For each tool: the hints the server declares, the hints the dispatcher will act on under the chosen
trust, whether its calls run concurrently or exclusively, and whether they may be retried. Warnings
point at hints that contradict each other, names that model APIs reject, tools serialized only because
the server is untrusted, and a toolset that combines the three legs of the "lethal trifecta".

The analysis (`analyze`) is a pure function of catalogue entries; the command connects with
`Dispatcher.connect`, so names and trust are exactly what a dispatcher would use.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio
from mcp import StdioServerParameters

from ._annotations import effective_annotations
from ._catalog import NAME_PATTERN
from ._dispatcher import Dispatcher
from ._errors import DispatcherError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from mcp.server import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    from ._catalog import ToolEntry

__all__ = ["Finding", "Report", "ToolReport", "add_parser", "analyze", "inspect_server", "render_table"]

# (spec name, ToolAnnotations attribute, short column label)
_HINTS = (
    ("readOnlyHint", "read_only_hint", "ro"),
    ("destructiveHint", "destructive_hint", "de"),
    ("idempotentHint", "idempotent_hint", "id"),
    ("openWorldHint", "open_world_hint", "ow"),
)

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


@dataclass(frozen=True, slots=True)
class Report:
    """A server's tools as the dispatcher sees them, and the warnings about the toolset as a whole."""

    server: str
    target: str
    trusted: bool
    protocol: str | None
    tools: tuple[ToolReport, ...]
    warnings: tuple[Finding, ...]

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data (what `--json` prints)."""
        return {
            "server": self.server,
            "target": self.target,
            "trusted": self.trusted,
            "protocol": self.protocol,
            "tools": [
                {
                    "tool": tool.tool,
                    "name": tool.name,
                    "declared": tool.declared,
                    "effective": tool.effective,
                    "scheduling": tool.scheduling,
                    "retryable": tool.retryable,
                    "warnings": [{"code": w.code, "message": w.message} for w in tool.warnings],
                }
                for tool in self.tools
            ],
            "warnings": [{"code": w.code, "message": w.message} for w in self.warnings],
        }


def _hints(annotations: ToolAnnotations | None) -> dict[str, bool | None]:
    return {spec: getattr(annotations, attr) if annotations is not None else None for spec, attr, _ in _HINTS}


def _tool_findings(entry: ToolEntry) -> list[Finding]:
    findings: list[Finding] = []
    declared = entry.declared_annotations
    if declared is not None and declared.read_only_hint:
        for spec, attr, _ in _HINTS[1:3]:
            value = getattr(declared, attr)
            if value is not None:
                findings.append(
                    Finding(
                        "contradictory_hints",
                        f"readOnlyHint is true but {spec} is set ({str(value).lower()}): {spec} only means something "
                        "for tools that modify their environment",
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
    """The lethal trifecta, judged from the declared hints (spec defaults for missing ones)."""
    reads, ingests, writes = [], [], []
    for entry in entries:
        hints = effective_annotations(entry.declared_annotations, trusted=True)
        if hints.read_only_hint and not hints.open_world_hint:
            reads.append(entry.name)
        elif hints.read_only_hint:
            ingests.append(entry.name)
        elif hints.open_world_hint:
            writes.append(entry.name)
    if not (reads and ingests and writes):
        return None
    return Finding(
        "lethal_trifecta",
        f"lethal trifecta: these tools can read private data ({', '.join(reads)}), ingest open-world content "
        f"({', '.join(ingests)}) and write to the open world ({', '.join(writes)}); instructions injected into "
        "fetched content could make the model send private data out. Keep them out of one session, or ask "
        "for approval before the writes",
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
        )
        for entry in entries
    )
    trifecta = _trifecta(entries)
    return tools, (trifecta,) if trifecta is not None else ()


async def inspect_server(
    target: MCPServer[Any] | Server[Any] | StdioServerParameters | str,
    *,
    server: str = "server",
    trusted: bool = False,
    mode: Literal["auto", "legacy"] = "auto",
    connect_timeout: float | None = 30.0,
) -> Report:
    """Connect to a server the way a dispatcher would, and report on its tools.

    Raises:
        ServerConnectionError: The server could not be reached or listed.
        ConfigurationError: An argument is invalid.
    """
    failure: DispatcherError | None = None
    async with Dispatcher() as dispatcher:
        try:
            entries = await dispatcher.connect(
                server, target, trusted=trusted, mode=mode, follow_changes=False, connect_timeout=connect_timeout
            )
        except DispatcherError as exc:
            # Raised once the dispatcher is closed: its task group would wrap it in an exception group.
            failure = exc
        else:
            protocol = dispatcher._servers.protocol_version(server)
    if failure is not None:
        raise failure
    tools, warnings = analyze(entries)
    return Report(server, _describe_target(target), trusted, protocol, tools, warnings)


def _describe_target(target: object) -> str:
    if isinstance(target, StdioServerParameters):
        return shlex.join([target.command, *target.args])
    if isinstance(target, str):
        return target
    return f"in-process {type(target).__name__}"


def _flag(value: bool | None) -> str:
    return "-" if value is None else "T" if value else "F"


def render_table(report: Report) -> str:
    """The report as plain text for a terminal."""
    trust = "trusted" if report.trusted else "untrusted"
    lines = [f"server {report.server!r}: {report.target} ({trust}, protocol {report.protocol or 'unknown'})", ""]
    header = ("TOOL", "DECLARED", "EFFECTIVE", "SCHEDULING", "RETRYABLE")
    rows = [
        (
            tool.name,
            " ".join(_flag(v) for v in tool.declared.values()),
            " ".join(_flag(v) for v in tool.effective.values()),
            tool.scheduling,
            "yes" if tool.retryable else "no",
        )
        for tool in report.tools
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines.extend(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )
    lines.append("")
    lines.append("hints in order ro de id ow (readOnly, destructive, idempotent, openWorld): T true, F false, - unset")
    warnings = [(tool.name, w) for tool in report.tools for w in tool.warnings]
    warnings += [("toolset", w) for w in report.warnings]
    if warnings:
        lines.append("")
        lines.append(f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}:")
        lines.extend(f"  {where}: {w.message}" for where, w in warnings)
    else:
        lines.append("no warnings")
    return "\n".join(lines)


# The command ---------------------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the `inspect` subcommand."""
    parser = subparsers.add_parser(
        "inspect",
        help="show how the dispatcher would schedule an MCP server's tools, with warnings",
        description=(
            "Connect to an MCP server and list each tool's declared hints, the hints the dispatcher acts on "
            "under the chosen trust, how its calls are scheduled, whether they may be retried, and warnings."
        ),
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--stdio", metavar="CMD", help='launch the server as a subprocess, e.g. "npx -y some-server"')
    where.add_argument("--url", help="the URL of a streamable HTTP endpoint")
    parser.add_argument("--trusted", action="store_true", help="trust the server's annotations (default: untrusted)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")
    parser.add_argument("--mode", choices=("auto", "legacy"), default="auto", help="protocol negotiation")
    parser.add_argument("--name", default="server", help="the name to register the server under")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="set a variable for --stdio (repeatable)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds to connect and list tools")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    target: StdioServerParameters | str
    if args.stdio is not None:
        command = shlex.split(args.stdio)
        if not command:
            print("dispatcher inspect: --stdio needs a command", file=sys.stderr)
            return 2
        env: dict[str, str] = {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                print(f"dispatcher inspect: --env takes KEY=VALUE, got {item!r}", file=sys.stderr)
                return 2
            env[key] = value
        target = StdioServerParameters(command=command[0], args=command[1:], env=env or None)
    else:
        target = args.url
    run = functools.partial(
        inspect_server,
        target,
        server=args.name,
        trusted=args.trusted,
        mode=args.mode,
        connect_timeout=args.timeout if args.timeout > 0 else None,
    )
    try:
        report = anyio.run(run)
    except DispatcherError as exc:
        print(f"dispatcher inspect: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_json(), indent=2) if args.json else render_table(report))
    return 0
