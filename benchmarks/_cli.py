"""The command line: choose workloads and sizes, run them, print and save the results."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from . import batches, keys, mixed, overhead, parallel, scale, through_mcp
from ._report import Progress, render, save_plots, write_results

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._results import WorkloadResult

__all__ = ["SKIPPED", "WORKLOADS", "main"]


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    run: Callable[[Any, Progress], WorkloadResult]
    full: Any
    quick: Any


WORKLOADS: dict[str, Workload] = {
    "overhead": Workload(overhead.run, overhead.FULL, overhead.QUICK),
    "parallel": Workload(parallel.run, parallel.FULL, parallel.QUICK),
    "mixed": Workload(mixed.run, mixed.FULL, mixed.QUICK),
    "batches": Workload(batches.run, batches.FULL, batches.QUICK),
    "scale": Workload(scale.run, scale.FULL, scale.QUICK),
    "mcp": Workload(through_mcp.run, through_mcp.FULL, through_mcp.QUICK),
    "keys": Workload(keys.run, keys.FULL, keys.QUICK),
}

SKIPPED: dict[str, str] = {}
try:
    # Imported by name: workload 7 needs dispatcher.RetryPolicy, which older versions lack.
    _faults = importlib.import_module(f"{__package__}.faults")
except ImportError:
    SKIPPED["faults"] = "needs dispatcher.RetryPolicy, which this version lacks"
else:
    WORKLOADS["faults"] = Workload(_faults.run, _faults.FULL, _faults.QUICK)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark the dispatcher against references in the same process.",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions (CI)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only this workload (repeatable, or comma-separated): {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--repeat", type=int, metavar="N", help="timed repetitions of every variant")
    parser.add_argument("--no-save", action="store_true", help="print only; write no JSON or plots")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark suite."""
    parser = _parser()
    args = parser.parse_args(argv)
    names = list(WORKLOADS)
    if args.only:
        names = [name.strip() for item in args.only for name in item.split(",") if name.strip()]
        unknown = [name for name in names if name not in WORKLOADS]
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    command = "python -m benchmarks" + "".join(" " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    progress = Progress()
    if not args.only:
        for name, why in SKIPPED.items():
            progress.note(f"{name}: skipped: {why}")
    started = time.perf_counter()
    results: list[WorkloadResult] = []
    for name in names:
        workload = WORKLOADS[name]
        config = workload.quick if args.quick else workload.full
        if args.repeat is not None:
            config = dataclasses.replace(config, repeat=args.repeat)
        progress.section(name)
        results.append(workload.run(config, progress))
        progress.done()
    elapsed = time.perf_counter() - started
    render(results)
    print(f"\n{len(results)} workload(s) in {elapsed:.1f} s: {command}")
    if args.no_save:
        return
    stamped, latest = write_results(results, command=command, quick=args.quick, elapsed=elapsed)
    print(f"results: {stamped} (and {latest.name})")
    plots = save_plots(results)
    if isinstance(plots, str):
        print(f"plots: skipped: {plots}")
    elif plots:
        print("plots: " + ", ".join(str(path) for path in plots))
