"""scripts/conformance.py reads the suite's results as it should, and its expected list says why each failure fails."""

from __future__ import annotations

import json
import tomllib
from typing import TYPE_CHECKING

from scripts import conformance

if TYPE_CHECKING:
    from pathlib import Path


def test_results_are_read_per_scenario_with_their_failed_checks(tmp_path: Path) -> None:
    """A scenario passes when no check is a FAILURE or WARNING; the time stamp is cut off its directory's name."""
    runs = {
        "initialize-2026-12-02T03-36-43-906Z": [{"id": "a", "status": "SUCCESS"}, {"id": "b", "status": "INFO"}],
        "auth/scope-step-up-2026-12-02T03-36-43-907Z": [{"id": "c", "status": "FAILURE"}],
        "sse-retry-2026-12-02T03-36-43-906Z": [{"id": "d", "status": "WARNING"}],
    }
    for name, checks in runs.items():
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "checks.json").write_text(json.dumps(checks))
    assert conformance._outcomes(tmp_path) == {
        "initialize": (True, []),
        "auth/scope-step-up": (False, ["c: FAILURE"]),
        "sse-retry": (False, ["d: WARNING"]),
    }


def test_every_expected_failure_says_why() -> None:
    """Each scenario is listed as "pass" or "fail: why", never a bare fail or a typo."""
    expected = tomllib.loads(conformance.EXPECTED.read_text())["scenarios"]
    assert "elicitation-sep1034-client-defaults" in expected
    for name, want in expected.items():
        assert want == "pass" or (want.startswith("fail: ") and len(want) > 20), (name, want)
