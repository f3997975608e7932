"""Workload 6, through MCP: the dispatcher against direct `call_tool` at the same concurrency, per transport.

Transports:

- in-process: an `MCPServer` defined here, connected with `mcp.Client(server)` (no framing, no I/O);
- stdio: the bundled example server, `python -m dispatcher.examples.workspace`, as a subprocess;
- streamable HTTP: the same example server with `--http` on 127.0.0.1, as a subprocess.

Every server offers `search_notes` (read-only) and `set_note` (mutating, idempotent), with every call
taking the server's latency: one server with zero latency for the overhead case, one with 20 ms for the
limit and mixed cases. The dispatcher (the server registered as trusted so its annotations count) is
compared with the same calls made directly on the same `Client`, always at the same concurrency, so that
what a ratio shows is the dispatcher's cost and never the effect of a different number of calls in flight:

- overhead: 1,000 zero-latency reads. The dispatcher with its default limit (16 in flight) against 16
  direct `call_tool` workers taking the calls in turn (the cheapest way to keep 16 in flight), and the
  dispatcher with `max_concurrency=None` against one task per direct `call_tool` (all in flight).
  Target 6: each ratio <= 1.05 (median of the paired ratios), on every transport and both backends.
  For information, the 16 direct workers again with the SDK's `read_timeout_seconds=60` (the
  dispatcher bounds every call by its default `call_timeout=60`; a deadline on every call has a cost
  of its own, which this reference pays too);
- the default limit: 64 reads of 20 ms. The dispatcher with its default limit and with
  `max_concurrency=None`, against direct calls all 64 in flight (what a peer that runs every call at
  once does) and 16 in flight. This shows what the deliberate default costs a wide turn; no target;
- mixed turns: the seeded batches of workload 3 (at most 16 calls, so the default limit never binds), the
  dispatcher against direct `call_tool` with hand-written ordered barriers (the floor for running the
  batch safely), and against the ideal. Target: ratio <= 1.05.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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

# The dispatcher's default limit, which the references at the same concurrency copy.
DEFAULT_LIMIT = 16
THRESHOLD = 1.05
# The dispatcher's default call timeout, which one informational reference copies.
CALL_TIMEOUT = 60.0

DISPATCHER = "dispatcher, default (16)"
DISPATCHER_UNLIMITED = "dispatcher, max_concurrency=None"
DIRECT = "direct call_tool, all in flight"
DIRECT_LIMITED = "direct call_tool, 16 in flight"
DIRECT_LIMITED_TIMEOUT = "direct call_tool, 16 in flight, 60 s timeout"
DIRECT_BARRIERS = "direct call_tool, barriers"
IDEAL = "ideal (ordered barriers)"

T = TypeVar("T")

READ = "search_notes"
WRITE = "set_note"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    transports: tuple[str, ...] = TRANSPORTS
    backends: tuple[str, ...] = ("asyncio", "trio")
    calls: int = 1000
    # The default-limit case: this many reads of `latency` in one batch.
    wide: int = 64
    batches: int = 8
    size: int = 16
    latency: float = 0.020
    seed: int = 0
    # Repetitions of the overhead and default-limit cases; the mixed turns (about 1.4 s a repetition
    # per variant) run min(repeat, turn_repeat), their ratio being steady within a percent.
    repeat: int = 10
    turn_repeat: int = 5


FULL = Config()
# CI: figures only (the quick run gives no verdicts), on one backend, small enough to take seconds.
QUICK = Config(backends=("asyncio",), calls=100, batches=1, repeat=3, turn_repeat=2)


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


def _direct(
    client: Client, arguments: list[dict[str, Any]], limit: int | None, timeout: float | None = None
) -> Callable[[], Awaitable[float]]:
    """A variant making the reads directly on `client`: `limit` workers taking the calls in turn, or one
    task per call (all in flight) when `limit` is None; each call bounded by `timeout` seconds (the SDK's
    `read_timeout_seconds`) if given. It returns the seconds the calls took."""
    n = len(arguments)

    async def run_direct() -> float:
        results: list[Any] = [None] * n
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            if limit is None:

                async def one(i: int) -> None:
                    results[i] = await client.call_tool(READ, arguments[i])

                for i in range(n):
                    tg.start_soon(one, i)
            else:
                indices = iter(range(n))

                async def worker() -> None:
                    for i in indices:
                        results[i] = await client.call_tool(READ, arguments[i], timeout)

                for _ in range(min(limit, n)):
                    tg.start_soon(worker)
        elapsed = time.perf_counter() - start
        assert all(r is not None and not r.is_error for r in results), next(
            (r for r in results if r is None or r.is_error), None
        )
        return elapsed

    return run_direct


def _reads(n: int) -> tuple[list[ToolCall], list[dict[str, Any]]]:
    arguments = [{"query": f"q{i}"} for i in range(n)]
    return [ToolCall(f"c{i}", READ, args) for i, args in enumerate(arguments)], arguments


async def _measure_overhead(config: Config, transport: str, backend: str, progress: Progress) -> dict[str, list[float]]:
    calls, arguments = _reads(config.calls)
    async with (
        connect(transport, 0.0) as client,
        Dispatcher() as dispatcher,
        Dispatcher(max_concurrency=None) as unlimited,
    ):
        await dispatcher.add_mcp_server("bench", client, trusted=True)
        await unlimited.add_mcp_server("bench", client, trusted=True)
        return await interleave(
            {
                DISPATCHER: dispatch_once(dispatcher, calls),
                DIRECT_LIMITED: _direct(client, arguments, DEFAULT_LIMIT),
                DISPATCHER_UNLIMITED: dispatch_once(unlimited, calls),
                DIRECT: _direct(client, arguments, None),
                # Information: the same 16 workers with the dispatcher's default call timeout (60 s).
                DIRECT_LIMITED_TIMEOUT: _direct(client, arguments, DEFAULT_LIMIT, CALL_TIMEOUT),
            },
            config.repeat,
            progress,
            label=f"{backend}, {transport}: {config.calls:,} zero-latency calls",
        )


async def _measure_latency(
    config: Config, transport: str, backend: str, progress: Progress
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The default-limit case and the mixed turns, on one server of `config.latency`."""
    wide_calls, wide_arguments = _reads(config.wide)
    sets = batches_of(mixed_config(config))
    calls = turn_calls(sets)
    async with (
        connect(transport, config.latency) as client,
        Dispatcher() as dispatcher,
        Dispatcher(max_concurrency=None) as unlimited,
    ):
        await dispatcher.add_mcp_server("bench", client, trusted=True)
        await unlimited.add_mcp_server("bench", client, trusted=True)
        wide = await interleave(
            {
                DISPATCHER: dispatch_once(dispatcher, wide_calls),
                DISPATCHER_UNLIMITED: dispatch_once(unlimited, wide_calls),
                DIRECT: _direct(client, wide_arguments, None),
                DIRECT_LIMITED: _direct(client, wide_arguments, DEFAULT_LIMIT),
            },
            config.repeat,
            progress,
            label=f"{backend}, {transport}: {config.wide} reads of {config.latency * 1000:g} ms",
        )

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

        turns = await interleave(
            {DISPATCHER: run_dispatcher, DIRECT_BARRIERS: run_direct_barriers},
            min(config.repeat, config.turn_repeat),
            progress,
            label=f"{backend}, {transport}: mixed turns",
        )
        return wide, turns


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


def _measured(
    result: WorkloadResult,
    progress: Progress,
    where: str,
    measure: Callable[[Config, str, str, Progress], Awaitable[T]],
    config: Config,
    transport: str,
    backend: str,
) -> T | None:
    """Run one measurement on its backend; if it fails (a server dies, a connection breaks on a loaded
    machine), say so in the results and go on with the next, so that one transport never loses the run."""
    try:
        return anyio.run(measure, config, transport, backend, progress, backend=backend)
    except Exception as exc:
        leaves = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
        why = "; ".join(f"{type(leaf).__name__}: {leaf}" for leaf in leaves)
        message = f"{where}: {measure.__name__.removeprefix('_measure_')} case failed, no figures: {why}"
        result.notes.append(message)
        progress.note(message)
        return None


def _target(name: str, comparison: Comparison, detail: str, *, full: str | None = None) -> Target:
    """Target 6: the median of the paired ratios at most 1.05, with their spread.

    `full` is the target's name in the full run, when this run's sizes make the name differ.
    """
    ratio = comparison.ratio
    return Target(
        name=name,
        value=ratio.median,
        op="<=",
        threshold=THRESHOLD,
        detail=f"IQR {ratio.q1:.3f}-{ratio.q3:.3f}, min-max {ratio.min:.3f}-{ratio.max:.3f}, n={ratio.n}; {detail}",
        spread=ratio,
        key=full if full != name else None,
    )


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Measure the dispatcher against direct `call_tool` at the same concurrency, per transport and backend."""
    mixed = mixed_config(config)
    result = WorkloadResult(
        name="mcp",
        title=(
            f"6. Through MCP: {config.calls:,} zero-latency calls, {config.wide} reads of "
            f"{config.latency * 1000:g} ms, and {config.batches} mixed turns of {config.size} calls, per transport"
        ),
        params={
            "transports": list(config.transports),
            "backends": list(config.backends),
            "calls": config.calls,
            "wide": config.wide,
            "batches": config.batches,
            "size": config.size,
            "latency_ms": config.latency * 1000,
            "seed": config.seed,
            "repeat": config.repeat,
            "turn_repeat": min(config.repeat, config.turn_repeat),
        },
    )
    # Constructing an MCPServer configures logging at INFO, and the HTTP client logs every request.
    for name in ("httpx", "httpx2", "mcp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    n = config.calls
    ideal_ms = ideal_total(mixed) * 1000
    for backend in config.backends:
        for transport in config.transports:
            where = f"{backend}, {transport}"
            samples = _measured(result, progress, where, _measure_overhead, config, transport, backend)
            if samples is not None:
                us = {name: [s / n * 1e6 for s in values] for name, values in samples.items()}
                case = f"{where}: {n:,} calls"
                for name, values in us.items():
                    result.row(case, name, "us/call", values, note=f"{1e6 / Stat.of(values).median:,.0f} calls/s")
                same_default = Comparison.paired(
                    case, (DISPATCHER, us[DISPATCHER]), (DIRECT_LIMITED, us[DIRECT_LIMITED]), better="lower"
                )
                same_unlimited = Comparison.paired(
                    case, (DISPATCHER_UNLIMITED, us[DISPATCHER_UNLIMITED]), (DIRECT, us[DIRECT]), better="lower"
                )
                # Not a target: it mixes the dispatcher's cost with the effect of its limit.
                cap = Comparison.paired(case, (DISPATCHER, us[DISPATCHER]), (DIRECT, us[DIRECT]), better="lower")
                # Not a target: the reference also pays for a deadline on every call, as the dispatcher does.
                timed = Comparison.paired(
                    case,
                    (DISPATCHER, us[DISPATCHER]),
                    (DIRECT_LIMITED_TIMEOUT, us[DIRECT_LIMITED_TIMEOUT]),
                    better="lower",
                )
                result.comparisons.extend((same_default, same_unlimited, cap, timed))
                for comparison, flight, detail in (
                    (same_default, "16 in flight", "default settings"),
                    (same_unlimited, "all in flight", "max_concurrency=None"),
                ):
                    result.targets.append(
                        _target(
                            f"{where}, {n:,} calls, {flight}",
                            comparison,
                            detail,
                            full=f"{where}, {FULL.calls:,} calls, {flight}",
                        )
                    )

            latency = _measured(result, progress, where, _measure_latency, config, transport, backend)
            if latency is not None:
                wide, turns = latency
                ms = {name: [s * 1000 for s in values] for name, values in wide.items()}
                case = f"{where}: {config.wide} reads of {config.latency * 1000:g} ms"
                for name, values in ms.items():
                    result.row(case, name, "ms", values)
                for numerator, reference in (
                    (DISPATCHER, DIRECT),
                    (DISPATCHER_UNLIMITED, DIRECT),
                    (DISPATCHER, DIRECT_LIMITED),
                ):
                    result.comparisons.append(
                        Comparison.paired(case, (numerator, ms[numerator]), (reference, ms[reference]), better="lower")
                    )

                ms = {name: [s * 1000 for s in values] for name, values in turns.items()}
                case = f"{where}: mixed turns"
                for name, values in ms.items():
                    result.row(case, name, "ms", values, note=f"{Stat.of(values).median / ideal_ms:.3f}x ideal")
                result.row(case, IDEAL, "ms", [ideal_ms])
                barriers = Comparison.paired(
                    case, (DISPATCHER, ms[DISPATCHER]), (DIRECT_BARRIERS, ms[DIRECT_BARRIERS]), better="lower"
                )
                result.comparisons.append(barriers)
                result.comparisons.append(
                    Comparison.paired(
                        case, (DISPATCHER, ms[DISPATCHER]), (IDEAL, [ideal_ms] * len(ms[DISPATCHER])), better="lower"
                    )
                )
                result.targets.append(_target(f"{where}, mixed turns", barriers, "against the same ordered barriers"))
    return result
