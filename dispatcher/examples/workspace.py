"""Run the example workspace server as a process: `python -m dispatcher.examples.workspace`.

Over stdio (the default), an MCP client launches it as a subprocess::

    python -m dispatcher.examples.workspace --latency 0.05 --saturation 4

Over streamable HTTP it prints its URL on one line of stdout (`MCP_URL=http://127.0.0.1:PORT/mcp`),
so a parent process can start it on a free port with `--port 0` and read where to connect::

    python -m dispatcher.examples.workspace --http --port 0 --fault-rate 0.2 --fault-seed 7

It serves until SIGINT or SIGTERM. To test how clients survive a crashed server, `--exit-after N` makes
the process exit abruptly (status 3, no reply) when its N-th `tools/call` request arrives, and
`--ledger PATH` appends a JSON line to PATH as each tool call starts and ends (written at once, so the
record survives a `kill -9`): a test can count what ran, even across restarts of the process.

The library's names are importable from here too.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio
from mcp.shared.exceptions import MCPError

from dispatcher.testing import FencedResource

from ._http import serve_http
from ._ledger import ToolRun
from ._models import FaultConfig, saturated_latency
from ._workspace import Workspace

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

__all__ = [
    "FaultConfig",
    "ToolRun",
    "Workspace",
    "main",
    "saturated_latency",
    "serve_http",
]


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve the workspace until told to stop.

    Args:
        argv: The arguments, without the program name; `None` reads `sys.argv`.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        # Built even at rate 0, so a misspelt tool or kind is reported rather than ignored.
        faults = FaultConfig(
            rate=args.fault_rate,
            seed=args.fault_seed,
            tools=None if args.fault_tools is None else frozenset(_split(args.fault_tools)),
            kinds=tuple(_split(args.fault_kinds)),  # type: ignore[arg-type]  # checked by FaultConfig
            strike=args.fault_strike,
        )
        workspace = Workspace(
            root=args.root,
            latency=args.latency,
            saturation=args.saturation,
            faults=faults,
            name=args.name,
            fence=args.fence,
            idempotency_key=args.idempotency_key,
            uncancellable=args.uncancellable,
        )
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if args.exit_after is not None:
        if args.exit_after < 1:
            parser.error(f"--exit-after must be >= 1, got {args.exit_after}")
        workspace.server.middleware.append(_ExitAfter(args.exit_after))
    if args.ledger is not None:
        workspace.server.middleware.append(_LedgerFile(args.ledger))
    if args.http:
        anyio.run(_serve_http_until_signalled, workspace, args.host, args.port)
    else:
        anyio.run(workspace.server.run_stdio_async)


async def _serve_http_until_signalled(workspace: Workspace, host: str, port: int) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with serve_http(workspace.server, host, port) as url:
            print(f"MCP_URL={url}", flush=True)
            async for _ in signals:
                break


class _ExitAfter:
    """Middleware that ends the process without a word when the n-th tool call arrives: a crash."""

    def __init__(self, calls: int) -> None:
        self.remaining = calls

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "tools/call":
            self.remaining -= 1
            if self.remaining == 0:
                os._exit(3)
        return await call_next(ctx)


class _LedgerFile:
    """Middleware that appends a JSON line to a file as each tool call starts and as it ends.

    Lines are ``{"event": "start", "pid", "at", "seq", "tool", "arguments"}`` and ``{"event": "end", "pid",
    "at", "seq", "outcome"}`` (``at``: `time.monotonic()`, one clock for every process of the machine on
    Linux), where outcome is ``ok``, ``tool_error``, ``error``, ``cancelled`` or ``fenced`` (a
    write the fenced mode refused as it took effect). Each is one
    unbuffered append, so a killed process leaves every line it wrote, and restarts may share a file.
    """

    def __init__(self, path: pathlib.Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._seq = 0

    def _write(self, record: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps({**record, "pid": os.getpid(), "at": time.monotonic()}) + "\n").encode())

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params
        if ctx.method != "tools/call" or not isinstance(params, dict):
            return await call_next(ctx)
        seq, self._seq = self._seq, self._seq + 1
        self._write({"event": "start", "seq": seq, "tool": params.get("name"), "arguments": params.get("arguments")})
        outcome = "error"
        try:
            result = await call_next(ctx)
            is_error = result.get("isError") if isinstance(result, dict) else getattr(result, "is_error", False)
            outcome = "tool_error" if is_error else "ok"
            return result
        except anyio.get_cancelled_exc_class():
            outcome = "cancelled"
            raise
        except MCPError as exc:
            if exc.error.code == FencedResource.code:
                outcome = "fenced"  # refused as it took effect: it changed nothing
            raise
        finally:
            self._write({"event": "end", "seq": seq, "outcome": outcome})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dispatcher.examples.workspace",
        description="The dispatcher example workspace: a notes MCP server with honest tool annotations.",
    )
    parser.add_argument("--root", type=pathlib.Path, help="mirror the notes to this folder")
    parser.add_argument("--name", default="workspace", help="the server name announced to clients")
    parser.add_argument("--latency", type=float, default=0.0, metavar="S", help="seconds per tool call")
    parser.add_argument("--saturation", type=int, metavar="N", help="concurrent calls at which latency starts to grow")
    faults = parser.add_argument_group("fault injection")
    faults.add_argument("--fault-rate", type=float, default=0.0, metavar="R", help="probability 0..1")
    faults.add_argument("--fault-seed", type=int, default=0, metavar="S")
    faults.add_argument("--fault-tools", metavar="A,B", help="tools that may fail (default: all)")
    faults.add_argument(
        "--fault-kinds", default="error", metavar="K,L", help="of hang, drop, error, tool_error, crash (default: error)"
    )
    faults.add_argument(
        "--fault-strike",
        default="before",
        choices=("before", "after", "either"),
        help="before the tool runs, or after (its answer lost); default: before",
    )
    parser.add_argument(
        "--idempotency-key",
        metavar="ARG",
        help="the writes take an idempotency key in this argument, and a repeated key replays the first outcome",
    )
    faults.add_argument("--exit-after", type=int, metavar="N", help="exit abruptly on the N-th tool call (a crash)")
    parser.add_argument(
        "--fence", metavar="META", help="fenced mode: refuse writes whose fencing token (this _meta entry) is stale"
    )
    parser.add_argument(
        "--uncancellable", action="store_true", help="calls run to their end, even cancelled or with their client gone"
    )
    faults.add_argument("--ledger", type=pathlib.Path, metavar="PATH", help="append a JSON line per tool call to PATH")
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (the default)")
    transport.add_argument("--http", action="store_true", help="serve over streamable HTTP")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port, 0 for a free one (default: 8000)")
    return parser


def _split(names: str) -> list[str]:
    return [name.strip() for name in names.split(",") if name.strip()]


if __name__ == "__main__":
    main(sys.argv[1:])
