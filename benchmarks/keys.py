"""Workload 8, conflict keys: a multi-server agent against barriers, the ideal keyed schedule and no safety.

The agent works with three tool sources that keep separate state (``github``, ``slack``, ``fs``),
registered as local functions that sleep for the call's latency, so that only scheduling differs.
Seeded turns mix reads and writes across them (about 30% writes); one more turn writes distinct files
of ``fs``. With conflict keys, each source is a domain and ``fs`` calls are keyed by their path.
Turns run one after another, as an agent's turns do; the makespan is the time for all of them.

- dispatcher, keyed: domains and per-path keys (docs/conflicts.md);
- dispatcher, barriers: the same tools with no domain (today's default: a write runs alone);
- ideal keyed: `benchmarks.reference.ideal_keyed_makespan` of each turn, with the dispatcher's default
  limit of 16 calls in flight: the conflict rule with zero scheduling overhead;
- all at once (unsafe): every call of a turn started together, ignoring every conflict; its own ideal
  is one latency per turn.

On a virtual clock the keyed dispatcher's makespan equals the ideal keyed schedule exactly (a test
checks it); in real time every dependent round adds the event loop's timer overshoot, which the unsafe
variant pays too, so the two ratios to their ideals are the fair comparison.

The fail-fast part runs the same seeded turns with one more write of ``fs`` in each (in its first half,
on a seeded path) that fails after its latency, with ``fail_fast=True`` and with the default
(``fail_fast=False``). The calls after it on its path depend on it; every other call is independent.
Reported: the makespan of the independent calls (submission to the last of them done) in both modes,
against the conflict rule's ideal for them with the dependents left out (`independent_ideal`); how many
dependent calls ran after the failed write and how many independent calls were skipped (both must be 0).
On a virtual clock both modes take exactly the ideal (a test checks it): fail-fast costs the
independent calls nothing.

The admission part measures `Gate` alone, the sans-I/O state machine that decides what starts: it
queues n zero-latency calls (30% writes) spread over 1, 10 or 1,000 keys of one domain, then admits
and finishes them all with a limit of 16 in flight. Its time per call at 100,000 calls against 1,000
shows whether admission cost grows with the queue.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher import Dispatcher, ToolCall
from dispatcher._core._gate import Gate, conflicts

from ._measure import Stat, interleave
from ._results import Comparison, Target, WorkloadResult
from ._tools import READ_ONLY, WRITE, sleep_read, sleep_write
from .reference import KeyedCall, ideal_keyed_makespan, ideal_makespan, keyed_schedule

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from ._report import Progress

__all__ = ["FULL", "QUICK", "Config", "run"]

KEYED = "dispatcher, keyed"
BARRIERS = "dispatcher, barriers (no keys)"
ALL_AT_ONCE = "all at once (unsafe)"
IDEAL_KEYED = "ideal keyed schedule"
IDEAL_BARRIERS = "ideal ordered barriers"
IDEAL_ALL = "ideal all at once (unsafe)"

FAIL_FAST = "dispatcher, keyed, fail_fast=True"
NO_FAIL_FAST = "dispatcher, keyed, fail_fast=False (default)"
IDEAL_INDEPENDENT = "ideal for the independent calls"
FAIL_CASE = "fail-fast, independent calls"

DOMAINS = ("github", "slack", "fs")
LIMIT = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    turns: int = 6
    size: int = 12
    files: int = 8
    latency: float = 0.020
    read_fraction: float = 0.7
    seed: int = 0
    repeat: int = 5
    # At 1,000 calls over 1,000 keys hardly any call waits: the sizes start where each key has several.
    gate_sizes: tuple[int, ...] = (10_000, 100_000)
    gate_keys: tuple[int, ...] = (1, 10, 1000)
    gate_repeat: int = 3
    backend: str = "asyncio"


FULL = Config()
QUICK = Config(turns=2, repeat=2, gate_sizes=(1000, 10_000), gate_repeat=2)


@dataclass(frozen=True, slots=True)
class Call:
    domain: str
    write: bool
    path: str


def turns_of(config: Config) -> list[list[Call]]:
    """The seeded turns, and the turn of writes to distinct files."""
    rng = random.Random(config.seed)
    turns = [
        [
            Call(rng.choice(DOMAINS), rng.random() >= config.read_fraction, f"/src/f{rng.randrange(6)}.py")
            for _ in range(config.size)
        ]
        for _ in range(config.turns)
    ]
    turns.append([Call("fs", True, f"/src/new{i}.py") for i in range(config.files)])
    return turns


def keys_of(call: Call) -> tuple[str, ...]:
    """The keys the keyed dispatcher gives a call (checked against its events in the smoke test)."""
    return (f"fs/path:{call.path}",) if call.domain == "fs" else (call.domain,)


def _path_key(arguments: Any) -> str:
    return f"path:{arguments['key']}"


def register(dispatcher: Dispatcher, *, keyed: bool) -> None:
    """A read and a write tool per domain; keyed: each in its domain, fs tools keyed by path."""
    for domain in DOMAINS:
        keys = _path_key if keyed and domain == "fs" else None
        for tool, hints, kind in ((sleep_read, READ_ONLY, "read"), (sleep_write, WRITE, "write")):
            dispatcher.add_function(
                tool,
                name=f"{domain}_{kind}",
                annotations=hints,
                domain=domain if keyed else None,
                keys=keys,
            )


def tool_calls(turn: list[Call], latency: float, prefix: str) -> list[ToolCall]:
    return [
        ToolCall(
            f"{prefix}{i}",
            f"{call.domain}_{'write' if call.write else 'read'}",
            {"key": call.path, "seconds": latency},
        )
        for i, call in enumerate(turn)
    ]


@dataclass(frozen=True, slots=True)
class FailingTurn:
    """A seeded turn with a write that fails at `failing`, and the calls after it that depend on it."""

    calls: list[Call]
    failing: int
    dependents: frozenset[int]

    @property
    def independent(self) -> list[int]:
        return [i for i in range(len(self.calls)) if i != self.failing and i not in self.dependents]


def failing_turns(config: Config) -> list[FailingTurn]:
    """The seeded turns (not the turn of new files), each with a failing write of ``fs`` in its first half."""
    rng = random.Random(config.seed + 1)
    found = []
    for turn in turns_of(config)[:-1]:
        at = rng.randrange(max(1, len(turn) // 2))
        calls = [*turn[:at], Call("fs", True, f"/src/f{rng.randrange(6)}.py"), *turn[at:]]
        # The conflict rule's dependents: a call conflicting with a failure, where a skipped write is
        # a failure in turn (as `FailFast` has it).
        failed = [keys_of(calls[at])]
        dependents = set()
        for i in range(at + 1, len(calls)):
            if any(conflicts(keys, keys_of(calls[i])) for keys in failed):
                dependents.add(i)
                if calls[i].write:
                    failed.append(keys_of(calls[i]))
        found.append(FailingTurn(calls, at, frozenset(dependents)))
    return found


def failing_calls(turn: FailingTurn, latency: float, prefix: str) -> list[ToolCall]:
    calls = tool_calls(turn.calls, latency, prefix)
    failing = calls[turn.failing]
    calls[turn.failing] = ToolCall(failing.id, "fs_fail", failing.arguments)
    return calls


def independent_ideal(turn: FailingTurn, latency: float) -> float:
    """When the last independent call of a turn ends under the conflict rule, with its dependents left out."""
    kept = [i for i in range(len(turn.calls)) if i not in turn.dependents]
    schedule = keyed_schedule([KeyedCall(keys_of(turn.calls[i]), turn.calls[i].write, latency) for i in kept], LIMIT)
    return max(end for i, (_, end) in zip(kept, schedule, strict=True) if i != turn.failing)


async def _failing_write(key: str, seconds: float) -> str:
    await anyio.sleep(seconds)
    raise RuntimeError(f"could not write {key}")


def register_failing(dispatcher: Dispatcher) -> None:
    """The keyed tools, and ``fs_fail``: a write of ``fs``, keyed by its path, that fails after its latency."""
    register(dispatcher, keyed=True)
    dispatcher.add_function(_failing_write, name="fs_fail", annotations=WRITE, domain="fs", keys=_path_key)


@dataclass(slots=True)
class FailFastRun:
    """One pass over the failing turns: the independent calls' makespan, and what the mode got wrong."""

    seconds: float = 0.0
    dependents_run: int = 0
    independents_skipped: int = 0


async def run_failing_turns(dispatcher: Dispatcher, config: Config, *, fail_fast: bool) -> FailFastRun:
    """Dispatch every failing turn once; time each turn's independent calls from submission to the last one done."""
    found = FailFastRun()
    for t, turn in enumerate(failing_turns(config)):
        results = await dispatcher.dispatch(failing_calls(turn, config.latency, f"f{t}-"), fail_fast=fail_fast)
        assert not results[turn.failing].ok
        start = min(result.queued_at for result in results)
        found.seconds += max(results[i].finished_at for i in turn.independent) - start
        found.independents_skipped += sum(results[i].depends_on is not None for i in turn.independent)
        if fail_fast:
            found.dependents_run += sum(results[i].started_at is not None for i in turn.dependents)
        assert all(results[i].ok for i in turn.independent if results[i].depends_on is None)
    return found


def ideal_keyed(config: Config) -> float:
    """The ideal makespan of all turns under the conflict rule, in seconds."""
    return sum(
        ideal_keyed_makespan([KeyedCall(keys_of(call), call.write, config.latency) for call in turn], LIMIT)
        for turn in turns_of(config)
    )


def ideal_barriers(config: Config) -> float:
    """The ideal makespan of all turns under ordered barriers, in seconds."""
    return sum(ideal_makespan([call.write for call in turn], config.latency, LIMIT) for turn in turns_of(config))


async def _measure(config: Config, progress: Progress) -> dict[str, list[float]]:
    turns = turns_of(config)
    latency = config.latency
    calls = [tool_calls(turn, latency, f"t{t}-") for t, turn in enumerate(turns)]

    def timed(dispatcher: Dispatcher) -> Callable[[], Coroutine[Any, Any, float]]:
        async def run_turns() -> float:
            start = time.perf_counter()
            for batch in calls:
                results = await dispatcher.dispatch(batch)
                assert all(r.ok for r in results)
            return time.perf_counter() - start

        return run_turns

    async def run_all_at_once() -> float:
        start = time.perf_counter()
        for turn in turns:
            async with anyio.create_task_group() as tg:
                for call in turn:
                    tg.start_soon(sleep_write if call.write else sleep_read, call.path, latency)
        return time.perf_counter() - start

    mistakes = FailFastRun()

    def failing(dispatcher: Dispatcher, fail_fast: bool) -> Callable[[], Coroutine[Any, Any, float]]:
        async def run_turns() -> float:
            found = await run_failing_turns(dispatcher, config, fail_fast=fail_fast)
            mistakes.dependents_run += found.dependents_run
            mistakes.independents_skipped += found.independents_skipped
            return found.seconds

        return run_turns

    async with Dispatcher() as keyed, Dispatcher() as barriers, Dispatcher() as failing_fast:
        register(keyed, keyed=True)
        register(barriers, keyed=False)
        register_failing(failing_fast)
        samples = await interleave(
            {KEYED: timed(keyed), BARRIERS: timed(barriers), ALL_AT_ONCE: run_all_at_once},
            config.repeat,
            progress,
            label=f"{len(turns)} turns",
        )
        samples.update(
            await interleave(
                {FAIL_FAST: failing(failing_fast, True), NO_FAIL_FAST: failing(failing_fast, False)},
                config.repeat,
                progress,
                label="failing turns",
            )
        )
    # Not samples: counts over every run, each of which must be 0.
    samples["dependents run"] = [float(mistakes.dependents_run)]
    samples["independents skipped"] = [float(mistakes.independents_skipped)]
    return samples


def admit_all(n: int, keys: int, seed: int = 0) -> float:
    """Seconds for `Gate` to queue, admit and finish n calls over `keys` keys of one domain."""
    rng = random.Random(seed)
    plan = [(rng.random() >= 0.7, (f"d/k{rng.randrange(keys)}",)) for _ in range(n)]
    gate: Gate[int] = Gate(LIMIT)
    start = time.perf_counter()
    for i, (write, key) in enumerate(plan):
        gate.submit(i, exclusive=write, keys=key)
    running = []
    while True:
        while (ticket := gate.take()) is not None:
            running.append(ticket)
        if not running:
            break
        # The oldest running call ends first, as calls of equal latency would.
        gate.finish(running.pop(0))
    elapsed = time.perf_counter() - start
    assert gate.idle
    return elapsed


def run(config: Config, progress: Progress) -> WorkloadResult:
    """Measure the keyed workload's makespan and the gate's admission cost per call."""
    turns = turns_of(config)
    writes = sum(call.write for turn in turns for call in turn)
    total = sum(len(turn) for turn in turns)
    result = WorkloadResult(
        name="keys",
        title=(
            f"8. Conflict keys: {len(turns)} turns over 3 servers with separate state ({total} calls, {writes} "
            f"writes, {config.latency * 1000:g} ms each), and with a failing write each under fail-fast; "
            f"admission of up to {max(config.gate_sizes):,} calls"
        ),
        params={
            "turns": config.turns,
            "size": config.size,
            "files": config.files,
            "latency_ms": config.latency * 1000,
            "read_fraction": config.read_fraction,
            "seed": config.seed,
            "repeat": config.repeat,
            "limit": LIMIT,
            "backend": config.backend,
        },
    )
    samples = anyio.run(_measure, config, progress, backend=config.backend)
    [dependents_run] = samples.pop("dependents run")
    [independents_skipped] = samples.pop("independents skipped")
    failing_ms = {name: [s * 1000 for s in samples.pop(name)] for name in (FAIL_FAST, NO_FAIL_FAST)}
    ms = {name: [s * 1000 for s in values] for name, values in samples.items()}
    ideal_ms = ideal_keyed(config) * 1000
    barrier_ms = ideal_barriers(config) * 1000
    case = f"{len(turns)} turns"
    for name, values in ms.items():
        median = Stat.of(values).median
        result.row(case, name, "ms", values, note=f"{median / ideal_ms:.3f}x ideal keyed")
    result.row(case, IDEAL_KEYED, "ms", [ideal_ms], note="the conflict rule, zero overhead")
    result.row(case, IDEAL_BARRIERS, "ms", [barrier_ms], note=f"{barrier_ms / ideal_ms:.3f}x ideal keyed")
    all_ms = len(turns) * config.latency * 1000
    result.row(case, IDEAL_ALL, "ms", [all_ms], note="one latency per turn")
    ideal = [ideal_ms] * config.repeat
    result.comparisons.extend(
        [
            Comparison.paired(case, (KEYED, ms[KEYED]), (IDEAL_KEYED, ideal), better="lower"),
            Comparison.paired(case, (BARRIERS, ms[BARRIERS]), (KEYED, ms[KEYED]), better="higher"),
            Comparison.paired(case, (KEYED, ms[KEYED]), (ALL_AT_ONCE, ms[ALL_AT_ONCE]), better="lower"),
            Comparison.paired(
                case, (BARRIERS, ms[BARRIERS]), (IDEAL_BARRIERS, [barrier_ms] * config.repeat), better="lower"
            ),
            Comparison.paired(
                case, (ALL_AT_ONCE, ms[ALL_AT_ONCE]), (IDEAL_ALL, [all_ms] * config.repeat), better="lower"
            ),
        ]
    )
    keyed = Stat.of(ms[KEYED]).scaled(1 / ideal_ms)
    result.targets.append(
        Target(
            name="keyed makespan / ideal keyed schedule",
            value=keyed.median,
            op="<=",
            threshold=1.05,
            detail="within 5% of the ideal schedule under the conflict rule",
            spread=keyed,
        )
    )
    _fail_fast_rows(result, config, failing_ms, dependents_run, independents_skipped)
    per_call: dict[tuple[int, int], Stat] = {}
    for keys in config.gate_keys:
        for n in config.gate_sizes:
            progress.update(f"gate: {n:,} calls over {keys:,} keys")
            admit_all(min(n, 1000), keys)  # warm-up
            values = [admit_all(n, keys, seed) / n * 1e6 for seed in range(config.gate_repeat)]
            per_call[(keys, n)] = result.row(f"gate, {keys:,} keys", f"{n:,} calls", "us/call", values)
            result.series.setdefault("gate_us_per_call", []).append(
                {"keys": keys, "calls": n, "us_per_call": per_call[(keys, n)].median}
            )
    small, large = min(config.gate_sizes), max(config.gate_sizes)
    if large > small:
        for keys in config.gate_keys:
            name = f"gate time per call at {large:,} / at {small:,} calls, {keys:,} keys"
            # The full run's name, which the reference holds: the quick run admits fewer calls.
            full = f"gate time per call at {max(FULL.gate_sizes):,} / at {min(FULL.gate_sizes):,} calls, {keys:,} keys"
            result.targets.append(
                Target(
                    name=name,
                    key=full if full != name else None,
                    value=per_call[(keys, large)].median / per_call[(keys, small)].median,
                    op="<=",
                    threshold=1.5,
                    detail="admission cost does not grow with the queue",
                )
            )
    result.notes.append(
        f"ideal barriers / ideal keyed: {barrier_ms / ideal_ms:.2f}x; "
        f"barriers / keyed (medians): {Stat.of(ms[BARRIERS]).median / Stat.of(ms[KEYED]).median:.2f}x"
    )
    return result


def _fail_fast_rows(
    result: WorkloadResult,
    config: Config,
    ms: dict[str, list[float]],
    dependents_run: float,
    independents_skipped: float,
) -> None:
    """The fail-fast case: the independent calls' makespan in both modes, its ideal, and the two counts."""
    turns = failing_turns(config)
    ideal_ms = sum(independent_ideal(turn, config.latency) for turn in turns) * 1000
    for name in (FAIL_FAST, NO_FAIL_FAST):
        median = Stat.of(ms[name]).median
        result.row(FAIL_CASE, name, "ms", ms[name], note=f"{median / ideal_ms:.3f}x ideal")
    dependents = sum(len(turn.dependents) for turn in turns)
    result.row(
        FAIL_CASE, IDEAL_INDEPENDENT, "ms", [ideal_ms], note=f"the conflict rule without the {dependents} dependents"
    )
    cost = Comparison.paired(FAIL_CASE, (FAIL_FAST, ms[FAIL_FAST]), (NO_FAIL_FAST, ms[NO_FAIL_FAST]), better="lower")
    result.comparisons.append(cost)
    result.targets += [
        Target(
            name="fail-fast / default, makespan of the independent calls",
            value=cost.ratio.median,
            op="<=",
            threshold=1.05,
            detail="skipping what depends on a failed write costs the independent calls nothing",
        ),
        Target(
            name="fail-fast: dependent calls run after the failed write",
            value=dependents_run,
            op="<=",
            threshold=0,
            detail=f"of {dependents} dependents per pass, over every pass",
        ),
        Target(
            name="fail-fast: independent calls skipped",
            value=independents_skipped,
            op="<=",
            threshold=0,
            detail="in both modes, over every pass",
        ),
    ]
