"""Retry figures: success rate and attempts per call under injected faults, on a virtual clock.

`python -m benchmarks.retry_figures [--calls N] [--seed S]`

Every call goes through the real MCP SDK: an in-process `MCPServer` with one idempotent tool, wrapped by
`dispatcher.testing.inject_faults` (transient faults only: -32603, lost connection, hang), reached with
`mcp.Client` by a `Dispatcher` that trusts it. The calls are mutating, so they run one at a time, in
order; trio's `MockClock` makes the backoff waits and the per-attempt timeouts (a hang costs one
`call_timeout`) virtual, so the run takes seconds of real time.

Scenarios: a 30% fault rate and a full outage, each with the default `RetryPolicy`, without a retry
budget, and without retries. Attempts are counted by the server's ledger (every execution that reached
the tool), and checked against the results' `attempts`.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from trio.testing import MockClock

from dispatcher import Dispatcher, RetryPolicy, ToolCall
from dispatcher.testing import inject_faults

if TYPE_CHECKING:
    from collections.abc import Sequence

    from dispatcher.testing import FaultKind

__all__ = ["Figures", "main", "measure"]

TRANSIENT: tuple[FaultKind, ...] = ("error", "drop", "hang")
_BATCH = 100


@dataclass(frozen=True, slots=True)
class Figures:
    """What one scenario measured."""

    calls: int
    ok: int
    attempts: int

    @property
    def success_rate(self) -> float:
        """The share of calls that came back OK."""
        return self.ok / self.calls

    @property
    def attempts_per_call(self) -> float:
        """Executions that reached the tool, per call."""
        return self.attempts / self.calls


def _server() -> MCPServer:
    server = MCPServer("store")

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
    async def put(key: str) -> str:
        """Store a key (idempotent)."""
        return key

    return server


async def measure(
    *,
    calls: int,
    rate: float,
    seed: int,
    retry: RetryPolicy | None,
    kinds: tuple[FaultKind, ...] = TRANSIENT,
    call_timeout: float = 1.0,
) -> Figures:
    """Dispatch `calls` calls of an idempotent tool with `rate` transient faults; count what happened."""
    server = _server()
    faults = inject_faults(server, rate=rate, seed=seed, kinds=kinds, strike="either")
    ok = attempts = 0
    async with Client(server) as client, Dispatcher(call_timeout=call_timeout, retry=retry) as dispatcher:
        await dispatcher.add_mcp_server("store", client, trusted=True)
        for start in range(0, calls, _BATCH):
            batch = [ToolCall(str(i), "put", {"key": str(i)}) for i in range(start, min(calls, start + _BATCH))]
            for result in await dispatcher.dispatch(batch):
                ok += result.ok
                attempts += result.attempts
    if attempts != len(faults.ledger):
        raise AssertionError(f"results count {attempts} attempts, the server saw {len(faults.ledger)}")
    return Figures(calls, ok, attempts)


SCENARIOS: list[tuple[str, float, RetryPolicy | None]] = [
    ("30% faults, RetryPolicy()", 0.3, RetryPolicy()),
    ("30% faults, RetryPolicy(budget=None)", 0.3, RetryPolicy(budget=None)),
    ("30% faults, retry=None", 0.3, None),
    ("100% outage, RetryPolicy()", 1.0, RetryPolicy()),
    ("100% outage, RetryPolicy(budget=None)", 1.0, RetryPolicy(budget=None)),
]


async def _run(calls: int, seed: int) -> None:
    console = Console(highlight=False)
    console.print(f"{calls} calls per scenario, fault kinds {', '.join(TRANSIENT)}, fault seed {seed}", markup=False)
    table = Table("scenario", "success", "attempts/call", box=box.SIMPLE_HEAD)
    table.columns[1].justify = table.columns[2].justify = "right"
    for name, rate, policy in SCENARIOS:
        figures = await measure(calls=calls, rate=rate, seed=seed, retry=policy)
        table.add_row(escape(name), f"{figures.success_rate:.2%}", f"{figures.attempts_per_call:.3f}")
    console.print(table)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the figures of every scenario."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retry_figures", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls per scenario (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="fault seed (default: %(default)s)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    anyio.run(_run, args.calls, args.seed, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})
    print(f"({time.perf_counter() - started:.1f} s of real time)")


if __name__ == "__main__":
    main()
