"""Workload 9, the online limit: `AdaptiveLimit` against fixed limits and an oracle, on a virtual clock.

Every run is the real thing (a `Dispatcher`, the `mcp` SDK's in-process client, the example `Workspace`
server) on a virtual clock (`_virtual`: trio's MockClock, and an asyncio loop whose clock jumps the
same way), so a run of a minute of traffic takes a second or two and every figure is exact. Five
servers, each with four ways of setting its limit, compared in one run:

- ``changing``: a server that serves `capacities` (8, then 3, then 16) calls at its unloaded speed of
  `latency`, `phase` seconds each, and shares itself past that (`saturated_latency`); `clients`
  callers in a closed loop (each sends its next call when the last one ends).
- ``bursty``: the same server and phases, with bursts of 4 to 64 calls, 1 to 5 s apart (seeded).
- ``bucket``: a server with room for any number of calls but a token bucket (`rate` calls per second,
  `burst` at once) that answers a call over it with a -32000 "rate limit exceeded: retry after" and a
  ``retryAfter``; closed loop, a caller whose call failed waits `latency` before its next one.
- ``collapse``: a steady server (capacity 8) whose goodput falls past its knee (``collapse=1``: at
  twice the knee, half the goodput); closed loop.
- ``noisy``: a server with room for any number of calls whose latency varies by `noise` (+-50%: uniform
  from half to 1.5x `latency`, seeded) at any load; a closed loop of 16 callers. Its oracle lets all 16
  through: a limit that single slow answers cut would ratchet down here. Its p95 is read against the noise's own
  p95 (``latency * (1 + 0.9 * noise)``), the unloaded run time of this server.

The four limits: ``adaptive`` (``max_concurrency="auto"``), ``tune`` (the fixed limit `tune` recommends
when swept against the same server as it is at the start), ``fixed 64`` and ``oracle`` (the server's
capacity at each instant: rate x latency for the bucket). Then the issue's targets: goodput at least 95%
of the oracle's in every phase; back within 20% of the new knee in at most 3 s or 50 completions; overload
answers under 1% of calls from 2 s after a change; p95 run time at most 1.25x unloaded; on a steady server
within 5% of the best fixed setting; the limiter's own cost at most 2% of a zero-latency call (measured on
the real clock, the one figure here that is not exact).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher import AdaptiveLimit, Dispatcher, ToolCall
from dispatcher._core._adaptive import Controller, Signal
from dispatcher.examples import Workspace
from dispatcher.tuning import tune

from ._measure import Stat
from ._results import Target, WorkloadResult
from ._virtual import run as run_virtual

if TYPE_CHECKING:
    from dispatcher import CallEvent, ToolResult

    from ._report import Progress

__all__ = ["FULL", "QUICK", "Config", "run"]

READ = "search_notes"
STRATEGIES = ("adaptive", "tune", "fixed 64", "oracle")


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    latency: float = 0.1
    capacities: tuple[int, ...] = (8, 3, 16)
    phase: float = 15.0
    clients: int = 64
    rate: float = 80.0
    burst: int = 10
    steady: float = 15.0
    backends: tuple[str, ...] = ("asyncio", "trio")
    seed: int = 0
    noise: float = 0.5
    # The calls of each setting of the `tune` sweep that picks the "tune" strategy's limit.
    tune_calls: int = 100
    cost_calls: int = 2000
    repeat: int = 5


FULL = Config()
# The smoke run (`make bench-quick`): shorter phases and fewer callers, a few seconds of CPU.
QUICK = Config(phase=3.0, steady=3.0, clients=20, backends=("trio",), tune_calls=20, cost_calls=200, repeat=2)


@dataclass(slots=True)
class Scenario:
    name: str
    # (start, capacity) steps; the run ends at `end`.
    steps: list[tuple[float, int]]
    end: float
    bursty: bool = False
    rate: float | None = None
    burst: int = 1
    collapse: float = 0.0
    noise: float = 0.0
    # The closed loop's callers (None: `Config.clients`).
    clients: int | None = None

    def capacity(self, at: float) -> int:
        current = self.steps[0][1]
        for start, capacity in self.steps:
            if at >= start:
                current = capacity
        return current


@dataclass(slots=True)
class Trace:
    """What one strategy's run measured, times from the run's start."""

    results: list[tuple[float, float, bool, bool]] = field(default_factory=list)  # (end, run time, ok, overload)
    limits: list[tuple[float, int]] = field(default_factory=list)
    busy: list[tuple[float, float, int]] = field(default_factory=list)  # bursts: (start, end, calls)


def scenarios(config: Config) -> list[Scenario]:
    steps = [(i * config.phase, capacity) for i, capacity in enumerate(config.capacities)]
    end = config.phase * len(config.capacities)
    knee = round(config.rate * config.latency)
    return [
        Scenario("changing", steps, end),
        Scenario("bursty", steps, end, bursty=True),
        Scenario("bucket", [(0.0, knee)], config.steady, rate=config.rate, burst=config.burst),
        Scenario("collapse", [(0.0, config.capacities[0])], config.steady, collapse=1.0),
        # 16 callers: enough to show a ratchet (a limit that falls below them), at a fourth of the calls.
        Scenario("noisy", [(0.0, 16)], config.steady, noise=config.noise, clients=16),
    ]


class Noisy:
    """A server with one read-only tool whose latency is `latency` times a seeded uniform draw from
    ``1 - noise`` to ``1 + noise``, whatever the load."""

    def __init__(self, latency: float, noise: float, seed: int) -> None:
        rng = random.Random(seed)
        self.saturation: int | None = None
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        self.server: MCPServer[object] = MCPServer("noisy")
        # `MCPServer()` configures the root logger; leave it as it was.
        for handler in [handler for handler in root.handlers if handler not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)

        @self.server.tool(annotations=ToolAnnotations(read_only_hint=True))
        async def search_notes(query: str) -> str:
            """Search (a noisy latency)."""
            await anyio.sleep(latency * rng.uniform(1 - noise, 1 + noise))
            return query


def _workspace(config: Config, scenario: Scenario) -> Workspace | Noisy:
    if scenario.noise:
        return Noisy(config.latency, scenario.noise, config.seed)
    if scenario.rate is not None:
        return Workspace(latency=config.latency, rate_limit=scenario.rate, rate_burst=scenario.burst)
    return Workspace(latency=config.latency, saturation=scenario.steps[0][1], collapse=scenario.collapse)


async def _tuned(config: Config, scenario: Scenario) -> int:
    """What `tune` recommends for the server as it is at the start (one repeat: on a virtual clock they agree)."""
    report = await tune(
        _workspace(config, scenario).server,
        [ToolCall("t", READ, {"query": "x"})],
        trusted=True,
        per_server=True,
        call_timeout=None,
        repeats=1,
        calls=config.tune_calls,
    )
    return report.recommended or 1


async def _run(config: Config, scenario: Scenario, strategy: str, tuned: int) -> Trace:
    workspace = _workspace(config, scenario)
    trace = Trace()
    origin = 0.0
    limits: dict[str, int | str | None] = {"adaptive": "auto", "tune": tuned, "fixed 64": 64, "oracle": None}
    limit = limits[strategy]
    oracle = anyio.CapacityLimiter(scenario.steps[0][1]) if strategy == "oracle" else None

    def on_event(event: CallEvent) -> None:
        if event.kind == "finished" and event.limit is not None:
            trace.limits.append((event.time - origin, event.limit))

    def record(result: ToolResult) -> None:
        overload = not result.ok and "rate limit" in (result.error or "")
        assert result.finished_at is not None
        trace.results.append((result.finished_at - origin, result.run_time or 0.0, result.ok, overload))

    async with Dispatcher(max_concurrency=None, call_timeout=None, retry=None, on_event=on_event) as dispatcher:
        await dispatcher.connect("server", workspace.server, trusted=True, max_concurrency=limit)  # type: ignore[arg-type]
        origin = anyio.current_time()
        end = origin + scenario.end
        numbers = iter(range(10**9))

        async def one() -> None:
            call = ToolCall(f"c{next(numbers)}", READ, {"query": "x"})
            if oracle is None:
                result = (await dispatcher.dispatch([call]))[0]
            else:
                async with oracle:
                    result = (await dispatcher.dispatch([call]))[0]
            record(result)
            if not result.ok:
                await anyio.sleep(config.latency)  # a caller whose call failed waits before its next

        async def caller() -> None:
            while anyio.current_time() < end:
                await one()

        async def bursts() -> None:
            rng = random.Random(config.seed)
            while anyio.current_time() < end:
                size = rng.randint(4, 64)
                start = anyio.current_time()
                if oracle is None:
                    calls = [ToolCall(f"c{next(numbers)}", READ, {"query": "x"}) for _ in range(size)]
                    for result in await dispatcher.dispatch(calls):
                        record(result)
                else:
                    async with anyio.create_task_group() as tg:
                        for _ in range(size):
                            tg.start_soon(one)
                trace.busy.append((start - origin, anyio.current_time() - origin, size))
                await anyio.sleep(rng.uniform(1.0, 5.0))

        async def change() -> None:
            for start, capacity in scenario.steps[1:]:
                await anyio.sleep_until(origin + start)
                workspace.saturation = capacity
                if oracle is not None:
                    oracle.total_tokens = capacity

        async with anyio.create_task_group() as tg:
            tg.start_soon(change)
            if scenario.bursty:
                tg.start_soon(bursts)
            else:
                for _ in range(scenario.clients or config.clients):
                    tg.start_soon(caller)
    return trace


async def _scenario(config: Config, scenario: Scenario) -> tuple[int, dict[str, Trace]]:
    tuned = await _tuned(config, scenario)
    return tuned, {strategy: await _run(config, scenario, strategy, tuned) for strategy in STRATEGIES}


# Figures ---------------------------------------------------------------------------------------------


def _phases(scenario: Scenario) -> list[tuple[float, float, int]]:
    bounds = [start for start, _ in scenario.steps] + [scenario.end]
    return [(bounds[i], bounds[i + 1], capacity) for i, (_, capacity) in enumerate(scenario.steps)]


def goodput(trace: Trace, start: float, end: float, *, bursty: bool) -> float:
    """Successful calls per second in [start, end); for bursts, per second of burst (calls / makespans)."""
    if bursty:
        bursts = [(a, b, n) for a, b, n in trace.busy if start <= a < end]
        spent = sum(b - a for a, b, _ in bursts)
        return sum(n for _, _, n in bursts) / spent if spent else 0.0
    ok = sum(1 for at, _, good, _ in trace.results if good and start <= at < end)
    return ok / (end - start)


def unloaded_p95(config: Config, scenario: Scenario) -> float:
    """The p95 run time of an unloaded call: the latency, or the noise's own p95 on the noisy server."""
    return config.latency * (1 + 0.9 * scenario.noise)


def p95_ratio(trace: Trace, latency: float) -> float:
    times = sorted(run for _, run, ok, _ in trace.results if ok)
    return times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)] / latency if times else math.inf


def overload_share(trace: Trace, scenario: Scenario) -> float:
    """Overload answers among the calls that ended 2 s or more after the start or a change."""
    changes = [start for start, _ in scenario.steps]

    def settled(at: float) -> bool:
        since = max(change for change in changes if change <= at) if at >= 0 else 0.0
        return at - since >= 2.0

    window = [overload for at, _, _, overload in trace.results if settled(at)]
    return sum(window) / len(window) if window else 0.0


def recovery(trace: Trace, change: float, knee: int) -> tuple[float, int]:
    """Seconds and completions after `change` until the limit is within 20% of `knee` (inf if never)."""
    for count, (at, limit) in enumerate((at, limit) for at, limit in trace.limits if at >= change):
        if abs(limit - knee) <= 0.2 * knee:
            return at - change, count
    return math.inf, 10**9


def limiter_cost(config: Config) -> tuple[float, float, float]:
    """The controller's cost per call (start and finish), a zero-latency call's time, both in seconds, and
    the end-to-end ratio of a zero-latency call under "auto" to one under a fixed limit (real clock)."""
    controller = Controller(AdaptiveLimit())
    rounds = 20000
    started = time.perf_counter()
    for _ in range(rounds):
        flight = controller.start(0.0)
        controller.finish(flight, 0.0, Signal.ANSWER, tool=READ)
    own = (time.perf_counter() - started) / rounds

    async def calls(limit: int | str) -> float:
        async with Client(Workspace().server) as client, Dispatcher(retry=None, max_concurrency=None) as dispatcher:
            await dispatcher.add_mcp_server("server", client, trusted=True, max_concurrency=limit)  # type: ignore[arg-type]
            call = [ToolCall("c", READ, {"query": "x"})]
            for _ in range(20):
                await dispatcher.dispatch(call)
            begun = time.perf_counter()
            for _ in range(config.cost_calls):
                await dispatcher.dispatch(call)
            return (time.perf_counter() - begun) / config.cost_calls

    fixed: list[float] = []
    auto: list[float] = []
    for _ in range(config.repeat):
        fixed.append(anyio.run(calls, 64))
        auto.append(anyio.run(calls, "auto"))
    ratio = Stat.of([a / f for a, f in zip(auto, fixed, strict=True)]).median
    return own, Stat.of(fixed).median, ratio


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Run every scenario with every strategy on each backend, then check the targets."""
    result = WorkloadResult(
        name="adaptive",
        title=(
            f"10. The online limit (max_concurrency='auto') against tune's, 64 and an oracle, virtual clock: "
            f"{config.latency * 1000:g} ms calls, capacities {'->'.join(map(str, config.capacities))} "
            f"every {config.phase:g} s, a {config.rate:g}/s token bucket, a server whose goodput collapses, "
            f"one whose latency varies +-{config.noise:.0%} at any load"
        ),
        params={
            "latency_ms": config.latency * 1000,
            "capacities": list(config.capacities),
            "phase_s": config.phase,
            "clients": config.clients,
            "rate": config.rate,
            "burst": config.burst,
            "steady_s": config.steady,
            "backends": list(config.backends),
            "seed": config.seed,
        },
    )
    worst: dict[str, tuple[float, str]] = {}

    def keep(name: str, value: float, where: str, *, low: bool) -> None:
        # The worst figure of a target over every scenario and backend, with where it was seen.
        if name not in worst or (value < worst[name][0] if low else value > worst[name][0]):
            worst[name] = (value, where)

    for backend in config.backends:
        for scenario in scenarios(config):
            progress.update(f"{scenario.name} on {backend}")
            tuned, traces = run_virtual(_scenario, config, scenario, backend=backend)
            case = f"{scenario.name} ({backend})"
            for strategy in STRATEGIES:
                trace = traces[strategy]
                label = f"{strategy} ({tuned})" if strategy == "tune" else strategy
                for start, end, capacity in _phases(scenario):
                    phase = f"{case}, {start:g}-{end:g} s, capacity {capacity}"
                    rate = goodput(trace, start, end, bursty=scenario.bursty)
                    result.row(phase, label, "calls/s", [rate])
                result.row(case, label, "p95 run / unloaded", [p95_ratio(trace, unloaded_p95(config, scenario))])
                if scenario.rate is not None:
                    result.row(case, label, "% overload answers", [100 * overload_share(trace, scenario)])
            adaptive, oracle = traces["adaptive"], traces["oracle"]
            for start, end, capacity in _phases(scenario):
                best = goodput(oracle, start, end, bursty=scenario.bursty)
                if best:  # a short phase may see no burst start
                    share = goodput(adaptive, start, end, bursty=scenario.bursty) / best
                    keep("goodput", share, f"{case}, {start:g}-{end:g} s (capacity {capacity})", low=True)
            keep("p95", p95_ratio(adaptive, unloaded_p95(config, scenario)), case, low=False)
            if scenario.rate is not None:
                keep("overload", overload_share(adaptive, scenario), case, low=False)
            if scenario.name == "changing":
                for start, capacity in scenario.steps[1:]:
                    seconds, completions = recovery(adaptive, start, capacity)
                    result.row(case, f"adaptive: back within 20% of {capacity}", "s", [seconds])
                    result.row(case, f"adaptive: back within 20% of {capacity}", "completions", [completions])
                    keep("recovery", min(seconds / 3.0, completions / 50), f"{case}, to {capacity}", low=False)
            if len(scenario.steps) == 1:
                best = max(goodput(traces[s], 0, scenario.end, bursty=False) for s in ("tune", "fixed 64", "oracle"))
                keep("steady", goodput(adaptive, 0, scenario.end, bursty=False) / best, case, low=True)
            if backend == config.backends[-1]:
                result.series[f"limit {scenario.name}"] = [
                    {"t": at, "limit": limit, "capacity": scenario.capacity(at)} for at, limit in adaptive.limits
                ]
                result.series[f"steps {scenario.name}"] = [
                    {"t": start, "capacity": capacity} for start, capacity in scenario.steps
                ] + [{"t": scenario.end, "capacity": scenario.steps[-1][1]}]
    progress.update("the limiter's own cost (real clock)")
    own, call, ratio = limiter_cost(config)
    result.row("zero-latency call, in-process MCP (real clock)", "fixed limit", "us/call", [call * 1e6])
    result.row("zero-latency call, in-process MCP (real clock)", "'auto'", "x fixed", [ratio])
    result.row("the controller alone (start + finish)", "AdaptiveLimit()", "us/call", [own * 1e6])
    result.targets += [
        Target(
            name="goodput >= 95% of the oracle's in every phase",
            value=100 * worst["goodput"][0],
            op=">=",
            threshold=95.0,
            detail=f"worst: {worst['goodput'][1]} (%)",
        ),
        Target(
            name="back within 20% of the new knee in <= 3 s or <= 50 completions",
            value=worst["recovery"][0],
            op="<=",
            threshold=1.0,
            detail=f"worst: {worst['recovery'][1]}; min(s / 3, completions / 50)",
        ),
        Target(
            name="overload answers < 1% of calls from 2 s after a change",
            value=100 * worst["overload"][0],
            op="<=",
            threshold=1.0,
            detail=f"worst: {worst['overload'][1]} (%)",
        ),
        Target(
            name="p95 run time <= 1.25x unloaded",
            value=worst["p95"][0],
            op="<=",
            threshold=1.25,
            detail=f"worst: {worst['p95'][1]}; over every call of the run, changes included",
        ),
        Target(
            name="steady server: within 5% of the best fixed setting",
            value=100 * worst["steady"][0],
            op=">=",
            threshold=95.0,
            detail=f"worst: {worst['steady'][1]} (% of the best of tune's, 64 and the capacity)",
        ),
        Target(
            name="the limiter's own cost <= 2% of a zero-latency call",
            value=100 * own / call,
            op="<=",
            threshold=2.0,
            detail=f"the controller's start + finish, {own * 1e6:.2f} us, against {call * 1e6:.0f} us a call "
            f"(end to end, 'auto' took {ratio:.3f}x a fixed limit's time: noise of the real clock included)",
        ),
    ]
    result.notes.append(
        "virtual clock: every figure but the limiter's cost is exact and the same at every run; 'tune' is the "
        "setting the sweep recommends for the server as it is at the start"
    )
    return result
