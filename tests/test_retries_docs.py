"""Every example of docs/retries.md runs as written, on both backends, and prints what the guide shows."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import anyio
import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "retries.md"
TEXT = DOC.read_text()
EXAMPLES = re.findall(r"^```python\n(.*?)^```", TEXT, re.S | re.M)


def _shown_after(code: str) -> str | None:
    """The output the guide shows right after an example (a ```text block after "prints"), if any."""
    after = TEXT[TEXT.index(code) + len(code) :]
    match = re.match(r"```\n\nprints(?:[^`]|`(?!``))*```text\n(.*?)```", after, re.S)
    return match.group(1) if match else None


def test_the_guide_has_its_examples() -> None:
    """The guide keeps its five runnable examples, four with their output."""
    assert len(EXAMPLES) == 5
    assert [_shown_after(code) is not None for code in EXAMPLES] == [True, False, True, True, True]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("index", range(len(EXAMPLES)), ids=["a-retry", "the-defaults", "keys", "fail-fast", "faults"])
def test_example_runs_and_prints_what_the_guide_shows(
    index: int, backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example runs to the end (its own asserts hold) and prints exactly the output shown."""
    monkeypatch.setattr(anyio, "run", functools.partial(anyio.run, backend=backend))
    code = EXAMPLES[index]
    exec(compile(code, f"docs/retries.md (example {index + 1})", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out == (_shown_after(code) or "")
