"""Every example of docs/conflicts.md runs as written and checks what the text says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "conflicts.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_guide_has_its_examples() -> None:
    """The guide keeps its five runnable examples."""
    assert len(EXAMPLES) == 5


@pytest.mark.parametrize("source", EXAMPLES, ids=[f"example-{i}" for i in range(len(EXAMPLES))])
def test_example_runs(source: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The example runs to the end (its own asserts hold) and prints what it found."""
    exec(compile(source, str(DOC), "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip()
