"""Workload 6, through MCP: workloads 1 and 3 against real MCP servers, over each transport.

Transports:

- in-process: an `MCPServer` defined here, connected with `mcp.Client(server)` (no framing, no I/O);
- stdio: the bundled example server, `python -m dispatcher.examples.workspace`, as a subprocess;
- streamable HTTP: the same example server with `--http` on 127.0.0.1, as a subprocess.

Every server offers `search_notes` (read-only) and `set_note` (mutating, idempotent), with every call
taking the server's latency: one server with zero latency for the overhead case, one with 20 ms for the
mixed turns. The dispatcher (default settings, the server registered as trusted so its annotations
count) is compared with the same calls made directly on the same `Client`:

- overhead: N zero-latency reads, the dispatcher against N concurrent `Client.call_tool` in one task
  group (the floor any MCP dispatcher pays);
- mixed turns: the seeded batches of workload 3, the dispatcher against direct `call_tool` with
  hand-written ordered barriers (the floor for running the batch safely), and against the ideal.

The dispatcher's added cost is (dispatcher / direct - 1) x 100%.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher import Dispatcher, ToolCall

from ._measure import Stat, interleave
from ._results import Comparison, Target, WorkloadResult
from ._tools import dispatch_once
from .mixed import Config as MixedConfig
from .mixed import batches_of, ideal_total, run_barriers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from ._report import Progress
    from .faults import Config as FaultsConfig

__all__ = ["FULL", "QUICK", "TRANSPORTS", "Config", "build_server", "run"]

TRANSPORTS = ("in-process", "stdio", "http")

DISPATCHER = "dispatcher"
DISPATCHER_UNLIMITED = "dispatcher, max_concurrency=None"
DIRECT = "direct concurrent call_tool"
DIRECT_LIMITED = "direct call_tool, 16 at a time"
DIRECT_BARRIERS = "direct call_tool, hand-written barriers"
IDEAL = "ideal (ordered barriers)"

READ = "search_notes"
WRITE = "set_note"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    transports: tuple[str, ...] = TRANSPORTS
    calls: int = 1000
    batches: int = 8
    size: int = 16
    latency: float = 0.020
    seed: int = 0
    repeat: int = 5
    backend: str = "asyncio"


FULL = Config()
QUICK = Config(calls=100, batches=1, repeat=2)


def build_server(latency: float) -> MCPServer[Any]:
    """An in-process server with an annotated read-only and a mutating tool, each taking `latency`."""
    server: MCPServer[Any] = MCPServer("bench")
    notes: dict[str, str] = {}

    async def search_notes(query: str) -> str:
        """The names of the notes containing the query."""
        await anyio.sleep(latency)
        return ", ".join(name for name, text in notes.items() if query in text)

    async def set_note(name: str, text: str) -> str:
        """Create or replace a note."""
        await anyio.sleep(latency)
        notes[name] = text
        return f"saved {name}"

    server.add_tool(
        search_notes, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False), structured_output=False
    )
    server.add_tool(
        set_note,
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
        ),
        structured_output=False,
    )
    return server


def _workspace_command(latency: float, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dispatcher.examples.workspace", "--latency", repr(latency), *extra]


@contextlib.asynccontextmanager
async def connect(transport: str, latency: float) -> AsyncIterator[Client]:
    """An entered client of a server with the given latency over `transport`."""
    if transport == "in-process":
        async with Client(build_server(latency)) as client:
            yield client
    elif transport == "stdio":
        command = _workspace_command(latency)
        params = StdioServerParameters(command=command[0], args=command[1:])
        with open(os.devnull, "w") as devnull:  # noqa: ASYNC230 - opening /dev/null does not block
            async with Client(stdio_client(params, errlog=devnull)) as client:
                yield client
    elif transport == "http":
        async with _http_server(latency) as url, Client(url) as client:
            yield client
    else:
        raise ValueError(f"unknown transport {transport!r}; choose from {', '.join(TRANSPORTS)}")


@contextlib.asynccontextmanager
async def _http_server(latency: float) -> AsyncIterator[str]:
    command = _workspace_command(latency, "--http", "--host", "127.0.0.1", "--port", "0")
    process = await anyio.open_process(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        buffer = b""
        with anyio.fail_after(30):
            while b"\n" not in buffer:
                chunk = await process.stdout.receive()
                buffer += chunk
        line = buffer.split(b"\n", 1)[0].decode().strip()
        if not line.startswith("MCP_URL="):
            raise RuntimeError(f"the example server printed {line!r} instead of its URL")
        yield line.removeprefix("MCP_URL=")
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            await process.aclose()


async def _measure_overhead(config: Config, transport: str, progress: Progress) -> dict[str, list[float]]:
    n = config.calls
    arguments = [{"query": f"q{i}"} for i in range(n)]
    calls = [ToolCall(f"c{i}", READ, args) for i, args in enumerate(arguments)]
    async with (
        connect(transport, 0.0) as client,
        Dispatcher() as dispatcher,
        Dispatcher(max_concurrency=None) as unlimited,
    ):
        await dispatcher.add_mcp_server("bench", client, trusted=True)
        await unlimited.add_mcp_server("bench", client, trusted=True)

        def direct(limit: float) -> Callable[[], Awaitable[float]]:
            async def run_direct() -> float:
                results: list[Any] = [None] * n
                limiter = anyio.CapacityLimiter(limit)

                async def one(i: int, args: dict[str, Any]) -> None:
                    async with limiter:
                        results[i] = await client.call_tool(READ, args)

                start = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for i, args in enumerate(arguments):
                        tg.start_soon(one, i, args)
                elapsed = time.perf_counter() - start
                assert not any(r.is_error for r in results)
                return elapsed

            return run_direct

        return await interleave(
            {
                DISPATCHER: dispatch_once(dispatcher, calls),
                DISPATCHER_UNLIMITED: dispatch_once(unlimited, calls),
                DIRECT: direct(math.inf),
                DIRECT_LIMITED: direct(16),
            },
            config.repeat,
            progress,
            label=f"{transport}: {n:,} zero-latency calls",
        )


async def _measure_mixed(config: Config, transport: str, progress: Progress) -> dict[str, list[float]]:
    sets = batches_of(mixed_config(config))
    calls = turn_calls(sets)
    async with connect(transport, config.latency) as client, Dispatcher() as dispatcher:
        await dispatcher.add_mcp_server("bench", client, trusted=True)

        async def run_dispatcher() -> float:
            start = time.perf_counter()
            for batch in calls:
                results = await dispatcher.dispatch(batch)
                assert all(r.ok for r in results), next(r for r in results if not r.ok)
            return time.perf_counter() - start

        async def run_direct_barriers() -> float:
            start = time.perf_counter()
            for exclusive in sets:
                results: list[Any] = [None] * len(exclusive)

                async def call(i: int, exclusive: Sequence[bool] = exclusive, results: list[Any] = results) -> None:
                    alone = exclusive[i]
                    results[i] = await client.call_tool(WRITE if alone else READ, _arguments(i, alone))

                await run_barriers(exclusive, call)
            return time.perf_counter() - start

        return await interleave(
            {DISPATCHER: run_dispatcher, DIRECT_BARRIERS: run_direct_barriers},
            config.repeat,
            progress,
            label=f"{transport}: mixed turns",
        )


def mixed_config(config: Config | FaultsConfig) -> MixedConfig:
    """The mixed turns (workload 3) of these batches, sizes, seed and latency."""
    return MixedConfig(batches=config.batches, size=config.size, seed=config.seed, latency=config.latency)


def turn_calls(sets: Sequence[Sequence[bool]]) -> list[list[ToolCall]]:
    """The ToolCalls of mixed turns on the MCP servers: `set_note` for an exclusive call, else `search_notes`."""
    return [
        [ToolCall(f"b{b}-{i}", WRITE if alone else READ, _arguments(i, alone)) for i, alone in enumerate(exclusive)]
        for b, exclusive in enumerate(sets)
    ]


def _arguments(i: int, alone: bool) -> dict[str, Any]:
    return {"name": f"n{i}", "text": f"text {i}"} if alone else {"query": f"q{i}"}


def _added_cost(what: str, samples: list[float], reference: str, references: list[float], detail: str) -> Target:
    """The target "at most 10% added cost": (median of samples / median of references - 1) x 100."""
    ratio = Stat.of(samples).median / Stat.of(references).median
    return Target(
        name=f"{what}: added cost over {reference} (%)",
        value=(ratio - 1) * 100,
        op="<=",
        threshold=10.0,
        detail=detail,
    )


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Measure the dispatcher's added cost over direct `call_tool` on each transport."""
    mixed = mixed_config(config)
    result = WorkloadResult(
        name="mcp",
        title=(
            f"6. Through MCP: {config.calls:,} zero-latency calls, and {config.batches} mixed turns of "
            f"{config.size} calls at {config.latency * 1000:g} ms, per transport"
        ),
        params={
            "transports": list(config.transports),
            "calls": config.calls,
            "batches": config.batches,
            "size": config.size,
            "latency_ms": config.latency * 1000,
            "seed": config.seed,
            "repeat": config.repeat,
            "backend": config.backend,
        },
    )
    # Constructing an MCPServer configures logging at INFO, and the HTTP client logs every request.
    for name in ("httpx", "httpx2", "mcp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    n = config.calls
    ideal_ms = ideal_total(mixed) * 1000
    for transport in config.transports:
        samples = anyio.run(_measure_overhead, config, transport, progress, backend=config.backend)
        us = {name: [s / n * 1e6 for s in values] for name, values in samples.items()}
        case = f"{transport}: {n:,} calls"
        for name, values in us.items():
            result.row(case, name, "us/call", values, note=f"{1e6 / Stat.of(values).median:,.0f} calls/s")
        for numerator, reference in (
            (DISPATCHER, DIRECT),
            (DISPATCHER, DIRECT_LIMITED),
            (DISPATCHER_UNLIMITED, DIRECT),
        ):
            result.comparisons.append(
                Comparison.paired(case, (numerator, us[numerator]), (reference, us[reference]), better="lower")
            )
        for numerator, reference, what in (
            (DISPATCHER, DIRECT, "default settings (at most 16 in flight) against all calls in flight"),
            (DISPATCHER_UNLIMITED, DIRECT, "equal concurrency: all calls in flight on both sides"),
        ):
            result.targets.append(
                _added_cost(
                    f"{transport}, zero-latency calls, {numerator}", us[numerator], reference, us[reference], what
                )
            )

        samples = anyio.run(_measure_mixed, config, transport, progress, backend=config.backend)
        ms = {name: [s * 1000 for s in values] for name, values in samples.items()}
        case = f"{transport}: mixed turns"
        for name, values in ms.items():
            result.row(case, name, "ms", values, note=f"{Stat.of(values).median / ideal_ms:.3f}x ideal")
        result.row(case, IDEAL, "ms", [ideal_ms])
        result.comparisons.append(
            Comparison.paired(
                case, (DISPATCHER, ms[DISPATCHER]), (DIRECT_BARRIERS, ms[DIRECT_BARRIERS]), better="lower"
            )
        )
        result.comparisons.append(
            Comparison.paired(
                case, (DISPATCHER, ms[DISPATCHER]), (IDEAL, [ideal_ms] * len(ms[DISPATCHER])), better="lower"
            )
        )
        result.targets.append(
            _added_cost(
                f"{transport}, mixed turns",
                ms[DISPATCHER],
                DIRECT_BARRIERS,
                ms[DIRECT_BARRIERS],
                f"dispatcher / {DIRECT_BARRIERS}, medians",
            )
        )
    return result
