"""The examples of docs/integrations.md run as written against the real frameworks, and print what they say.

Each framework section's last Python block runs after the shared scenario (the document's first block),
with the framework's own fake or scripted model; its output must equal the section's last `text` block.
That output ends with what the workspace recorded: reads together, writes alone and in order, the
untrusted server's tool alone, the refused deletion never run. A section whose framework is not
installed is skipped, naming the extra to install.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import anyio
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "integrations.md"

# section heading -> (the module it needs, the extra that installs it, the backends it runs on)
FRAMEWORKS = {
    "LangGraph": ("langgraph", "langgraph", ("asyncio",)),
    "LangChain": ("langchain.agents", "langchain", ("asyncio",)),
    "OpenAI Agents SDK": ("agents", "openai-agents", ("asyncio",)),
    "pydantic-ai": ("pydantic_ai", "pydantic-ai", ("asyncio",)),
    "Claude Agent SDK": ("claude_agent_sdk", "claude-agent-sdk", ("asyncio", "trio")),
    # Tested in a venv of its own (make adk): google-adk would downgrade packages of the dev venv.
    "Google ADK": ("google.adk", "adk", ("asyncio",)),
}
CHECKS = [
    "reads ran together: True",
    "writes ran alone, in order: True",
    "the untrusted tool ran alone: True",
    "delete_note ran: False",
]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def _sections() -> dict[str, str]:
    parts = re.split(r"^## ", DOC.read_text(), flags=re.M)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def _scenario() -> str:
    return _blocks(_sections()["The examples"], "python")[0]


def test_every_framework_has_a_section() -> None:
    """The document has one section per framework, and the table names each one's extra."""
    sections = _sections()
    for heading, (_, extra, _) in FRAMEWORKS.items():
        assert heading in sections, f"docs/integrations.md lost its {heading!r} section"
        assert f'[{extra}]"' in DOC.read_text(), f"the install line of {heading} is missing"


# The boundary the doc's printed output shows (any 16 hex digits in a real run).
DOC_BOUNDARY = "5f0c2a9e41d7b863"


@pytest.mark.parametrize(
    ("heading", "backend"),
    [(heading, backend) for heading, (_, _, backends) in FRAMEWORKS.items() for backend in backends],
)
def test_example_runs_and_prints_what_the_doc_says(
    heading: str, backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The framework's example runs the turn through the dispatcher and prints the documented output."""
    module, extra, _ = FRAMEWORKS[heading]
    if not _installed(module):
        pytest.skip(f"{module} is not installed: pip install -e '.[{extra}]'")
    section = _sections()[heading]
    code = _blocks(section, "python")[-1]
    expected = _blocks(section, "text")[-1]
    monkeypatch.setattr(anyio, "run", functools.partial(anyio.run, backend=backend))
    exec(compile(_scenario() + "\n" + code, f"docs/integrations.md ({heading})", "exec"), {"__name__": "__main__"})
    # Each result gets a fresh random boundary; the doc shows one of them.
    out = re.sub(r"untrusted-content-[0-9a-f]{16}", f"untrusted-content-{DOC_BOUNDARY}", capsys.readouterr().out)
    assert out == expected
    assert out.splitlines()[-4:] == CHECKS


@pytest.mark.parametrize("heading", list(FRAMEWORKS))
def test_every_block_of_the_section_compiles(heading: str) -> None:
    """Blocks that are not run (the Claude session that needs the CLI) are still valid Python."""
    for code in _blocks(_sections()[heading], "python"):
        compile(_scenario() + "\n" + code, f"docs/integrations.md ({heading})", "exec")


# What each framework does natively on the same turn: the subsections of "Natively, on the same turn".
NATIVE_CHECKS = [
    "notes calls in flight at once: 5",
    "reads ran together: True",
    "writes ran alone, in order: False",
    "the untrusted tool ran alone: False",
    "delete_note ran: True",
]
NATIVES = ["LangGraph", "LangChain", "OpenAI Agents SDK", "pydantic-ai", "Google ADK"]


def _native() -> dict[str, str]:
    parts = re.split(r"^### ", _sections()["Natively, on the same turn"], flags=re.M)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


def test_every_adapter_framework_has_a_native_measurement() -> None:
    """The native section measures LangGraph, LangChain, the OpenAI Agents SDK, pydantic-ai and Google ADK."""
    assert set(_native()) == set(NATIVES)


@pytest.mark.parametrize("heading", NATIVES)
def test_the_native_turn_runs_and_prints_what_the_doc_says(heading: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the adapter the framework runs all six calls at once: writes overlap, the deletion runs."""
    module, extra, _ = FRAMEWORKS[heading]
    if not _installed(module):
        pytest.skip(f"{module} is not installed: pip install -e '.[{extra}]'")
    section = _native()[heading]
    [code] = _blocks(section, "python")
    [expected] = _blocks(section, "text")
    exec(
        compile(_scenario() + "\n" + code, f"docs/integrations.md (native {heading})", "exec"), {"__name__": "__main__"}
    )
    out = capsys.readouterr().out
    assert out == expected
    # ADK's MCP toolset reaches the servers over HTTP, where the untrusted call's timing varies (see the doc).
    checks = [line for line in NATIVE_CHECKS if heading != "Google ADK" or "untrusted" not in line]
    assert out.splitlines() == checks


def test_the_versions_table_matches_the_installed_packages() -> None:
    """Each version in the "Versions tested" table is the one installed (skipped where one is missing)."""
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| ([0-9][^ |]*) \|$", _sections()["Versions tested"], flags=re.M)
    assert {name for name, _ in rows} >= {"langgraph", "openai-agents", "pydantic-ai-slim", "langchain-core"}
    for name, version in rows:
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        assert installed == version, f"docs/integrations.md says {name} {version}, {installed} is installed"


@pytest.mark.parametrize(
    "module", ["_common", "claude_agent_sdk", "google_adk", "langchain", "langgraph", "openai_agents", "pydantic_ai"]
)
def test_adapters_import_only_public_names_of_dispatcher(module: str) -> None:
    """The adapters use the dispatcher as users do: no import of a private `dispatcher._x` module."""
    tree = ast.parse((ROOT / "dispatcher" / "integrations" / f"{module}.py").read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module is not None]
    private = [name for name in imported if name.startswith("dispatcher._")]
    assert private == []
