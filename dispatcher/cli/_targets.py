"""The server-target options that `inspect` and `tune` share, and the connection they describe.

``--stdio CMD`` (split like a shell would, with ``--env KEY=VALUE`` for its environment) or ``--url URL``;
``--trusted``, ``--override TOOL=HINTS`` (your own annotations for a tool, `parse_overrides`),
``--mode``, ``--name``, ``--timeout``; and ``--server-log PATH``, where a stdio server's
stderr goes. By default the stderr is kept out of the terminal (servers can log thousands of lines
during a sweep) in a temporary file, whose last lines are shown if the command fails.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import ToolAnnotations

from dispatcher._core._annotations import HINTS

from .._core._errors import UsageError
from ._present import clean

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator

__all__ = ["ServerTarget", "UsageError", "add_target_options", "parse_overrides", "target_from_args"]

# Each hint by the names a user may type for it: "readOnly", "readOnlyHint", "read_only", any case.
_HINT_NAMES = {
    name.lower(): attr
    for spec, attr in HINTS
    for name in (spec, spec.removesuffix("Hint"), attr, attr.removesuffix("_hint"))
}

_TAIL = 5


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """Add the options that name a server and how to connect to it."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--stdio",
        metavar="CMD",
        help='launch the server as a subprocess, e.g. "npx -y some-server" (split as a shell would)',
    )
    where.add_argument("--url", help="the URL of a streamable HTTP endpoint")
    parser.add_argument("--trusted", action="store_true", help="trust the server's annotations (default: untrusted)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="TOOL=HINTS",
        help="your own annotations for a tool, trusted even for an untrusted server, e.g. "
        "search=readOnly,idempotent or delete=!idempotent (repeatable): add_mcp_server(overrides=...)",
    )
    conn = parser.add_argument_group("connection")
    conn.add_argument("--mode", choices=("auto", "legacy"), default="auto", help="protocol negotiation")
    conn.add_argument("--name", default="server", help="the name to register the server under")
    conn.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="for --stdio (repeatable)")
    conn.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds to connect (default 30)")
    conn.add_argument(
        "--server-log",
        type=Path,
        metavar="PATH",
        help="append the --stdio server's stderr to PATH (default: kept out of the terminal, and its last "
        "lines shown if the command fails)",
    )


def parse_overrides(items: list[str]) -> dict[str, ToolAnnotations]:
    """``TOOL=HINTS`` items as `add_mcp_server`'s overrides: ``search=readOnly,idempotent``.

    Each hint is named as the spec names it, with or without "Hint" (``readOnly``, ``openWorldHint``, or
    ``read_only``), set true as it is, false with a ``!`` before it or ``=false`` after it
    (``!openWorld``, ``destructive=false``). Hints left out fall back to the server's (if trusted) or
    the spec's defaults, as in code. A tool given twice is a mistake.

    Raises:
        UsageError: An item is not ``TOOL=HINTS``, names an unknown hint, or repeats a tool.
    """
    overrides: dict[str, ToolAnnotations] = {}
    for item in items:
        tool, sep, hints = item.partition("=")
        tool = tool.strip()
        if not sep or not tool or not hints.strip():
            raise UsageError(f"--override takes TOOL=HINTS, e.g. search=readOnly,idempotent; got {item!r}")
        if tool in overrides:
            raise UsageError(f"--override gives {tool!r} twice; put its hints in one item, separated by commas")
        values: dict[str, bool] = {}
        for raw in hints.split(","):
            word = raw.strip()
            value = True
            if word.startswith("!"):
                word, value = word[1:].strip(), False
            name, eq, setting = word.partition("=")
            if eq:
                if setting.strip().lower() not in ("true", "false"):
                    raise UsageError(f"--override {tool}: {raw.strip()!r} must be true or false")
                value = value and setting.strip().lower() == "true"
            attr = _HINT_NAMES.get(name.strip().lower())
            if attr is None:
                raise UsageError(
                    f"--override {tool}: unknown hint {name.strip()!r}; the hints are readOnly, destructive, "
                    "idempotent and openWorld (false with a ! before it)"
                )
            values[attr] = value
        overrides[tool] = ToolAnnotations.model_validate(values)
    return overrides


@dataclass(frozen=True, slots=True)
class ServerTarget:
    """A server named on the command line.

    Attributes:
        stdio: The subprocess to launch, or None for `url`.
        url: The streamable HTTP endpoint, or None for `stdio`.
        log: Where the subprocess's stderr goes, or None for a temporary file.
    """

    stdio: StdioServerParameters | None
    url: str | None
    log: Path | None

    @property
    def description(self) -> str:
        """The target for people."""
        if self.stdio is not None:
            return shlex.join([self.stdio.command, *self.stdio.args])
        return str(self.url)

    @contextlib.contextmanager
    def connect(
        self, *, mode: Literal["auto", "legacy"]
    ) -> Iterator[tuple[Callable[[], Client] | str, Callable[[], str]]]:
        """What to connect to, and a function that says where to look when the server failed.

        A stdio server's stderr goes to the log file (opened here, closed on exit) instead of the
        terminal. The second function returns a sentence: the path of the log, or the last lines of
        the temporary one; "" when there is nothing to show.
        """
        if self.stdio is None:
            yield str(self.url), lambda: ""
            return
        params = self.stdio
        with contextlib.ExitStack() as stack:
            if self.log is not None:
                try:
                    log: TextIO = stack.enter_context(self.log.open("a", encoding="utf-8"))
                except OSError as exc:
                    raise UsageError(f"cannot open the server log: {exc}") from None
            else:
                log = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))

            yield _Launch(params, log, mode, self.description), lambda: self._where_to_look(log)

    def _where_to_look(self, log: TextIO) -> str:
        if self.log is not None:
            return f"the server's stderr is in {self.log}"
        try:
            log.flush()
            log.seek(0)
            lines = [line.rstrip() for line in log.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        if not lines:
            return ""
        tail = "\n".join(f"  {clean(line)[:300]}" for line in lines[-_TAIL:])
        return f"the server's stderr ended with (--server-log PATH keeps all of it):\n{tail}{self._module_hint(lines)}"

    def _module_hint(self, lines: list[str]) -> str:
        # A bare `python` is whichever comes first on PATH, often not the venv that has the server's packages.
        program = self.stdio.command if self.stdio is not None else ""
        if "/" in program or not any("No module named" in line for line in lines[-_TAIL:]):
            return ""
        where = shutil.which(program) or "not found on PATH"
        return (
            f"\nhint: {program!r} ran as {where}, the first on PATH; a missing module means that Python lacks the "
            f"server's packages (or the name is misspelled): activate the venv that has them, or give the "
            f"interpreter's full path, e.g. --stdio {shlex.quote(sys.executable + ' -m my_server')}"
        )


@dataclass(frozen=True, slots=True)
class _Launch:
    """A client factory that launches a stdio server with its stderr sent to `log`."""

    params: StdioServerParameters
    log: TextIO
    mode: Literal["auto", "legacy"]
    description: str

    def __call__(self) -> Client:
        return Client(stdio_client(self.params, errlog=self.log), mode=self.mode)


def target_from_args(args: argparse.Namespace) -> ServerTarget:
    """The server the parsed options name.

    Raises:
        UsageError: An empty or unbalanced --stdio command, a malformed --env, --server-log with --url.
    """
    if args.stdio is None:
        if args.env:
            raise UsageError("--env applies to --stdio servers only")
        if args.server_log is not None:
            raise UsageError("--server-log applies to --stdio servers only")
        return ServerTarget(None, args.url, None)
    try:
        command = shlex.split(args.stdio)
    except ValueError as exc:
        raise UsageError(f"--stdio {args.stdio!r} cannot be split into a command: {exc}") from None
    if not command:
        raise UsageError("--stdio needs a command")
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {item!r}")
        env[key] = value
    params = StdioServerParameters(command=command[0], args=command[1:], env=env or None)
    return ServerTarget(params, None, args.server_log)
