"""The command line: choose workloads and sizes, run them, print and save the results."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import adaptive, batches, keys, mixed, overhead, parallel, peers, scale, through_mcp
from ._report import NO_VERDICTS, RESULTS_DIR, Progress, render, save_plots, write_results

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._results import WorkloadResult

__all__ = ["SKIPPED", "WORKLOADS", "chosen", "main"]


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    run: Callable[[Any, Progress], WorkloadResult]
    full: Any
    quick: Any
    # False: the quick run (CI) leaves it out unless named with --only.
    in_quick: bool = True


WORKLOADS: dict[str, Workload] = {
    "overhead": Workload(overhead.run, overhead.FULL, overhead.QUICK),
    "parallel": Workload(parallel.run, parallel.FULL, parallel.QUICK),
    "mixed": Workload(mixed.run, mixed.FULL, mixed.QUICK),
    "batches": Workload(batches.run, batches.FULL, batches.QUICK),
    "scale": Workload(scale.run, scale.FULL, scale.QUICK),
    "mcp": Workload(through_mcp.run, through_mcp.FULL, through_mcp.QUICK),
    "keys": Workload(keys.run, keys.FULL, keys.QUICK),
    "adaptive": Workload(adaptive.run, adaptive.FULL, adaptive.QUICK),
}

SKIPPED: dict[str, str] = {}
if (_missing := peers.missing()) is None:
    WORKLOADS["peers"] = Workload(peers.run, peers.FULL, peers.QUICK, in_quick=False)
else:
    SKIPPED["peers"] = _missing
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
    parser.add_argument(
        "--output",
        type=Path,
        default=RESULTS_DIR,
        metavar="DIR",
        help="where to write the JSON and plots (default: benchmarks/results/, ignored by git)",
    )
    return parser


def chosen(only: Sequence[str] | None, *, quick: bool) -> list[str]:
    """The workloads to run: those named by `--only` (each item may be comma-separated), else every
    installed workload (the quick run leaves out those not meant for CI).

    Raises:
        ValueError: A named workload is unknown, or cannot run here (its extra is not installed).
    """
    if not only:
        return [name for name, workload in WORKLOADS.items() if workload.in_quick or not quick]
    names = [name.strip() for item in only for name in item.split(",") if name.strip()]
    skipped = [f"{name}: {SKIPPED[name]}" for name in names if name in SKIPPED]
    if skipped:
        raise ValueError("; ".join(skipped))
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    return names


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark suite."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        names = chosen(args.only, quick=args.quick)
    except ValueError as exc:
        parser.error(str(exc))
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    command = "python -m benchmarks" + "".join(" " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    progress = Progress()
    if not args.only:
        for name, why in SKIPPED.items():
            progress.note(f"{name}: skipped: {why}")
        if args.quick:
            left_out = [name for name, workload in WORKLOADS.items() if not workload.in_quick]
            if left_out:
                progress.note(f"{', '.join(left_out)}: not part of the quick run (name it with --only to run it)")
    if args.quick:
        progress.note(NO_VERDICTS)
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
    render(results, verdicts=not args.quick)
    print(f"\n{len(results)} workload(s) in {elapsed:.1f} s: {command}")
    if args.no_save:
        return
    stamped, latest = write_results(results, command=command, quick=args.quick, elapsed=elapsed, directory=args.output)
    print(f"results: {stamped} (and {latest.name})")
    plots = save_plots(results, args.output)
    if isinstance(plots, str):
        print(f"plots: skipped: {plots}")
    elif plots:
        print("plots: " + ", ".join(str(path) for path in plots))
