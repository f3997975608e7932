"""The demo agent loop (`make demo`) runs offline and shows reads together, writes alone and in order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trio.testing import MockClock

from dispatcher.examples.demo import SCRIPT, ScriptedModel, run, timeline

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.anyio
async def test_demo_turns_run_reads_together_and_writes_alone() -> None:
    """Each turn's timeline groups the reads into one wave and gives every write a wave of its own."""
    lines: list[str] = []
    turns = await run(latency=0.02, out=lines.append)
    assert [[result.ok for result in turn] for turn in turns] == [[True] * 4, [True] * 5]
    waves = [line.strip() for line in lines if line.strip().startswith("wave ")]
    assert waves == [
        "wave 1 (together): toolu_01 search_notes, toolu_02 read_note, toolu_03 read_note, toolu_04 fetch_url",
        "wave 1 (alone): toolu_05 append_note",
        "wave 2 (alone): toolu_06 set_note",
        "wave 3 (together): toolu_07 read_note, toolu_08 search_notes, toolu_09 read_note",
    ]
    assert lines[-1] == "model: Your plan now says Tuesday, and launch-summary has the short version."


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))])
@pytest.mark.anyio
async def test_demo_timeline_on_a_virtual_clock() -> None:
    """On a virtual clock the timeline is exact: 100 ms per note call, 300 ms for the page."""
    lines: list[str] = []
    await run(latency=0.1, out=lines.append)
    turn_2 = lines[lines.index("turn 2: 5 calls") + 1 :][:5]
    assert turn_2 == [
        "  toolu_05 append_note  |##########                    |     0 ->   100 ms  ok",
        "  toolu_06 set_note     |          ##########          |   100 ->   200 ms  ok",
        "  toolu_07 read_note    |                    ##########|   200 ->   300 ms  ok",
        "  toolu_08 search_notes |                    ##########|   200 ->   300 ms  ok",
        "  toolu_09 read_note    |                    ##########|   200 ->   300 ms  ok",
    ]


def test_scripted_model_rejects_unanswered_tool_uses() -> None:
    """Like a real API, the scripted model refuses a turn that leaves a tool_use without its tool_result."""
    model = ScriptedModel(SCRIPT)
    tools = [{"name": name} for name in ("search_notes", "read_note", "fetch_url")]
    model.respond([{"role": "user", "content": "hi"}], tools)
    with pytest.raises(ValueError, match="were answered by tool_result ids"):
        model.respond([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01"}]}], tools)


def test_timeline_of_calls_that_never_ran() -> None:
    """A turn in which nothing ran says so."""
    assert timeline([]) == ["  (no call ran)"]


def test_make_demo_runs_the_module() -> None:
    """`python -m dispatcher.examples.demo` runs to the model's last word, on either backend."""
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher.examples.demo", "--latency", "0.01", "--backend", "trio"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "wave 3 (together): toolu_07 read_note, toolu_08 search_notes, toolu_09 read_note" in done.stdout
    assert "demo:" in (ROOT / "Makefile").read_text()
