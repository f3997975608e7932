"""The README's example runs as written and prints what the README says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_agent_turn_runs() -> None:
    """The agent-turn example runs, two writes then three reads, and the invented tool fails alone."""
    text = README.read_text()
    match = re.search(r"## An agent turn\n\n```python\n(.*?)```", text, re.S)
    assert match is not None, "the README lost its agent-turn example"
    done = subprocess.run(
        [sys.executable, "-c", match.group(1)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=README.parent,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-6:] == [
        "call_1 ok created note 'todo'",
        "call_2 ok set note 'done'",
        "call_3 ok buy milk",
        "call_4 ok done",
        "call_5 ok 3",
        "call_6 failed unknown tool 'delete_everything'",
    ]
