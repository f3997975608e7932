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
    assert [[result.status.value for result in turn] for turn in turns] == [
        ["ok"] * 4,
        ["ok"] * 6,
        ["ok"],
        ["denied"],
    ]
    waves = [line.strip() for line in lines if line.strip().startswith("wave ")]
    assert waves == [
        "wave 1 (together): toolu_01 search_notes, toolu_02 read_note, toolu_03 read_note, toolu_04 fetch_url",
        "wave 1 (alone): toolu_05 append_note",
        "wave 2 (alone): toolu_06 set_note",
        "wave 3 (together): toolu_07 read_note, toolu_08 search_notes, toolu_09 read_note",
        "wave 4 (alone): toolu_10 delete_note",
        "wave 1 (alone): toolu_11 fetch_url",
    ]
    assert lines[-1] == "model: Your plan now says Tuesday. I did not send anything outside the workspace."


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))])
@pytest.mark.anyio
async def test_demo_timeline_on_a_virtual_clock() -> None:
    """On a virtual clock the timeline is exact: approvals are asked at once while the first write runs."""
    lines: list[str] = []
    await run(latency=0.1, out=lines.append)
    turn_2 = lines[lines.index("turn 2: 6 calls") + 1 :]
    assert turn_2[:6] == [
        "  toolu_05 append_note  |##########                              |     0 ->   100 ms  ok",
        "  toolu_06 set_note     |          ##########                    |   100 ->   200 ms  ok",
        "  toolu_07 read_note    |                    ##########          |   200 ->   300 ms  ok",
        "  toolu_08 search_notes |                    ##########          |   200 ->   300 ms  ok",
        "  toolu_09 read_note    |                    ##########          |   200 ->   300 ms  ok",
        "  toolu_10 delete_note  |                              ##########|   300 ->   400 ms  ok",
    ]
    assert turn_2[10:14] == [
        "  approval for toolu_06 asked at 0 ms: approved",
        "    because set_note may make destructive changes",
        "  approval for toolu_10 asked at 0 ms: approved",
        "    because delete_note may make destructive changes",
    ]
    assert "  toolu_04 fetch_url    |" + "#" * 40 + "|     0 ->   300 ms  ok, untrusted content" in lines
    turn_4 = lines[lines.index("turn 4: 1 call") + 1 :]
    assert turn_4[:2] == [
        "  toolu_12 send_message |" + " " * 40 + "| never ran: denied",
        "  approval for toolu_12 asked at 0 ms: denied",
    ]
    assert turn_4[2].startswith("    because send_message can send data to an open world, and this session has read")


def test_scripted_model_rejects_unanswered_tool_uses() -> None:
    """Like a real API, the scripted model refuses a turn that leaves a tool_use without its tool_result."""
    model = ScriptedModel(SCRIPT)
    tools = [{"name": name} for name in ("search_notes", "read_note", "fetch_url")]
    model.respond([{"role": "user", "content": "hi"}], tools)
    with pytest.raises(ValueError, match="were answered by tool_result ids"):
        model.respond([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01"}]}], tools)


def test_timeline_of_a_turn_without_calls() -> None:
    """An empty turn says so."""
    assert timeline([]) == ["  (no calls)"]


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
    assert "toolu_12 send_message" in done.stdout and "never ran: denied" in done.stdout
    assert "demo:" in (ROOT / "Makefile").read_text()
