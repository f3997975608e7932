"""Reference MCP servers from the package index, nobody's but theirs: mcp-server-git, -time and -fetch.

Each runs as a subprocess over stdio (the `reference-servers` extra installs them into the dev venv; they
require mcp 2.3 like the dispatcher, so they share its environment). The tests go through `connect()`,
the `inspect` command and an agent's batch: reads together, writes alone and in order, a git commit
that lands in a temporary repository.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import shlex
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, ClassVar

import pytest

from dispatcher import CallStatus, Dispatcher, ToolCall
from tests import forked, forkserver

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from mcp import StdioServerParameters

    from dispatcher import ToolResult

pytestmark = [pytest.mark.reference_servers, pytest.mark.anyio]


def _server(module: str, *args: str) -> StdioServerParameters:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install -e '.[reference-servers]'")
    # The server runs with this interpreter, the one whose environment has the package installed: forked
    # from tests/forkserver.py's zygote, which imported the SDK (`python -m module` in a process of its own).
    return forkserver.params(["-m", module, *args])


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit and one new, unstaged file."""
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "config", "user.email", "test@example.com")
    _git(tmp_path, "config", "user.name", "Test")
    (tmp_path / "a.txt").write_text("first\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "first commit")
    (tmp_path / "a.txt").write_text("first\nchanged\n")
    (tmp_path / "b.txt").write_text("new file\n")
    return tmp_path


def _text(result: ToolResult) -> str:
    assert result.result is not None, result.error
    return "\n".join(getattr(block, "text", "") for block in result.result.content)


async def test_git_server_agent_batch_reads_together_writes_in_order(repo: Path) -> None:
    """A turn against mcp-server-git: status and diff run together, add then commit alone, log sees the commit."""
    params = _server("mcp_server_git", "--repository", str(repo))
    path = str(repo)
    async with Dispatcher(call_timeout=60) as dispatcher:
        tools = await dispatcher.connect("git", params, trusted=True)
        by_name = {entry.name: entry for entry in tools}
        assert by_name["git_status"].concurrent and by_name["git_log"].concurrent
        assert by_name["git_add"].exclusive and by_name["git_commit"].exclusive
        assert by_name["git_add"].idempotent and not by_name["git_commit"].idempotent
        results = await dispatcher.dispatch(
            [
                ToolCall("1", "git_status", {"repo_path": path}),
                ToolCall("2", "git_diff_unstaged", {"repo_path": path}),
                ToolCall("3", "git_add", {"repo_path": path, "files": ["a.txt", "b.txt"]}),
                ToolCall("4", "git_commit", {"repo_path": path, "message": "second commit"}),
                ToolCall("5", "git_log", {"repo_path": path, "max_count": 5}),
                ToolCall("6", "git_status", {"repo_path": path}),
                ToolCall("7", "git_checkout", {"repo_path": "/", "branch_name": "x"}),  # outside the repository
            ]
        )
    assert [r.status for r in results[:6]] == [CallStatus.OK] * 6, [r.error for r in results]
    assert "b.txt" in _text(results[0]) and "+changed" in _text(results[1])
    assert "second commit" in _text(results[4]) and "first commit" in _text(results[4])
    assert "b.txt" not in _text(results[5])
    assert results[6].status is not CallStatus.OK  # the server confines itself to --repository
    # The writes waited for both reads, ran one after the other, and the log waited for them.
    read_end = max(r.finished_at for r in results[:2])
    assert results[2].started_at is not None and results[2].started_at >= read_end
    assert results[3].started_at is not None and results[3].started_at >= results[2].finished_at
    assert results[4].started_at is not None and results[4].started_at >= results[3].finished_at
    assert _git(repo, "log", "--format=%s").splitlines() == ["second commit", "first commit"]


async def test_git_server_untrusted_runs_everything_alone(repo: Path) -> None:
    """Connected untrusted, mcp-server-git's read-only tools are scheduled alone and never retried."""
    params = _server("mcp_server_git", "--repository", str(repo))
    async with Dispatcher() as dispatcher:
        tools = await dispatcher.connect("git", params, trusted=False)
        results = await dispatcher.dispatch(
            [
                ToolCall("1", "git_status", {"repo_path": str(repo)}),
                ToolCall("2", "git_branch", {"repo_path": str(repo), "branch_type": "local"}),
            ]
        )
    assert tools and all(entry.exclusive and not entry.idempotent for entry in tools)
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK]
    assert results[1].started_at is not None and results[1].started_at >= results[0].finished_at
    assert "main" in _text(results[1])


async def test_time_server_batch_and_a_bad_timezone() -> None:
    """mcp-server-time over stdio: two reads answer together; a bad timezone is that call's error alone."""
    params = _server("mcp_server_time", "--local-timezone", "UTC")
    async with Dispatcher() as dispatcher:
        tools = await dispatcher.connect("time", params, trusted=True)
        results = await dispatcher.dispatch(
            [
                ToolCall("1", "get_current_time", {"timezone": "Europe/Paris"}),
                ToolCall(
                    "2", "convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
                ),
                ToolCall("3", "get_current_time", {"timezone": "Not/AZone"}),
            ]
        )
    assert {entry.name for entry in tools} == {"get_current_time", "convert_time"}
    assert all(entry.concurrent for entry in tools)
    assert results[0].ok and "Europe/Paris" in _text(results[0])
    assert results[1].ok and "21:00" in _text(results[1])
    assert results[2].status is CallStatus.TOOL_ERROR


def test_inspect_command_reads_the_time_server() -> None:
    """`python -m dispatcher inspect --stdio ... --json` lists mcp-server-time's tools as concurrent when trusted."""
    params = _server("mcp_server_time", "--local-timezone", "UTC")
    command = shlex.join([params.command, *params.args])
    done = forked.run([sys.executable, "-m", "dispatcher", "inspect", "--stdio", command, "--trusted", "--json"])
    assert done.returncode == 0, "`python -m dispatcher inspect` failed: its stderr is in the captured stderr"
    report = json.loads(done.stdout)
    tools = {tool["name"]: tool for tool in report["tools"]}
    assert set(tools) == {"get_current_time", "convert_time"}
    assert all(tool["scheduling"] == "concurrent" and tool["retryable"] for tool in tools.values())
    assert report["trusted"] is True


# mcp-server-fetch, against pages served on 127.0.0.1: the tests never reach the internet. The server refuses
# loopback and private addresses unless started with --allow-private-ips, and consults the site's robots.txt
# before each autonomous fetch unless started with --ignore-robots-txt.

_PAGE = "<html><head><title>Notes</title></head><body><h1>Release notes</h1><p>The fetch page body.</p></body></html>"
_ROBOTS = "User-agent: *\nDisallow: /private/\n"
_NOTES = "Plain notes, not HTML."


class _Pages(http.server.BaseHTTPRequestHandler):
    """Two pages, a robots.txt that disallows /private/, and 404 for the rest; records each request's path."""

    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.requests.append(self.path)
        body = {"/robots.txt": _ROBOTS, "/notes.txt": _NOTES, "/page.html": _PAGE, "/private/page.html": _PAGE}.get(
            self.path
        )
        if body is None:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if self.path.endswith(".html") else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read the requests, not a log."""


@pytest.fixture
def pages() -> Iterator[str]:
    """The base URL of a local HTTP server on 127.0.0.1 (a free port), serving `_Pages`."""
    _Pages.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_fetch_server_reads_local_pages_and_keeps_to_robots_txt(pages: str) -> None:
    """mcp-server-fetch with --allow-private-ips: two pages come back, together; a path the site's robots.txt
    disallows is that call's tool error, never requested, and the server asked robots.txt before each fetch.

    Raw fetches only: turning HTML into Markdown goes through readabilipy, which runs Readability.js under
    node when node is on PATH, and on its first use runs `npm install` inside its own package directory,
    whose output then lands on the server's stdout (seen here: the call failed and the client read
    "node:internal/modules/cjs/loader" as a JSON-RPC message).
    """
    params = _server("mcp_server_fetch", "--allow-private-ips")
    async with Dispatcher(call_timeout=60) as dispatcher:
        tools = await dispatcher.connect("fetch", params, trusted=True)
        results = await dispatcher.dispatch(
            [
                ToolCall("1", "fetch", {"url": f"{pages}/page.html", "raw": True}),
                ToolCall("2", "fetch", {"url": f"{pages}/notes.txt"}),
                ToolCall("3", "fetch", {"url": f"{pages}/private/page.html", "raw": True}),
            ]
        )
    assert [entry.name for entry in tools] == ["fetch"]
    assert tools[0].concurrent and tools[0].idempotent  # read-only and idempotent: the reads run together
    assert results[0].ok and "<h1>Release notes</h1>" in _text(results[0])
    assert results[1].ok and "cannot be simplified to markdown" in _text(results[1]) and _NOTES in _text(results[1])
    assert results[2].status is CallStatus.TOOL_ERROR and "robots.txt" in _text(results[2])
    assert "/private/page.html" not in _Pages.requests  # refused before it was requested
    assert _Pages.requests.count("/robots.txt") == 3
    assert sorted(p for p in _Pages.requests if p != "/robots.txt") == ["/notes.txt", "/page.html"]


async def test_fetch_server_refuses_loopback_by_default(pages: str) -> None:
    """Started without --allow-private-ips, mcp-server-fetch refuses 127.0.0.1 before sending anything."""
    params = _server("mcp_server_fetch", "--ignore-robots-txt")
    async with Dispatcher(call_timeout=60) as dispatcher:
        await dispatcher.connect("fetch", params, trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", "fetch", {"url": f"{pages}/page.html", "raw": True})])
    assert result.status is CallStatus.TOOL_ERROR
    assert "not a public address" in _text(result)
    assert _Pages.requests == []
