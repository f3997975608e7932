"""The demo agent loop (`make demo`) runs offline and shows reads together, writes alone and in order."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dispatcher.examples.demo import SCRIPT, ScriptedModel, run, waves
from dispatcher.timeline import Timeline
from tests import forked

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


@pytest.mark.backends("trio-mockclock")
@pytest.mark.anyio
async def test_demo_timeline_on_a_virtual_clock() -> None:
    """On a virtual clock the timeline is exact: approvals are asked at once while the first write runs, and
    each wait says how much of it the person took."""
    lines: list[str] = []
    await run(latency=0.1, out=lines.append)
    turn_2 = lines[lines.index("turn 2: 6 calls") + 1 :]
    assert turn_2[0].split() == ["0", "100", "200", "300", "ms"]
    assert turn_2[2:8] == [
        "  toolu_05 append_note  |oooooooooo                              |      0 ->    100 ms  ok",
        "  toolu_06 set_note     |----------oooooooooo                    |    100 ->    200 ms  ok; "
        "waited 100 ms for the write before it (toolu_05), 100 ms of it for an approval",
        "  toolu_07 read_note    |--------------------oooooooooo          |    200 ->    300 ms  ok; "
        "waited 200 ms for the write before it (toolu_06)",
        "  toolu_08 search_notes |--------------------oooooooooo          |    200 ->    300 ms  ok; "
        "waited 200 ms for the write before it (toolu_06)",
        "  toolu_09 read_note    |--------------------oooooooooo          |    200 ->    300 ms  ok; "
        "waited 200 ms for the write before it (toolu_06)",
        "  toolu_10 delete_note  |------------------------------oooooooooo|    300 ->    400 ms  ok; "
        "waited 300 ms: runs alone, after the calls before it (the last: toolu_09), 100 ms of it for an approval",
    ]
    assert turn_2[13:17] == [
        "  approval for toolu_06 asked at 0 ms: approved",
        "    because set_note may make destructive changes",
        "  approval for toolu_10 asked at 100 ms: approved",
        "    because delete_note may make destructive changes",
    ]
    assert "  toolu_04 fetch_url    |" + "o" * 40 + "|      0 ->    300 ms  ok; untrusted content" in lines
    turn_4 = lines[lines.index("turn 4: 1 call") + 1 :]
    assert turn_4[2] == (
        "  toolu_12 send_message |" + "-" * 39 + "D|        never ran  denied; "
        "waited 100 ms for an approval that was not given"
    )
    assert turn_4[4] == "  approval for toolu_12 asked at 0 ms: denied"
    assert turn_4[5].startswith("    because send_message can send data to an open world, and this session has read")


def test_scripted_model_rejects_unanswered_tool_uses() -> None:
    """Like a real API, the scripted model refuses a turn that leaves a tool_use without its tool_result."""
    model = ScriptedModel(SCRIPT)
    tools = [{"name": name} for name in ("search_notes", "read_note", "fetch_url")]
    model.respond([{"role": "user", "content": "hi"}], tools)
    with pytest.raises(ValueError, match="were answered by tool_result ids"):
        model.respond([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01"}]}], tools)


def test_waves_of_a_turn_without_calls() -> None:
    """A turn without calls has no waves."""
    assert waves(Timeline([])) == []


@pytest.mark.backends("trio-mockclock")
@pytest.mark.anyio
async def test_demo_writes_the_session_as_a_chrome_trace(tmp_path: Path) -> None:
    """`--trace` writes the whole session, one process per turn, every call of every turn a thread."""
    import json

    path = tmp_path / "session.json"
    lines: list[str] = []
    turns = await run(latency=0.1, out=lines.append, trace=path)
    trace = json.loads(path.read_text())
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert names == [f"batch {n}" for n in range(1, len(turns) + 1)]
    threads = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert threads == [f"{r.call_id} {r.tool}" for turn in turns for r in turn]
    assert lines[-1].endswith(str(path))


@pytest.mark.subprocess
def test_make_demo_runs_the_module() -> None:
    """`python -m dispatcher.examples.demo` runs to the model's last word, on either backend."""
    done = forked.run(
        [sys.executable, "-m", "dispatcher.examples.demo", "--latency", "0.01", "--backend", "trio"], cwd=ROOT
    )
    assert done.returncode == 0, "the demo failed: its traceback is in the captured stderr"
    assert "wave 3 (together): toolu_07 read_note, toolu_08 search_notes, toolu_09 read_note" in done.stdout
    assert "toolu_12 send_message" in done.stdout and "never ran  denied" in done.stdout
    assert "\x1b[" not in done.stdout  # not a terminal: no colour
    assert "demo:" in (ROOT / "Makefile").read_text()
