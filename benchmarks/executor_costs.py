"""Where a call's microseconds go: the zero-latency case of `benchmarks.executors`, in CPU time and by part.

Run it with ``python -m benchmarks.executor_costs [--backend asyncio|trio] [--calls N] [--repeat N]
[--profile]``. It dispatches one batch of `--calls` zero-latency calls and runs the same calls through the
16 hand-written workers of `benchmarks.executors` (`_tools.workers`: the same validation, call and
conversion through the dispatcher's own adapter), interleaved repetition by repetition, and prints the
median and the least CPU time of the thread per call (`time.thread_time`, which other processes on the machine
move less than the wall clock; the least is the steadiest figure on a loaded machine), the median wall
time per call of each, and their ratios.

With ``--profile`` it then runs the dispatcher's repetitions under `cProfile` and sums each function's
own time into the part of the executor it belongs to (submission, gate, tasks and loop, cancel scopes,
deadlines, lifecycle and result, executor, the SDK work both sides do), per call. The profiler adds a
cost per Python function call, so its figures are larger than the unprofiled ones: read them as shares.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import anyio

from dispatcher import Dispatcher

from ._tools import READ_ONLY, Adapter, lookup, workers, zero_calls

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["PARTS", "part_of", "profile_parts"]

# (a fragment of the file's path, a function name or None for any) -> part, first match wins.
PARTS: tuple[tuple[str, str | None, str], ...] = (
    ("anyio/_backends", "create_cancel_scope", "cancel scope"),
    ("anyio/_backends", "__enter__", "cancel scope"),
    ("anyio/_backends", "__exit__", "cancel scope"),
    ("anyio/_backends", "_deliver_cancellation", "cancel scope"),
    ("anyio/_backends/_asyncio.py", "__init__", "cancel scope"),
    ("trio/_core/_run.py", "__enter__", "cancel scope"),
    ("trio/_core/_run.py", "__exit__", "cancel scope"),
    ("trio/_core/_run.py", "_close", "cancel scope"),
    ("trio/_core/_run.py", "_might_change_registered_deadline", "cancel scope"),
    ("trio/_core/_run.py", "effective_deadline", "cancel scope"),
    ("trio/_core/_run.py", "recalculate", "cancel scope"),
    ("contextlib.py", None, "cancel scope"),
    ("_functions.py", None, "SDK work (both sides)"),
    ("pydantic", None, "SDK work (both sides)"),
    ("mcp/", None, "SDK work (both sides)"),
    ("_submission.py", None, "submission"),
    ("_dispatcher.py", None, "submission"),
    ("_catalog.py", None, "submission"),
    ("_keys.py", None, "submission"),
    ("_batch.py", "__init__", "submission"),
    ("_batch.py", "_add", "submission"),
    ("_batch.py", "_accept", "submission"),
    ("_batch.py", "_check", "submission"),
    ("_lifecycle.py", "__init__", "submission"),
    ("_lifecycle.py", "resolve", "submission"),
    ("_lifecycle.py", "prepare", "submission"),
    ("_lifecycle.py", "enter", "submission"),
    ("_gate.py", None, "gate"),
    ("_deadlines.py", None, "deadlines"),
    ("_lifecycle.py", None, "lifecycle and result"),
    ("_outcomes.py", None, "lifecycle and result"),
    ("_batch.py", None, "lifecycle and result"),
    ("_execution.py", None, "executor (_run, _execute, _pump)"),
    ("_attempts.py", None, "executor (_run, _execute, _pump)"),
    ("_clock.py", None, "executor (_run, _execute, _pump)"),
    ("asyncio/", None, "tasks and loop"),
    ("anyio/", None, "tasks and loop"),
    ("trio/", None, "tasks and loop"),
    ("outcome/", None, "tasks and loop"),
    ("~", None, "builtins"),
)


def part_of(path: str, function: str) -> str:
    """The part of the executor a profiled function belongs to."""
    for fragment, name, part in PARTS:
        if fragment in path and (name is None or name == function):
            return part
    return "other"


async def _cpu(run: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    await run()
    return time.thread_time() - cpu, time.perf_counter() - wall


async def _measure(calls_count: int, repeat: int, profile: bool) -> None:
    backend = anyio.lowlevel.current_token().backend_class.__name__
    async with Dispatcher() as dispatcher:
        dispatcher.add_function(lookup, annotations=READ_ONLY)
        calls, arguments = zero_calls(calls_count)
        by_hand = workers(Adapter(lookup), arguments)

        async def dispatch() -> None:
            await dispatcher.dispatch(calls)

        for _ in range(3):  # warm up
            await dispatch()
            await by_hand()
        figures: dict[str, list[tuple[float, float]]] = {"dispatcher": [], "workers": []}
        for rep in range(repeat):
            order = [("dispatcher", dispatch), ("workers", by_hand)]
            for name, run in order if rep % 2 else order[::-1]:
                figures[name].append(await _cpu(run))
        scale = 1e6 / calls_count
        cpu = {name: statistics.median(c for c, _ in samples) * scale for name, samples in figures.items()}
        wall = {name: statistics.median(w for _, w in samples) * scale for name, samples in figures.items()}
        least = {name: min(c for c, _ in samples) * scale for name, samples in figures.items()}
        ratios = [d[0] / w[0] for d, w in zip(figures["dispatcher"], figures["workers"], strict=True)]
        print(
            f"{backend}: CPU us/call dispatcher {cpu['dispatcher']:.2f}, workers {cpu['workers']:.2f}, "
            f"ratio {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}); "
            f"least CPU us/call {least['dispatcher']:.2f} / {least['workers']:.2f} = "
            f"{least['dispatcher'] / least['workers']:.2f}; "
            f"wall us/call {wall['dispatcher']:.2f} / {wall['workers']:.2f}"
        )
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(repeat):
                await dispatch()
            profiler.disable()
            print(profile_parts(profiler, repeat * calls_count))


def profile_parts(profiler: cProfile.Profile, calls: int) -> str:
    """Each part's own time per call (us, profiled) and its share, largest first."""
    stats = pstats.Stats(profiler)
    parts: dict[str, float] = defaultdict(float)
    for (path, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        parts[part_of(path, function)] += row[2]
    counts: dict[str, int] = defaultdict(int)
    for (path, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        counts[part_of(path, function)] += row[1]
    total = sum(parts.values())
    # Function calls per call do not move with the machine's load, unlike the times.
    lines = [f"  {'part':<36} {'us/call':>8} {'share':>6} {'functions/call':>15}"]
    for part, seconds in sorted(parts.items(), key=lambda item: -item[1]):
        lines.append(
            f"  {part:<36} {seconds / calls * 1e6:>8.2f} {seconds / total:>6.1%} {counts[part] / calls:>15.2f}"
        )
    lines.append(f"  {'all':<36} {total / calls * 1e6:>8.2f} {1:>6.1%} {sum(counts.values()) / calls:>15.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.executor_costs", description=__doc__)
    parser.add_argument("--backend", choices=("asyncio", "trio"), action="append")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="also sum cProfile's own times by part")
    args = parser.parse_args(argv)
    for backend in args.backend or ["asyncio", "trio"]:
        anyio.run(_measure, args.calls, args.repeat, args.profile, backend=backend)


if __name__ == "__main__":
    main()
