"""A one-iteration smoke run of the online limit's benchmark (`benchmarks/adaptive.py`), on the virtual clock."""

from __future__ import annotations

from benchmarks import adaptive
from benchmarks._report import Progress

TINY = adaptive.Config(
    phase=1.0,
    steady=1.0,
    clients=8,
    capacities=(4, 2),
    backends=("trio",),
    tune_calls=10,
    cost_calls=20,
    repeat=1,
    rate=40.0,
)


def test_a_tiny_run_reports_every_scenario_and_target() -> None:
    """Every scenario (the noisy server included) gives a row per strategy, and every target a figure."""
    result = adaptive.run(TINY, Progress(enabled=False))
    cases = {row.case for row in result.rows}
    for name in ("changing", "bursty", "bucket", "collapse", "noisy"):
        assert any(case.startswith(f"{name} (trio)") for case in cases), name
    assert len(result.targets) == 6
    assert all(target.value == target.value for target in result.targets)  # no NaN
    assert {"limit noisy", "steps changing"} <= set(result.series)


def test_the_noisy_server_varies_at_any_load_and_its_unloaded_p95_is_the_noises() -> None:
    """The noisy server's unloaded p95 is latency x (1 + 0.9 x noise); the other servers' is the latency."""
    scenarios = {scenario.name: scenario for scenario in adaptive.scenarios(TINY)}
    assert adaptive.unloaded_p95(TINY, scenarios["noisy"]) == TINY.latency * (1 + 0.9 * TINY.noise)
    assert adaptive.unloaded_p95(TINY, scenarios["changing"]) == TINY.latency
