"""Every example of docs/long-running.md runs as written, against server-everything (tests/everything.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from .everything import ROOT, everything

pytestmark = pytest.mark.reference_servers

GUIDE = Path(ROOT) / "docs" / "long-running.md"
EXPECTED = [
    ["ok", "True"],
    [
        "ok [1.0, 2.0, 3.0]",
        "timeout timed out: no progress from the server within idle_timeout=1.0s (after 3 attempts)",
    ],
    ["Server 'everything' (trusted) asks, during call '1' (trigger-elicitation-request).", "ok - Name: Ada"],
    [
        "approve 1 ? trigger-elicitation-request may make destructive changes",
        "approve 2 ? trigger-elicitation-request may make destructive changes",
        "Server 'everything' (untrusted) asks, during call '1' (trigger-elicitation-request).",
        "Server 'everything' (untrusted) asks, during call '2' (trigger-elicitation-request).",
        "['ok', 'ok']",
        "approval_asked:1 approval_answered:1 approval_asked:2 approval_answered:2 "
        "question_asked:1 question_answered:1 question_asked:2 question_answered:2",
    ],
]


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.S | re.M)


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_the_guide_runs_as_written(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Each example of docs/long-running.md runs from the repository's root and prints what the guide says."""
    everything()  # skips (or fails under CI) when server-everything is not installed
    blocks = _blocks()
    assert len(blocks) == len(EXPECTED)
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        exec(compile(blocks[index], f"docs/long-running.md (example {index + 1})", "exec"), {"__name__": "__main__"})
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out.splitlines() == EXPECTED[index]
