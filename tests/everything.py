"""`@modelcontextprotocol/server-everything`, the reference server from npm, for the tests that run it over stdio.

`.ci/node-servers` (run by `make test` and `.ci/run`) installs the version pinned in `.ci/node/package-lock.json`
into `.node/`. Where node or the installed server is missing the tests skip with a reason, except under
`CI=true`, where that fails them: CI must run them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from mcp import StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / ".node" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"


def everything() -> StdioServerParameters:
    """The stdio parameters of the installed server-everything (skips, or fails under CI, when it is missing)."""
    node = shutil.which("node")
    reason = None
    if node is None:
        reason = "node is not on PATH: install Node.js 18 or newer, then run .ci/node-servers"
    elif not ENTRY.is_file():
        reason = f"server-everything is not installed at {ENTRY}: run .ci/node-servers (or make test)"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    assert node is not None
    return StdioServerParameters(command=node, args=[str(ENTRY), "stdio"])
