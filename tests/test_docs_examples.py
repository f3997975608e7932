"""Every Python block of README.md and docs/*.md is run by a test, or says it is a fragment.

The convention: a block that is not a complete script starts with a ``# Fragment:`` comment saying what it
needs (``# Fragment: inside an async function, with `client` an entered mcp.Client``), and still compiles
as the body of an async function. Every other block is a script, and one of the tests below runs it as
written (which test, for each document, is the table `RUN_BY`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests import (
    test_agent_loop_docs,
    test_conflicts_docs,
    test_integrations_docs,
    test_readme,
    test_retries_docs,
    test_timeline_docs,
)

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", *sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md"))]


def _blocks(path: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / path).read_text(), re.S | re.M)


def _readme() -> set[str]:
    text = (ROOT / "README.md").read_text()
    turn = re.search(r"## An agent turn\n\n```python\n(.*?)```", text, re.S)
    timeline = re.search(test_readme.TIMELINE_EXAMPLE, text, re.S)
    assert turn is not None and timeline is not None
    # The README's two complete loops are docs/agent-loop.md's: test_agent_loop_docs checks they are the
    # same, under the same labels, and runs them.
    return {turn.group(1), timeline.group(1), *(_agent_loop() & set(_blocks("README.md")))}


def _agent_loop() -> set[str]:
    return {test_agent_loop_docs._loop(heading) for heading in test_agent_loop_docs.FORMATS}


def _integrations() -> set[str]:
    sections = test_integrations_docs._sections()
    run = {test_integrations_docs._scenario()}
    for heading in test_integrations_docs.FRAMEWORKS:
        run.add(test_integrations_docs._blocks(sections[heading], "python")[-1])
    # Each framework's own tools on the same turn, where the guide measures them (test_the_native_turn_...).
    native = getattr(test_integrations_docs, "_native", None)
    if native is not None:
        for section in native().values():
            run.update(test_integrations_docs._blocks(section, "python"))
    return run


def _every_block(path: str, runner: str) -> set[str]:
    # These guides' tests run every block they find; check the test still reads this guide.
    assert path in (ROOT / "tests" / runner).read_text(), f"{runner} no longer runs {path}"
    return set(_blocks(path))


# The blocks of each document that a test runs, and where.
RUN_BY: dict[str, Callable[[], set[str]]] = {
    "README.md": _readme,  # tests/test_readme.py, tests/test_agent_loop_docs.py
    "docs/agent-loop.md": _agent_loop,  # tests/test_agent_loop_docs.py
    "docs/conflicts.md": lambda: set(test_conflicts_docs.EXAMPLES),
    "docs/integrations.md": _integrations,  # tests/test_integrations_docs.py, against the real frameworks
    "docs/long-running.md": lambda: _every_block("docs/long-running.md", "test_long_running_docs.py"),
    "docs/mcp.md": lambda: _every_block("docs/mcp.md", "test_connections.py"),
    "docs/retries.md": lambda: set(test_retries_docs.EXAMPLES),
    "docs/timeline.md": lambda: set(test_timeline_docs.EXAMPLES),
    "docs/tuning.md": lambda: _every_block("docs/tuning.md", "test_tune.py"),
}


def _unmarked(path: str, blocks: list[str], run: set[str]) -> list[str]:
    """The first lines of the blocks that no test runs and that are not valid, marked fragments."""
    wrong = []
    for block in blocks:
        if block in run:
            continue
        first = block.splitlines()[0] if block.strip() else ""
        if not first.startswith("# Fragment: "):
            wrong.append(first)
            continue
        body = "".join(f"    {line}\n" for line in block.splitlines())
        compile(f"async def _fragment():\n{body}", f"{path} (fragment)", "exec")
    return wrong


@pytest.mark.parametrize("path", DOCUMENTS)
def test_every_block_is_run_by_a_test_or_marked_as_a_fragment(path: str) -> None:
    """A block is a script a test runs, or starts with `# Fragment:` and compiles inside an async function."""
    wrong = _unmarked(path, _blocks(path), RUN_BY[path]() if path in RUN_BY else set())
    assert not wrong, f"{path}: blocks neither run by a test nor marked as fragments, starting {wrong}"


def test_the_table_names_only_documents_that_exist() -> None:
    """Each document of `RUN_BY` exists, and every block a test is said to run is in it."""
    for path, run in RUN_BY.items():
        assert path in DOCUMENTS
        assert run() <= set(_blocks(path)), f"{path}: a test runs a block the document no longer has"


def test_the_check_catches_an_untested_script_and_a_broken_fragment() -> None:
    """The check's oracle: a script no test runs is reported; a fragment that does not compile raises."""
    script = "import anyio\n\nanyio.run(main)\n"
    assert _unmarked("x.md", [script, "# Fragment: needs x\nawait x()\n"], set()) == ["import anyio"]
    assert _unmarked("x.md", [script], {script}) == []
    with pytest.raises(SyntaxError):
        _unmarked("x.md", ["# Fragment: broken\nawait (\n"], set())
