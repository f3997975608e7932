"""The catalogue's names and the effective annotations of each tool."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp.types import CallToolResult, ToolAnnotations

from dispatcher._core._annotations import SPEC_DEFAULTS, effective_annotations
from dispatcher._core._catalog import Catalog, ToolEntry

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
HINTS = ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint")


class _Nothing:
    def prepare(self, arguments: Any) -> Any:
        return arguments

    async def invoke(self, prepared: Any, lease: object = None) -> CallToolResult:
        raise AssertionError("not called")


def entry(server: str | None, tool: str) -> tuple[ToolEntry, _Nothing]:
    return ToolEntry(tool, server, tool, SPEC_DEFAULTS), _Nothing()


hint = st.one_of(st.none(), st.booleans())
tool_annotations = st.builds(
    ToolAnnotations, read_only_hint=hint, destructive_hint=hint, idempotent_hint=hint, open_world_hint=hint
)


@given(
    declared=st.one_of(st.none(), tool_annotations),
    override=st.one_of(st.none(), tool_annotations),
    trusted=st.booleans(),
)
def test_effective_annotations_precedence(
    declared: ToolAnnotations | None, override: ToolAnnotations | None, trusted: bool
) -> None:
    """Override beats a trusted declaration beats the spec default; untrusted declarations never count."""
    effective = effective_annotations(declared, trusted=trusted, override=override)
    for name in HINTS:
        value = getattr(effective, name)
        assert isinstance(value, bool)
        from_override = getattr(override, name) if override is not None else None
        from_server = getattr(declared, name) if declared is not None and trusted else None
        expected = from_override if from_override is not None else from_server
        assert value == (expected if expected is not None else getattr(SPEC_DEFAULTS, name))


def test_untrusted_declarations_are_the_worst_case() -> None:
    """A server that claims everything safe but is untrusted gets the spec defaults."""
    liar = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    assert effective_annotations(liar, trusted=False) == SPEC_DEFAULTS
    assert effective_annotations(None, trusted=True) == SPEC_DEFAULTS


@given(st.lists(st.tuples(st.sampled_from(["s1", "s.2", "x" * 70]), st.text(min_size=1, max_size=80)), max_size=20))
def test_catalogue_names_are_unique_and_valid(tools: list[tuple[str, str]]) -> None:
    """Whatever servers call their tools, catalogue names are unique and accepted by LLM APIs."""
    catalog = Catalog()
    for server, _ in tools:
        catalog.add_server(server)
    catalog.put(entry(server, tool) for server, tool in tools)
    names = [e.name for e in catalog.entries()]
    assert len(names) == len(set(names)) == len({(s, t) for s, t in tools})
    assert all(NAME.match(name) for name in names)
    for e in catalog.entries():
        resolution = catalog.resolve(e.name)
        assert resolution.entry is not None and (resolution.entry.server, resolution.entry.tool) == (e.server, e.tool)
        by_server = catalog.resolve(e.tool, e.server)
        assert by_server.entry is not None and by_server.entry.name == e.name


def test_a_clashing_name_is_prefixed_for_the_later_arrival_only() -> None:
    """The same tool name on a second server is prefixed by server; the first keeps its name."""
    catalog = Catalog()
    catalog.add_server("a")
    catalog.add_server("b")
    catalog.put([entry("a", "search"), entry("a", "only_a"), entry("b", "search")])
    assert [e.name for e in catalog.entries()] == ["search", "only_a", "b__search"]
    resolution = catalog.resolve("search")
    assert resolution.entry is not None and resolution.entry.server == "a"
    assert catalog.resolve("only_a").entry is not None


def test_a_name_shared_by_no_catalogue_entry_is_ambiguous() -> None:
    """A tool name two servers offer under prefixed names only resolves with a server; the error lists both."""
    catalog = Catalog()
    catalog.add_server("a")
    catalog.add_server("b")
    catalog.put([entry("a", "files.read"), entry("b", "files.read")])
    resolution = catalog.resolve("files.read")
    assert resolution.entry is None
    assert resolution.error is not None and "'a__files_read'" in resolution.error
    assert "'b__files_read'" in resolution.error


def test_unknown_names_suggest_close_matches() -> None:
    """An unknown name's error suggests the nearest catalogue names."""
    catalog = Catalog()
    catalog.put([entry(None, "search_notes")])
    error = catalog.resolve("serch_notes").error
    assert error == "unknown tool 'serch_notes'; did you mean 'search_notes'?"


def test_invalid_tool_names_are_sanitised() -> None:
    """A server tool name models would reject gets a valid catalogue name that still resolves."""
    catalog = Catalog()
    catalog.add_server("srv")
    catalog.put([entry("srv", "files/read.v2")])
    (e,) = catalog.entries()
    assert e.name == "srv__files_read_v2"
    assert catalog.resolve("files/read.v2").entry is e


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_invalid_limits_are_rejected(limit: Any) -> None:
    """max_concurrency must be an int >= 1 or None, with a message saying so."""
    from dispatcher import ConfigurationError, Dispatcher

    with pytest.raises(ConfigurationError, match="use None for no limit"):
        Dispatcher(max_concurrency=limit)
