"""Every example of docs/timeline.md runs as written, on both backends, and shows what the text says."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import anyio
import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "timeline.md"
EXAMPLES = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)


def test_the_guide_has_its_examples() -> None:
    """The guide keeps its two runnable examples."""
    assert len(EXAMPLES) == 2


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("index", range(len(EXAMPLES)), ids=["results-or-events", "session"])
def test_example_runs(
    index: int,
    backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example runs to the end (its own asserts hold) and prints its timeline or waits."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(anyio, "run", functools.partial(anyio.run, backend=backend))
    exec(compile(EXAMPLES[index], str(DOC), "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    if index == 0:
        assert "for the write before it (c1)" in out.splitlines()[0]
        assert "until c1 ended" in out.splitlines()[1]
    else:
        assert [line for line in out.splitlines() if line.startswith("batch")] == ["batch 1", "batch 2", "batch 3"]
        trace = json.loads((tmp_path / "session.trace.json").read_text())
        processes = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
        assert processes == ["batch 1", "batch 2", "batch 3"]


def test_the_text_shown_is_what_text_draws() -> None:
    """The "Reading the text" sample is the first rows of the README example's output, as drawn today."""
    readme = (DOC.parent.parent / "README.md").read_text()
    shown = re.search(r"## Reading the text\n\n```text\n(.*?)```", DOC.read_text(), re.S)
    printed = re.search(r"### What ran when.*?```text\n(.*?)```", readme, re.S)
    assert shown is not None and printed is not None
    assert printed.group(1).startswith(shown.group(1))
