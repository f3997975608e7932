"""Workload 7, under faults: the mixed turns of workload 3 with transient faults on the idempotent tool.

The example workspace server runs in-process with 20 ms per call; its fault injector makes a share of
the `set_note` executions (mutating, declared idempotent) fail with JSON-RPC -32603 before they take
effect, a transient failure. Reads (`search_notes`) never fail. The server is trusted, so its
idempotentHint counts and the dispatcher may retry `set_note`.

Two dispatchers run the same seeded batches against fresh servers with the same fault seed: one with
the default `RetryPolicy` (3 attempts, jittered exponential backoff from 100 ms, a retry budget), one
with `retry=None`. Reported per fault rate: the share of calls that end OK, attempts per call (as
counted in the results), and the makespan against the fault-free ideal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from mcp import Client

from dispatcher import Dispatcher, RetryPolicy
from dispatcher.examples.workspace import FaultConfig, Workspace

from ._measure import Stat, interleave
from ._results import Comparison, WorkloadResult
from .mixed import batches_of, ideal_total
from .through_mcp import WRITE, mixed_config, turn_calls

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._report import Progress

__all__ = ["FULL", "QUICK", "Config", "run"]

RETRY = "dispatcher, default RetryPolicy"
NO_RETRY = "dispatcher, retry=None"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    rates: tuple[float, ...] = (0.1, 0.3)
    batches: int = 8
    size: int = 16
    latency: float = 0.020
    seed: int = 0
    repeat: int = 3
    backend: str = "asyncio"


FULL = Config()
QUICK = Config(batches=2, repeat=2)


async def _measure(
    config: Config, rate: float, progress: Progress
) -> tuple[dict[str, list[float]], dict[str, list[tuple[float, float]]]]:
    calls = turn_calls(batches_of(mixed_config(config)))
    outcomes: dict[str, list[tuple[float, float]]] = {RETRY: [], NO_RETRY: []}

    def variant(name: str, retry: RetryPolicy | None) -> Callable[[], Awaitable[float]]:
        async def run_variant() -> float:
            faults = FaultConfig(rate=rate, seed=config.seed, tools=frozenset({WRITE}), kinds=("error",))
            workspace = Workspace(latency=config.latency, faults=faults)
            async with Client(workspace.server) as client, Dispatcher(retry=retry) as dispatcher:
                await dispatcher.add_mcp_server("workspace", client, trusted=True)
                results: list[Any] = []
                start = time.perf_counter()
                for batch in calls:
                    results.extend(await dispatcher.dispatch(batch))
                elapsed = time.perf_counter() - start
            ok = sum(1 for r in results if r.ok) / len(results)
            attempts = sum(r.attempts for r in results) / len(results)
            outcomes[name].append((ok, attempts))
            return elapsed

        return run_variant

    samples = await interleave(
        {RETRY: variant(RETRY, RetryPolicy(seed=config.seed)), NO_RETRY: variant(NO_RETRY, None)},
        config.repeat,
        progress,
        label=f"fault rate {rate:.0%}",
    )
    # The first outcome of each variant is the warm-up's.
    return samples, {name: values[-config.repeat :] for name, values in outcomes.items()}


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Measure success, attempts and makespan at each fault rate."""
    mixed = mixed_config(config)
    sets = batches_of(mixed)
    writes = sum(sum(exclusive) for exclusive in sets)
    result = WorkloadResult(
        name="faults",
        title=(
            f"7. Under faults: {config.batches} mixed turns of {config.size} calls ({writes} idempotent writes), "
            f"{config.latency * 1000:g} ms each, transient faults on the writes"
        ),
        params={
            "rates": list(config.rates),
            "batches": config.batches,
            "size": config.size,
            "latency_ms": config.latency * 1000,
            "seed": config.seed,
            "repeat": config.repeat,
            "backend": config.backend,
            "writes": writes,
            "fault_kind": "MCPError -32603 before the effect",
        },
    )
    ideal_ms = ideal_total(mixed) * 1000
    found: dict[str, dict[str, tuple[float, float]]] = {RETRY: {}, NO_RETRY: {}}
    for rate in config.rates:
        samples, outcomes = anyio.run(_measure, config, rate, progress, backend=config.backend)
        case = f"fault rate {rate:.0%}"
        ms = {name: [s * 1000 for s in values] for name, values in samples.items()}
        for name in (RETRY, NO_RETRY):
            median = Stat.of(ms[name]).median
            result.row(case, name, "ms", ms[name], note=f"{median / ideal_ms:.3f}x fault-free ideal")
            result.row(case, name, "% calls OK", [100 * ok for ok, _ in outcomes[name]])
            result.row(case, name, "attempts/call", [attempts for _, attempts in outcomes[name]])
            found[name][f"{rate:.0%}"] = (Stat.of([100 * ok for ok, _ in outcomes[name]]).median, median / ideal_ms)
        result.comparisons.append(Comparison.paired(case, (RETRY, ms[RETRY]), (NO_RETRY, ms[NO_RETRY]), better="lower"))
    result.row("fault-free", "ideal (ordered barriers)", "ms", [ideal_ms])

    def ok(name: str) -> str:
        return " / ".join(f"{share:.1f}%" for share, _ in found[name].values())

    def makespan(name: str) -> str:
        return " / ".join(f"{ratio:.2f}x" for _, ratio in found[name].values())

    result.headline = (
        f"calls OK at {' / '.join(found[RETRY])} faults: {ok(RETRY)} with retries ({ok(NO_RETRY)} without), "
        f"in {makespan(RETRY)} the fault-free ideal makespan ({makespan(NO_RETRY)})"
    )
    return result
