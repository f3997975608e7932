"""`tune` stopped by its stop event (Ctrl-C on the command line): the measurement under way is kept, partial."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import sys
from typing import TYPE_CHECKING

import anyio
import pytest

import dispatcher
from dispatcher.cli import main
from dispatcher.examples import Workspace
from dispatcher.tuning import TuneProgress, render_table, tune

if TYPE_CHECKING:
    from dispatcher.tuning import TuneReport

SOURCE_ROOT = str(pathlib.Path(dispatcher.__file__).resolve().parents[1])
PYTHONPATH = os.pathsep.join(p for p in (SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)
WORKSPACE = f"{shlex.quote(sys.executable)} -m dispatcher.examples.workspace"


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_a_stop_during_the_first_setting_keeps_what_it_measured() -> None:
    """Stopped 6 calls into the first setting's window: that window is kept, partial, its running calls cut off.

    Before, the stop cancelled the measurement under way, and a stop during the first setting gave an empty table.
    """
    stop = anyio.Event()
    warm = 2 * 4  # the warm-up: two calls per slot

    def on_progress(step: TuneProgress) -> None:
        if step.phase == "measuring" and step.completed >= warm + 6:
            stop.set()

    report = await tune(
        Workspace(latency=0.05).server, "reads", (4, 8), trusted=True, calls=200, progress=on_progress, stop=stop
    )
    assert report.cut_short == "interrupted"
    [cut] = report.settings
    assert cut.limit == 4 and cut.partial and cut.repeats == 1
    assert cut.calls >= 6 and cut.errors == 0 and cut.elapsed > 0 and cut.throughput > 0
    assert 1 <= cut.cut_off <= 4  # the calls running when it stopped: counted as cut off, not dropped
    assert report.recommended == 4 and "the sweep stopped before the other settings" in report.explanation
    assert "wider" not in report.explanation
    assert any(n.startswith("interrupted: the table holds the 1 of 2 settings") for n in report.notes), report.notes
    table = render_table(report)
    assert "interrupted: the settings measured so far" in table and "4 (1x, partial)" in table
    data = report.to_json()
    assert data["cut_short"] == "interrupted" and data["settings"][0]["partial"] is True


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_a_stop_in_a_later_round_keeps_the_whole_measurements_and_drops_the_part() -> None:
    """A setting measured whole in an earlier round keeps its whole measurements: the part of one is not mixed in."""
    stop = anyio.Event()

    def on_progress(step: TuneProgress) -> None:
        if step.repeat == 1 and step.index == 0 and step.phase == "measuring" and step.completed >= 6:
            stop.set()

    report = await tune(
        Workspace(latency=0.05).server, "reads", (1, 2), trusted=True, calls=10, progress=on_progress, stop=stop
    )
    assert report.cut_short == "interrupted"
    assert [(s.limit, s.repeats, s.partial) for s in report.settings] == [(1, 1, False), (2, 1, False)]


@pytest.mark.subprocess
def test_ctrl_c_during_the_first_setting_prints_and_writes_what_it_measured(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real SIGINT 5 calls into the first setting's window: exit 130, the table and the JSON of that setting."""
    import dispatcher.cli._tune_command

    real = dispatcher.tuning.tune

    async def interrupted_in_the_first_setting(*args: object, **kwargs: object) -> TuneReport:
        sent = False

        def on_progress(step: TuneProgress) -> None:
            nonlocal sent
            if step.phase == "measuring" and step.completed >= 2 + 5 and not sent:
                sent = True
                os.kill(os.getpid(), signal.SIGINT)

        kwargs["progress"] = on_progress
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dispatcher.cli._tune_command, "tune", interrupted_in_the_first_setting)
    out = tmp_path / "tune.json"
    argv = ["tune", "--stdio", f"{WORKSPACE} --latency 0.01", "--env", f"PYTHONPATH={PYTHONPATH}", "--trusted"]
    argv += ["--synthetic", "reads", "--range", "1,2", "--calls", "1000", "--repeats", "1", "--quiet"]
    assert main([*argv, "--json", str(out)]) == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert "interrupted: the settings measured so far" in captured.out
    assert "1 (partial)" in captured.out and "not measured: [2]" in captured.out
    report = json.loads(out.read_text())
    assert report["cut_short"] == "interrupted"
    [first] = report["settings"]
    assert first["limit"] == 1 and first["partial"] is True and first["calls"] >= 5
