"""The npm reference servers `@modelcontextprotocol/server-filesystem` and `-memory`, over stdio through `connect()`.

`.ci/node-servers` installs the versions pinned in `.ci/node/package-lock.json` into `.node/`; without node
or the installed servers the tests skip with the reason (under `CI=true` they fail). Each test starts one
server process (about half a second of node start-up) and runs all its batches against it.

What they show: the dispatcher reads the servers' annotations by the trust rules. Untrusted (the default),
their hints are ignored: every tool runs alone, in request order, and none is retried. Trusted, the
filesystem's read-only tools run together and its writes alone, in order, each read seeing the writes
requested before it.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pytest

from dispatcher import CallStatus, Dispatcher, ToolCall

from .everything import npm_server

if TYPE_CHECKING:
    from pathlib import Path

    from dispatcher import ToolResult

pytestmark = [pytest.mark.subprocess, pytest.mark.anyio, pytest.mark.backends("asyncio", "trio")]

_READS = {"read_text_file", "read_file", "read_multiple_files", "list_directory", "get_file_info", "search_files"}
_WRITES = {"write_file", "edit_file", "move_file", "create_directory"}


def _text(result: ToolResult) -> str:
    assert result.result is not None, result.error
    return "\n".join(getattr(block, "text", "") for block in result.result.content)


def _one_after_another(results: list[ToolResult]) -> bool:
    """Whether each call started only once the one before it had finished."""
    return all(
        later.started_at is not None and later.started_at >= earlier.finished_at
        for earlier, later in itertools.pairwise(results)
    )


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """A scratch directory with two text files (resolved: the server compares real paths)."""
    root = tmp_path.resolve()
    (root / "a.txt").write_text("alpha\n")
    (root / "b.txt").write_text("beta\n")
    return root


async def test_filesystem_untrusted_hints_ignored(files: Path) -> None:
    """Untrusted server-filesystem: its readOnlyHint is dropped, so reads run alone, in order, never retried."""
    async with Dispatcher() as dispatcher:
        tools = await dispatcher.connect("fs", npm_server("filesystem", str(files)))
        results = await dispatcher.dispatch(
            [
                ToolCall("1", "read_text_file", {"path": str(files / "a.txt")}),
                ToolCall("2", "read_text_file", {"path": str(files / "b.txt")}),
                ToolCall("3", "list_directory", {"path": str(files)}),
            ]
        )
    by_name = {entry.tool: entry for entry in tools}
    assert _READS | _WRITES <= set(by_name)
    # The server declares its reads read-only; the dispatcher keeps the declaration but schedules by the defaults.
    declared = by_name["read_text_file"].declared_annotations
    assert declared is not None and declared.read_only_hint is True
    assert all(not entry.trusted and entry.exclusive and not entry.idempotent for entry in tools)
    assert [r.call_id for r in results] == ["1", "2", "3"]
    assert [r.status for r in results] == [CallStatus.OK] * 3, [r.error for r in results]
    assert [r.attempts for r in results] == [1, 1, 1]
    assert _one_after_another(results)
    assert "alpha" in _text(results[0]) and "beta" in _text(results[1])
    assert "a.txt" in _text(results[2]) and "b.txt" in _text(results[2])
    # Untrusted, its openWorldHint false is dropped too: the results are untrusted content.
    assert all(r.untrusted_content for r in results)


async def test_filesystem_trusted_reads_together_writes_in_order(files: Path) -> None:
    """Trusted server-filesystem: reads overlap, writes run alone in order, each read sees the writes before it."""
    async with Dispatcher() as dispatcher:
        tools = await dispatcher.connect("fs", npm_server("filesystem", str(files)), trusted=True)
        results = await dispatcher.dispatch(
            [
                ToolCall("1", "read_text_file", {"path": str(files / "a.txt")}),
                ToolCall("2", "read_text_file", {"path": str(files / "b.txt")}),
                ToolCall("3", "write_file", {"path": str(files / "c.txt"), "content": "written by 3\n"}),
                ToolCall("4", "read_text_file", {"path": str(files / "c.txt")}),
                ToolCall("5", "write_file", {"path": str(files / "a.txt"), "content": "rewritten by 5\n"}),
                ToolCall("6", "read_text_file", {"path": str(files / "a.txt")}),
            ]
        )
    by_name = {entry.tool: entry for entry in tools}
    assert all(by_name[name].concurrent for name in _READS)
    assert all(by_name[name].exclusive for name in _WRITES)
    # Trusted, the idempotentHint counts: write_file may be repeated, edit_file and move_file may not.
    assert by_name["write_file"].idempotent
    assert not by_name["edit_file"].idempotent and not by_name["move_file"].idempotent
    assert [r.call_id for r in results] == ["1", "2", "3", "4", "5", "6"]
    assert [r.status for r in results] == [CallStatus.OK] * 6, [r.error for r in results]
    first, second, write, read_back, rewrite, reread = results
    # The two reads were in flight together; each write waited for everything before it, and the reads after it.
    assert first.started_at is not None and second.started_at is not None
    assert second.started_at < first.finished_at and first.started_at < second.finished_at
    assert write.started_at is not None and write.started_at >= max(first.finished_at, second.finished_at)
    assert _one_after_another([write, read_back, rewrite, reread])
    assert "alpha" in _text(first) and "beta" in _text(second)
    assert "written by 3" in _text(read_back)
    assert "rewritten by 5" in _text(reread) and "alpha" not in _text(reread)
    assert (files / "c.txt").read_text() == "written by 3\n"
    assert (files / "a.txt").read_text() == "rewritten by 5\n"
    # Trusted and closed-world (openWorldHint false): the file contents are not marked untrusted.
    assert not any(r.untrusted_content for r in results)


async def test_memory_create_then_read_graph_untrusted(tmp_path: Path) -> None:
    """Untrusted server-memory: create_entities then read_graph in one batch, in order; the read sees the entity."""
    memory = tmp_path / "memory.jsonl"
    params = npm_server("memory", env={"MEMORY_FILE_PATH": str(memory)})
    entity = {"name": "Ada Lovelace", "entityType": "person", "observations": ["wrote the first program"]}
    async with Dispatcher() as dispatcher:
        tools = await dispatcher.connect("memory", params)
        results = await dispatcher.dispatch(
            [ToolCall("1", "create_entities", {"entities": [entity]}), ToolCall("2", "read_graph", {})]
        )
    by_name = {entry.tool: entry for entry in tools}
    assert {"create_entities", "read_graph", "search_nodes"} <= set(by_name)
    declared = by_name["read_graph"].declared_annotations
    assert declared is not None and declared.read_only_hint is True
    assert all(entry.exclusive and not entry.idempotent for entry in tools)
    graph = results[1]
    assert [r.call_id for r in results] == ["1", "2"]
    assert [r.status for r in results] == [CallStatus.OK] * 2, [r.error for r in results]
    assert [r.attempts for r in results] == [1, 1]
    assert _one_after_another(results)
    assert "Ada Lovelace" in _text(graph) and "wrote the first program" in _text(graph)
    assert all(r.untrusted_content for r in results)
    assert "Ada Lovelace" in memory.read_text()  # the server stored it where MEMORY_FILE_PATH says
