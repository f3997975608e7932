"""Replay one seed of the chaos scenario and print its trace: ``python -m tests.chaos.replay SEED``.

The run is the one `tests/chaos/test_inprocess.py` makes for that seed (trio, `MockClock`, seeded
scheduler), so a seed reported by a failing test prints the same events, in the same order, at the
same virtual times, followed by the server's ledger and any violated invariant.
"""

from __future__ import annotations

import argparse

from .scenario import run_replayable


def main(argv: list[str] | None = None) -> int:
    """Run the seed, print its trace and violations; exit 1 if an invariant was violated."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.replay", description=__doc__)
    parser.add_argument("seed", type=int)
    parser.add_argument("--batches", type=int, default=3, help="batches per run (the quick suite uses 3)")
    args = parser.parse_args(argv)
    report = run_replayable(args.seed, batches=args.batches)
    for line in report.trace:
        print(line)
    counts = f"{report.batches} batches, {report.calls} calls, {report.faults} faults, {report.cuts} cuts"
    print(f"# seed {report.seed}: {counts}")
    for violation in report.violations:
        print(f"VIOLATION {violation}")
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
