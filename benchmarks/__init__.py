"""The dispatcher's benchmark suite: `python -m benchmarks [--quick] [--only NAME] [--repeat N]`.

Each workload module measures the dispatcher and its references in the same process, interleaved over
several repetitions, and returns a `WorkloadResult`; `_cli` runs them, prints the table and writes
`benchmarks/results/`. See docs/benchmarks.md for what each workload measures and how to read it.
"""
