"""The suite's own rules (tests/README.md): one backend fixture, one ledger reader, markers the quick run can trust."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap
from typing import Any

import anyio
import pytest

from .conftest import ALL_CLOCKS, DEFAULT_BACKENDS, TRIO_MOCKCLOCK, backends_of

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent

pytestmark = pytest.mark.anyio


def _sources() -> list[pathlib.Path]:
    return sorted(path for path in TESTS.rglob("*.py") if path.name not in ("conftest.py", "test_suite_rules.py"))


def _offending(pattern: str, *, allowed: tuple[str, ...] = ()) -> list[str]:
    rule = re.compile(pattern)
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _sources()
        if path.name not in allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if rule.search(line)
    ]


def test_no_test_spells_out_its_backends() -> None:
    """Backends and clocks come from tests/conftest.py's markers, never a hand-made anyio_backend."""
    offending = _offending(r"""parametrize\(\s*["']anyio_backend|def anyio_backend\b|^\s*["']anyio_backend["'],""")
    assert offending == [], "use pytest.mark.virtual_time, all_clocks or backends(...) instead:\n" + "\n".join(
        offending
    )


def test_ledger_files_are_read_by_tests_ledger_alone() -> None:
    """The workspace's ledger file is parsed in one place (tests/ledger.py), not again in each test."""
    offending = _offending(r"""\[["']event["']\]""", allowed=("ledger.py", "test_ledger.py"))
    assert offending == [], "read the ledger with tests.ledger.Ledger:\n" + "\n".join(offending)


class _Definition:
    """Enough of a pytest item for `backends_of`: its markers, nearest first."""

    def __init__(self, *markers: pytest.MarkDecorator) -> None:
        self.markers = [marker.mark for marker in markers]

    def iter_markers(self) -> list[pytest.Mark]:
        return self.markers


def test_the_nearest_clock_marker_chooses_the_backends() -> None:
    """No marker: asyncio and trio; virtual_time, all_clocks, backends(...) as named; the test's own wins."""
    assert backends_of(_Definition()) == DEFAULT_BACKENDS == ("asyncio", "trio")  # type: ignore[arg-type]
    assert backends_of(_Definition(pytest.mark.virtual_time)) == (TRIO_MOCKCLOCK,)  # type: ignore[arg-type]
    assert backends_of(_Definition(pytest.mark.all_clocks)) == ALL_CLOCKS  # type: ignore[arg-type]
    own_first = _Definition(pytest.mark.backends("asyncio"), pytest.mark.all_clocks)
    assert backends_of(own_first) == ("asyncio",)  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match="backends"):
        backends_of(_Definition(pytest.mark.backends("curio")))  # type: ignore[arg-type]


async def test_default_backends_are_asyncio_and_trio_on_real_clocks(anyio_backend: Any, virtual_clock: bool) -> None:
    """An unmarked async test runs on the real clocks of asyncio and trio."""
    assert anyio_backend in ("asyncio", "trio")
    assert not virtual_clock


@pytest.mark.virtual_time
@pytest.mark.parametrize("turn", [1, 2])
async def test_each_virtual_time_test_gets_a_fresh_clock(anyio_backend: Any, virtual_clock: bool, turn: int) -> None:
    """Under virtual_time a test starts at time 0 of a MockClock of its own: an hour slept before is not seen."""
    from trio.testing import MockClock

    assert virtual_clock and isinstance(anyio_backend[1]["clock"], MockClock)
    assert anyio.current_time() == 0.0
    await anyio.sleep(3600)
    assert anyio.current_time() == 3600.0


_UNMARKED = """
import subprocess
import sys

import pytest


def test_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.subprocess
def test_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_quiet():
    pass
"""


@pytest.mark.subprocess
def test_a_test_that_starts_a_process_without_the_marker_fails(tmp_path: pathlib.Path) -> None:
    """The subprocess marker is checked: an unmarked test that starts a process fails and names the marker."""
    (tmp_path / "test_spawns.py").write_text(textwrap.dedent(_UNMARKED))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    subprocess: starts a process\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-p", "tests.markers"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 2 passed" in run.stdout, run.stdout
    assert "FAILED test_spawns.py::test_unmarked" in run.stdout, run.stdout
    assert "this test starts a process (subprocess.Popen" in run.stdout
    assert "without @pytest.mark.subprocess: add the marker" in run.stdout
