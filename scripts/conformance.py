"""Run the official MCP conformance suite's client scenarios against `scripts.conformance_client`.

`make conformance` runs it after .ci/conformance-suite has installed the suite and Node 22 into
.conformance/. Every client scenario of the pinned suite (``list --client``) runs, `WORKERS` at a time:
the suite's own ``--suite all`` starts them all at once, and on two loaded cores the timing check of
``sse-retry`` (the client waits the retry interval the server gave) then fails for want of CPU. A
scenario passes when none of its checks is a FAILURE or a WARNING. The outcome is compared with
.ci/conformance/expected.toml, which names every scenario with ``"pass"`` or ``"fail: why"``: a scenario
that fails and should pass, passes and is listed as failing (the list is stale), or is missing from the
list (a new one) fails the run, with the table of what happened. Prints one line per scenario.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / ".conformance" / "node_modules"
EXPECTED = ROOT / ".ci" / "conformance" / "expected.toml"
# The suite waits 30 s for a scenario's client; a scenario's run gets this long.
LIMIT = 120
# Scenarios run at once (each is a node process and a Python one).
WORKERS = 3


def _outcomes(results: Path) -> dict[str, tuple[bool, list[str]]]:
    """Each scenario's outcome, read from the suite's result directories: (passed, its failed checks)."""
    outcomes: dict[str, tuple[bool, list[str]]] = {}
    for checks in sorted(results.rglob("checks.json")):
        name = checks.parent.relative_to(results).as_posix().rsplit("-", 6)[0]  # strip the time stamp
        failed = [
            f"{check.get('id')}: {check.get('status')}"
            for check in json.loads(checks.read_text())
            if check.get("status") in ("FAILURE", "WARNING")
        ]
        outcomes[name] = (not failed, failed)
    return outcomes


def _scenarios(node: Path, index: Path) -> list[str]:
    listed = subprocess.run(
        [str(node), str(index), "list", "--client"], capture_output=True, text=True, check=True, timeout=LIMIT
    )
    return re.findall(r"^\s+- (\S+)", listed.stdout, flags=re.MULTILINE)


def main() -> int:
    node = SUITE / ".bin" / "node"
    index = SUITE / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if not node.exists() or not index.exists():
        print("the conformance suite is not installed: run .ci/conformance-suite (make conformance does)")
        return 1
    expected: dict[str, str] = tomllib.loads(EXPECTED.read_text())["scenarios"]
    client = f"{shlex.quote(sys.executable)} -m scripts.conformance_client"
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as results:

        def run(scenario: str) -> str:
            done = subprocess.run(
                [str(node), str(index), "client", "--command", client, "--scenario", scenario, "-o", results],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=LIMIT,
                check=False,
            )
            return done.stdout[-2000:]

        with ThreadPoolExecutor(WORKERS) as pool:
            logs = dict(zip(scenarios := _scenarios(node, index), pool.map(run, scenarios), strict=True))
        outcomes = _outcomes(Path(results))
    elapsed = time.monotonic() - started
    problems = []
    for name in sorted(expected.keys() | outcomes.keys() | logs.keys()):
        want = expected.get(name)
        got = outcomes.get(name)
        shown = "missing" if got is None else "pass" if got[0] else "fail"
        print(f"{name:50} {shown:8} expected {'unlisted' if want is None else want}")
        if want is None:
            problems.append(f"{name} is not in {EXPECTED.name}: add it with its result")
        elif got is None:
            problems.append(f"{name} did not run: {logs.get(name, 'the suite no longer has it')}")
        elif got[0] != (want == "pass"):
            problems.append(f"{name}: expected {want!r}, got {shown} ({'; '.join(got[1]) or 'every check passed'})")
    print(f"{len(outcomes)} scenarios in {elapsed:.0f} s, {WORKERS} at a time")
    if problems:
        print("\n".join(["conformance differs from .ci/conformance/expected.toml:", *problems]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
