"""Choosing the executor: the dispatcher against 16 hand-written workers, for one executor or two.

Run it with ``python -m benchmarks.executors [--quick] [--json FILE] [--against FILE]``. It measures
whichever `dispatcher` Python imports, in one process, on asyncio and trio, interleaved repetition by
repetition with the reference: 16 worker tasks written by hand that pull the same calls in order and do
the same SDK work (`_tools.workers`: validate, call, convert, through the dispatcher's own adapter).

Cases (every one but the unlimited one at the default ``max_concurrency=16``):

- zero latency: one batch of 1,000 calls of a tool that returns without waiting (us per call);
- 1 ms reads: one batch of 2,000 reads that each sleep 1 ms (makespan, ms; ideal 125 ms);
- 5 ms reads: one batch of 400 reads that each sleep 5 ms (makespan, ms; ideal 125 ms);
- 1 ms reads, no limit: the 2,000 reads of 1 ms through a dispatcher with ``max_concurrency=None``, against
  one task per call written by hand in one task group (`_tools.task_per_call`, the same adapter): with no
  limit there are no 16 workers to compare with (makespan, ms; ideal 1 ms);
- many calls: one batch of 100,000 zero-latency calls (20,000 with ``--quick``; us per call), with
  the longest stall of a ticker that sleeps 1 ms at a time in the same loop, and the longest pause of
  the interpreter's garbage collector during the same batch (ms).

The executor the package replaced (runner tasks reused from call to call) is not in the package any
more. To compare with it, measure it from a checkout of the commit that had it, importing that
checkout's `dispatcher` and this `benchmarks`, then render both runs together::

    git worktree add /tmp/oldexec <commit>
    mkdir -p /tmp/bench && ln -sfn "$PWD/benchmarks" /tmp/bench/benchmarks
    (cd /tmp/bench && PYTHONPATH=/tmp/oldexec python -m benchmarks.executors --quick --json /tmp/old.json)
    python -m benchmarks.executors --quick --json /tmp/new.json --against /tmp/old.json

Each run records which `dispatcher` it imported. The table printed is the one in docs/benchmarks.md
("Choosing the executor"): medians with their min-max, and the median (min-max) of the paired ratios
dispatcher / reference by hand of each run (a case the other run lacks shows as not measured there).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

import dispatcher as package
from dispatcher import Dispatcher, ToolCall

from ._measure import Stat, interleave, paired_ratios
from ._report import Progress
from ._tools import READ_ONLY, Adapter, dispatch_once, lookup, sleep_read, task_per_call, workers, zero_calls

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

__all__ = ["Config", "main", "measure", "stall_while"]

DISPATCHER = "dispatcher"
WORKERS = "16 workers by hand"
# The column of the references by hand: the 16 workers, or with no limit a task per call.
BY_HAND = "by hand (16 workers; no limit: a task per call)"
VARIANTS = [DISPATCHER, WORKERS]


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    calls: int = 1000
    reads_1ms: int = 2000
    reads_5ms: int = 400
    repeat: int = 15
    big: int = 100_000
    big_repeat: int = 3


QUICK = Config(repeat=5, big=20_000, big_repeat=3)


async def stall_while(run: Callable[[], Awaitable[float]]) -> tuple[float, float]:
    """Run `run` beside a ticker that sleeps 1 ms at a time; return its figure and the longest tick (ms)."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        last = anyio.current_time()
        while not done:
            await anyio.sleep(0.001)
            now = anyio.current_time()
            worst = max(worst, now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.005)
        figure = await run()
        done = True
    return figure, (worst - 0.001) * 1e3


class _CollectorPauses:
    """The longest pause of the cyclic garbage collector while it is entered (ms)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._since = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._since = time.perf_counter()
        else:
            self.longest = max(self.longest, (time.perf_counter() - self._since) * 1e3)

    def __enter__(self) -> _CollectorPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._callback)


def _per(run: Callable[[], Awaitable[float]], scale: float) -> Callable[[], Awaitable[float]]:
    async def scaled() -> float:
        return await run() * scale

    return scaled


def _read_calls(n: int, seconds: float, prefix: str) -> tuple[list[ToolCall], list[dict[str, Any]]]:
    arguments = [{"key": f"k{i}", "seconds": seconds} for i in range(n)]
    return [ToolCall(f"{prefix}{i}", "sleep_read", args) for i, args in enumerate(arguments)], arguments


async def _measure(config: Config, progress: Progress) -> dict[str, dict[str, list[float]]]:
    """case -> variant -> samples."""
    out: dict[str, dict[str, list[float]]] = {}
    fast = Adapter(lookup)
    slow = Adapter(sleep_read)
    async with Dispatcher() as dispatcher:
        dispatcher.add_function(lookup, annotations=READ_ONLY)
        dispatcher.add_function(sleep_read, annotations=READ_ONLY)
        calls, arguments = zero_calls(config.calls)
        out["zero latency, 1,000 calls (us/call)"] = await interleave(
            {
                DISPATCHER: _per(dispatch_once(dispatcher, calls), 1e6 / config.calls),
                WORKERS: _per(workers(fast, arguments), 1e6 / config.calls),
            },
            config.repeat,
            progress,
            label="zero latency",
        )
        for count, seconds, label in ((config.reads_1ms, 0.001, "1 ms"), (config.reads_5ms, 0.005, "5 ms")):
            reads, read_arguments = _read_calls(count, seconds, prefix=f"r{label[0]}-")
            out[f"{count:,} reads of {label}, makespan (ms)"] = await interleave(
                {
                    DISPATCHER: _per(dispatch_once(dispatcher, reads), 1e3),
                    WORKERS: _per(workers(slow, read_arguments), 1e3),
                },
                max(3, config.repeat // 2),
                progress,
                label=f"{label} reads",
            )
        async with Dispatcher(max_concurrency=None) as unlimited:
            unlimited.add_function(sleep_read, annotations=READ_ONLY)
            reads, read_arguments = _read_calls(config.reads_1ms, 0.001, prefix="u-")
            # The reference's samples stand under WORKERS, the column of every case's reference by hand.
            out[
                f"{config.reads_1ms:,} reads of 1 ms, no limit, against a task per call, makespan (ms)"
            ] = await interleave(
                {
                    DISPATCHER: _per(dispatch_once(unlimited, reads), 1e3),
                    WORKERS: _per(task_per_call(slow, read_arguments), 1e3),
                },
                max(3, config.repeat // 2),
                progress,
                label="1 ms reads, no limit",
            )
        big, big_arguments = zero_calls(config.big, prefix="x")
        big_case = f"{config.big:,} calls (us/call)"
        stall_case = f"{config.big:,} calls: longest loop stall (ms)"
        pause_case = f"{config.big:,} calls: longest collector pause (ms)"
        variants = {
            DISPATCHER: _per(dispatch_once(dispatcher, big), 1e6 / config.big),
            WORKERS: _per(workers(fast, big_arguments), 1e6 / config.big),
        }
        for case in (big_case, stall_case, pause_case):
            out[case] = {variant: [] for variant in VARIANTS}
        for rep in range(config.big_repeat):
            shift = rep % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                progress.update(f"{big_case}: {variant}, repetition {rep + 1}")
                gc.collect()
                with _CollectorPauses() as pauses:
                    figure, stall = await stall_while(variants[variant])
                out[big_case][variant].append(figure)
                out[stall_case][variant].append(stall)
                out[pause_case][variant].append(pauses.longest)
    return out


def measure(config: Config, progress: Progress | None = None) -> dict[str, Any]:
    """Both backends' samples (backend -> case -> variant -> samples), with what was measured."""
    progress = progress if progress is not None else Progress()
    return {
        "dispatcher": str(Path(package.__file__).parent),
        "load": os.getloadavg(),
        "samples": {backend: anyio.run(_measure, config, progress, backend=backend) for backend in ("asyncio", "trio")},
    }


def _rows(run: dict[str, Any]) -> Iterator[tuple[str, str, Stat, Stat, Stat]]:
    for backend, cases in run["samples"].items():
        for case, samples in cases.items():
            ratio = Stat.of(paired_ratios(samples[DISPATCHER], samples[WORKERS]))
            yield backend, case, Stat.of(samples[DISPATCHER]), Stat.of(samples[WORKERS]), ratio


def _figure(stat: Stat) -> str:
    return f"{stat.median:,.1f} ({stat.min:,.1f}-{stat.max:,.1f})"


def render(run: dict[str, Any], against: dict[str, Any] | None = None) -> str:
    """A markdown table: each case on each backend, the workers, the dispatcher, and the paired ratios;
    with `against`, the other run's dispatcher and ratio beside them."""
    if against is None:
        lines = [
            f"| backend | case | {BY_HAND} | {DISPATCHER} | {DISPATCHER} / by hand |",
            "|---|---|---:|---:|---|",
        ]
        for backend, case, ours, reference, ratio in _rows(run):
            lines.append(
                f"| {backend} | {case} | {_figure(reference)} | {_figure(ours)} | "
                f"{ratio.median:.2f} ({ratio.min:.2f}-{ratio.max:.2f}) |"
            )
        return "\n".join(lines)
    theirs = {(backend, case): (ours, ratio) for backend, case, ours, _, ratio in _rows(against)}
    lines = [
        f"| backend | case | {BY_HAND} | this run | / by hand | other run | / by hand |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for backend, case, ours, reference, ratio in _rows(run):
        other = theirs.get((backend, case))
        if other is None:
            beside = "not measured | |"  # (a case the other run did not have)
        else:
            before, before_ratio = other
            beside = f"{_figure(before)} | {before_ratio.median:.2f} ({before_ratio.min:.2f}-{before_ratio.max:.2f}) |"
        lines.append(
            f"| {backend} | {case} | {_figure(reference)} | {_figure(ours)} | "
            f"{ratio.median:.2f} ({ratio.min:.2f}-{ratio.max:.2f}) | {beside}"
        )
    load = ", ".join(f"{value:.1f}" for value in run["load"])
    other_load = ", ".join(f"{value:.1f}" for value in against["load"])
    lines.append("")
    lines.append(f"This run: `{run['dispatcher']}`, load average {load}.")
    lines.append(f"Other run: `{against['dispatcher']}`, load average {other_load}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.executors", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and a 20,000-call batch")
    parser.add_argument("--json", type=Path, help="also write this run's samples to this file")
    parser.add_argument("--against", type=Path, help="a run's samples (--json) to show beside this one")
    args = parser.parse_args(argv)
    run = measure(QUICK if args.quick else Config())
    if args.json is not None:
        args.json.write_text(json.dumps(run))
    against = json.loads(args.against.read_text()) if args.against is not None else None
    print(render(run, against))


if __name__ == "__main__":
    main()
