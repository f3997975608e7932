"""The `dispatcher` command line: a small dispatcher of subcommands, argparse only.

Each subcommand lives in a module of its own and registers itself with an `add_parser(subparsers)`
function that adds its parser and sets ``handler=``: a function that takes the parsed arguments and
returns the exit status. To add a subcommand, write that function and list it in `_COMMANDS`.

Exit statuses: 0 success, 1 the command failed (the reason is on stderr), 2 usage error (one line on
stderr), 130 interrupted (Ctrl-C). Output cut short by its reader (``dispatcher inspect ... | head``)
ends the command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING

from dispatcher import __version__
from dispatcher._core._errors import ConfigurationError

from ._inspect_command import add_parser as add_inspect
from ._present import INSTALL_HINT, clean, require_rich
from ._targets import UsageError
from ._tune_command import add_parser as add_tune

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = ["build_parser", "main"]

_COMMANDS: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    add_inspect,
    add_tune,
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the whole command line, with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="dispatcher",
        description="Tools for dispatcher, the annotation-aware scheduler of MCP tool calls.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.set_defaults(handler=None)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    for add in _COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: The arguments without the program name; None reads `sys.argv`.

    Returns:
        The exit status.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.handler is None:
        parser.print_help()
        return 2
    try:
        require_rich()
    except ModuleNotFoundError:
        print(f"dispatcher {args.command}: {INSTALL_HINT}", file=sys.stderr)
        return 1
    try:
        with _sdk_log_lines(f"dispatcher {args.command}"):
            status: int = args.handler(args)
        sys.stdout.flush()
    except (UsageError, ConfigurationError) as exc:
        print(f"dispatcher {args.command}: {clean(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: the user knows why; a traceback would only bury the last progress line.
        print(f"dispatcher {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader stopped reading (`| head`): nothing more to say, and nothing left to flush at exit.
        _silence_stdout()
        return 1
    return status


class _OneLine(logging.Handler):
    """The MCP SDK's log records as one escaped line each, without the traceback, at most `limit` of them.

    The SDK logs a line a server wrote to stdout that is not JSON-RPC (a server's banner, a stray print)
    with its traceback; without a handler, Python's last resort printed that traceback over the progress.
    """

    def __init__(self, prefix: str, limit: int = 5) -> None:
        super().__init__(logging.WARNING)
        self.prefix = prefix
        self.limit = limit
        self.shown = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.shown += 1
        if self.shown > self.limit:
            if self.shown == self.limit + 1:
                print(f"{self.prefix}: (more messages of the MCP client not shown)", file=sys.stderr)
            return
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            detail = str(record.exc_info[1]).strip().splitlines()
            text += f": {' / '.join(line.strip() for line in detail[:2])}" if detail else ""
        print(f"{self.prefix}: {clean(text)[:300]}", file=sys.stderr)


@contextlib.contextmanager
def _sdk_log_lines(prefix: str) -> Iterator[None]:
    """While a command runs, the `mcp` logger's warnings and errors go to `_OneLine`, not to the last resort."""
    logger = logging.getLogger("mcp")
    handler = _OneLine(prefix)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
