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
from ._report import (
    NO_VERDICTS,
    REFERENCE,
    RESULTS_DIR,
    Progress,
    new_run,
    render,
    render_summary,
    save_plots,
    summarize,
    write_results,
)
from ._results import Run

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


# In the order of their numbers (docs/benchmarks.md), which is the order the report shows them in.
WORKLOADS: dict[str, Workload] = {
    "overhead": Workload(overhead.run, overhead.FULL, overhead.QUICK),
    "parallel": Workload(parallel.run, parallel.FULL, parallel.QUICK),
    "mixed": Workload(mixed.run, mixed.FULL, mixed.QUICK),
    "batches": Workload(batches.run, batches.FULL, batches.QUICK),
    "scale": Workload(scale.run, scale.FULL, scale.QUICK),
    "mcp": Workload(through_mcp.run, through_mcp.FULL, through_mcp.QUICK),
}

SKIPPED: dict[str, str] = {}
try:
    # Imported by name: workload 7 needs dispatcher.RetryPolicy, which older versions lack.
    _faults = importlib.import_module(f"{__package__}.faults")
except ImportError:
    SKIPPED["faults"] = "needs dispatcher.RetryPolicy, which this version lacks"
else:
    WORKLOADS["faults"] = Workload(_faults.run, _faults.FULL, _faults.QUICK)
WORKLOADS["keys"] = Workload(keys.run, keys.FULL, keys.QUICK)
if (_missing := peers.missing()) is None:
    WORKLOADS["peers"] = Workload(peers.run, peers.FULL, peers.QUICK, in_quick=False)
else:
    SKIPPED["peers"] = _missing
WORKLOADS["adaptive"] = Workload(adaptive.run, adaptive.FULL, adaptive.QUICK)


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
        metavar="DIR",
        help="where to write the JSON and plots (default: benchmarks/results/, ignored by git); "
        "with --show, where to draw the plots of that run",
    )
    parser.add_argument(
        "--show",
        type=Path,
        metavar="FILE",
        help="run nothing: print the report of a saved run (a results JSON, such as benchmarks/results/latest.json)",
    )
    parser.add_argument(
        "--reference",
        type=Path,
        default=REFERENCE,
        metavar="FILE",
        help="the run each target is set against (default: benchmarks/reference.json, the published figures)",
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


def _load_reference(path: Path, progress: Progress) -> Run | None:
    try:
        return Run.load(path)
    except (OSError, ValueError) as exc:
        progress.note(f"reference: none, so no reference figures ({exc})")
        return None


def _report(run: Run, reference: Run | None, reference_path: Path, files: Sequence[str]) -> None:
    """The first screen, then the details of every workload, then the run's totals again."""
    summary = summarize(run, reference)
    render_summary(summary, reference_path=_shown(reference_path), files=files)
    render(run.workloads, verdicts=run.verdicts)
    totals = (
        f"{summary.count('met')} met, {summary.count('not met')} not met"
        + (f", {summary.count('missing')} missing" if summary.count("missing") else "")
        if run.verdicts
        else "figures only, no verdicts (quick run)"
    )
    print(f"\n{len(run.workloads)} workload(s) in {run.elapsed_seconds:.1f} s: {run.command}")
    print(f"targets: {totals}; every target is on the report's first screen, at the top of this output.")


def _shown(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when it is under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _plots_line(plots: list[Path] | str) -> str:
    if isinstance(plots, str):
        return f"plots: skipped: {plots}"
    if not plots:
        return "plots: none (no workload of this run has a plot)"
    return "plots: " + ", ".join(_shown(path) for path in plots)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark suite (or, with --show, print the report of a saved run)."""
    parser = _parser()
    args = parser.parse_args(argv)
    progress = Progress()
    if args.show is not None:
        try:
            run = Run.load(args.show)
        except (OSError, ValueError) as exc:
            parser.error(f"--show: {exc}")
        drawn = [] if args.output is None else [_plots_line(save_plots(run.workloads, args.output))]
        _report(run, _load_reference(args.reference, progress), args.reference, drawn)
        return
    try:
        names = chosen(args.only, quick=args.quick)
    except ValueError as exc:
        parser.error(str(exc))
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    command = "python -m benchmarks" + "".join(" " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    output = args.output if args.output is not None else RESULTS_DIR
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
    run = new_run(results, command=command, quick=args.quick, elapsed=time.perf_counter() - started)
    files: list[str] = []
    if not args.no_save:
        stamped, latest = write_results(run, output)
        files.append(f"results: {_shown(stamped)} (and {latest.name})")
        files.append(_plots_line(save_plots(results, output)))
    _report(run, _load_reference(args.reference, progress), args.reference, files)
