"""`dispatcher inspect`: its options, and printing the report from them."""

from __future__ import annotations

import functools
import json
import pathlib
import sys
from typing import TYPE_CHECKING

import anyio

from dispatcher._core._errors import ConfigurationError, DispatcherError

from ._inspect import Pinned, inspect_server, load_pins
from ._present import inspect_lines, print_lines
from ._targets import add_target_options, parse_overrides, target_from_args

if TYPE_CHECKING:
    import argparse

__all__ = ["add_parser"]


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
    add_target_options(parser)
    parser.add_argument(
        "--domain",
        help="register the server with this conflict-key domain (docs/conflicts.md): its writes then wait only "
        "for calls in the same domain; by default every call is on the root key",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")
    parser.add_argument(
        "--full", action="store_true", help="show every description and schema whole (they are shortened by default)"
    )
    parser.add_argument(
        "--pins",
        metavar="FILE",
        help="compare the tools with earlier pins: a JSON file saved from Dispatcher.export_pins(), or an earlier "
        "inspect --json report (which also says what changed); exit 3 when a tool changed, is new or is gone",
    )
    parser.set_defaults(handler=_run)


def _pins(args: argparse.Namespace) -> Pinned | None:
    if args.pins is None:
        return None
    path = pathlib.Path(args.pins)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"--pins: cannot read {args.pins}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigurationError(f"--pins: {args.pins} is not JSON ({exc})") from exc
    return load_pins(data, server=args.name, source=args.pins)


def _run(args: argparse.Namespace) -> int:
    pins = _pins(args)
    overrides = parse_overrides(args.override)
    target = target_from_args(args)
    with target.connect(mode=args.mode) as (connect_to, where_to_look):
        run = functools.partial(
            inspect_server,
            connect_to,
            server=args.name,
            trusted=args.trusted,
            domain=args.domain,
            mode=args.mode,
            connect_timeout=args.timeout if args.timeout > 0 else None,
            pins=pins,
            overrides=overrides,
        )
        try:
            report = anyio.run(run)
        except ConfigurationError:
            raise
        except DispatcherError as exc:
            print(f"dispatcher inspect: {exc}", file=sys.stderr)
            hint = where_to_look()
            if hint:
                print(hint, file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print_lines(inspect_lines(report, full=args.full), sys.stdout)
    return 3 if report.differs else 0
