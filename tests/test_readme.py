"""The README's example runs as written and prints what the README says."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import anyio
import pytest
import trio.testing

from tests import forked

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.subprocess
def test_readme_agent_turn_runs() -> None:
    """The agent-turn example runs, two writes then three reads, and the invented tool fails alone."""
    text = README.read_text()
    match = re.search(r"## An agent turn\n\n```python\n(.*?)```", text, re.S)
    assert match is not None, "the README lost its agent-turn example"
    done = forked.run([sys.executable, "-c", match.group(1)], cwd=README.parent)
    assert done.returncode == 0, "the example failed: its traceback is in the captured stderr"
    lines = done.stdout.splitlines()
    assert lines[-6:] == [
        "call_1 ok created note 'todo'",
        "call_2 ok set note 'done'",
        "call_3 ok buy milk",
        "call_4 ok done",
        "call_5 ok 3",
        "call_6 failed unknown tool 'delete_everything'",
    ]


TIMELINE_EXAMPLE = (
    r"### What ran when: a timeline of any batch\n\n.*?```python\n(.*?)```\n\nprints .*?```text\n(.*?)```"
)


@pytest.mark.subprocess
def test_readme_timeline_example_prints_what_the_readme_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The timeline example prints, on a virtual clock, exactly the timeline shown, and writes a trace."""
    match = re.search(TIMELINE_EXAMPLE, README.read_text(), re.S)
    assert match is not None, "the README lost its timeline example"
    code, shown = match.groups()
    # The same script on trio's virtual clock, where the 50 ms calls take exactly 50 ms: in this process (it
    # imports nothing a fresh interpreter would not), with anyio.run given the clock.
    run = anyio.run
    clock = {"clock": trio.testing.MockClock(autojump_threshold=0)}
    monkeypatch.setattr(anyio, "run", lambda f: run(f, backend="trio", backend_options=clock))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})  # the README's own code
    assert capsys.readouterr().out == shown
    trace = json.loads((tmp_path / "batch.trace.json").read_text())
    threads = [event["args"]["name"] for event in trace["traceEvents"] if event["name"] == "thread_name"]
    assert threads == ["c1 set_note", "c2 read_note", "c3 search_notes", "c4 read_note", "c5 append_note"]
    # On the real clock, as written, it runs too.
    done = forked.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(README.parent)})
    assert done.returncode == 0, "the example failed: its traceback is in the captured stderr"
    assert "for the write before it (c1)" in done.stdout


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_every_python_snippet_is_run_or_says_it_is_a_fragment() -> None:
    """A README snippet is either run by a test (the agent turn, the two loops) or marked as a fragment.

    A fragment starts with a `# Fragment:` comment saying what it needs, and still compiles as the body
    of an async function.
    """
    text = README.read_text()
    run_by_tests = {
        "agent turn": re.search(r"## An agent turn\n\n```python\n(.*?)```", text, re.S),
        **{
            label: re.search(rf"^With the {label} API \(\d+ lines\):\n\n```python\n(.*?)^```", text, re.S | re.M)
            for label in ("Anthropic Messages", "OpenAI Chat Completions")
        },
    }
    run_by_tests["timeline"] = re.search(TIMELINE_EXAMPLE, text, re.S)
    tested = {match.group(1) for match in run_by_tests.values() if match is not None}
    assert len(tested) == 4, "the README lost one of its tested examples"
    for block in _python_blocks(text):
        if block in tested:
            continue
        first = block.splitlines()[0]
        assert first.startswith("# Fragment:"), f"a README snippet is neither run by a test nor a fragment: {first!r}"
        body = "".join(f"    {line}\n" for line in block.splitlines())
        compile(f"async def _fragment():\n{body}", "README fragment", "exec")


def test_install_line_names_the_distribution_of_pyproject() -> None:
    """The README's install line installs the distribution pyproject.toml builds."""
    pyproject = (README.parent / "pyproject.toml").read_text()
    name = re.search(r'^name = "(.+)"$', pyproject, re.M)
    assert name is not None
    assert f"pip install {name.group(1)}" in README.read_text()


def test_quick_start_says_what_each_command_does_and_how_long_it_takes() -> None:
    """Every command of the quick start has a comment with what it does and a duration."""
    text = README.read_text()
    block = re.search(r"## Quick start.*?```sh\n(.*?)```", text, re.S)
    assert block is not None
    lines = block.group(1).strip().splitlines()
    assert [line.split("#")[0].strip() for line in lines][:2] == ["make bench-quick", "make test"]
    for line in lines:
        command, _, comment = line.partition("#")
        assert comment.strip(), f"{command.strip()} says nothing about what it does"
        assert re.search(r"\d+ (?:minutes?|seconds?)|a minute|a few seconds", comment), f"{command.strip()}: how long?"


def test_every_install_hint_names_the_distribution_and_an_existing_extra() -> None:
    """`pip install X[extra]` in docs, messages and docstrings names this distribution and a real extra."""
    root = README.parent
    pyproject = (root / "pyproject.toml").read_text()
    name = re.search(r'^name = "(.+)"$', pyproject, re.M)
    assert name is not None
    extras = set(re.findall(r"^([a-z-]+) = \[", pyproject.split("[project.optional-dependencies]")[1], re.M))
    sources = [root / "README.md", root / "SECURITY.md", *(root / "docs").glob("*.md")]
    sources += [*(root / "dispatcher").rglob("*.py"), *(root / "benchmarks").rglob("*.py")]
    hints = [
        (path.name, hint)
        for path in sources
        for hint in re.findall(r"pip install (?:-e )?[\"']?([\w.-]+\[[\w,-]+\])", path.read_text())
    ]
    assert hints
    for where, hint in hints:
        package, _, wanted = hint.partition("[")
        assert package in (name.group(1), "."), f"{where}: pip install {hint} installs another distribution"
        for extra in wanted.rstrip("]").split(","):
            assert extra in extras, f"{where}: pip install {hint}: no extra {extra!r} in pyproject.toml"
