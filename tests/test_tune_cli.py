"""`dispatcher tune` options a user gets wrong, checked before anything connects."""

from __future__ import annotations

import pathlib
import shlex
import sys

import pytest

from dispatcher import ConfigurationError
from dispatcher.cli import main
from dispatcher.cli._tune_command import doubling, parse_range
from dispatcher.examples import Workspace
from dispatcher.tuning import load_workload, recommend, tune

from .test_tune import setting

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


def usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `dispatcher tune` with a server that cannot start: a usage error must come first (exit 2)."""
    status = main(["tune", "--stdio", "/nonexistent/server", "--synthetic", "reads", "--quiet", *argv])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--from", "0", "--to", "4"], "--from must be >= 1"),
        (["--from", "-2", "--to", "4"], "--from must be >= 1"),
        (["--from", "1", "--to", "0"], "--to >= --from"),
        (["--from", "8", "--to", "2"], "--to >= --from"),
    ],
)
def test_a_doubling_range_from_or_to_zero_is_a_usage_error(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--from 0 swept from 1 and --to 0 swept up to 64: a 0 was read as "not given"."""
    assert said in usage(argv, capsys)


def test_doubling_includes_the_end_off_the_sequence() -> None:
    assert doubling(1, 8) == [1, 2, 4, 8]
    assert doubling(3, 20) == [3, 6, 12, 20]


@pytest.mark.subprocess
def test_a_server_that_prints_junk_on_stdout_gets_one_line_per_junk_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The SDK logs a stdout line that is not JSON-RPC with its traceback: the command shows one line for it."""
    server = shlex.join([sys.executable, "-m", "dispatcher.examples.workspace"])
    command = f"sh -c {shlex.quote('echo hello junk; exec ' + server)}"
    argv = ["tune", "--stdio", command, "--env", f"PYTHONPATH={ROOT}", "--trusted", "--synthetic", "reads"]
    assert main([*argv, "--range", "1,2", "--calls", "5", "--repeats", "1", "--quiet"]) == 0
    printed = capsys.readouterr()
    assert "<- recommended" in printed.out
    assert "Traceback" not in printed.err
    junk = [line for line in printed.err.splitlines() if "hello junk" in line]
    assert len(junk) == 1
    assert junk[0].startswith("dispatcher tune: Failed to parse JSONRPC message from server")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--calls", "0"], "argument --calls: takes an integer >= 1, got '0'; leave it out for 100"),
        (["--clients", "-1"], "argument --clients: takes an integer >= 1, got '-1'"),
        (["--warmup", "-1"], "argument --warmup: takes an integer >= 0, got '-1'"),
        (["--calls", "many"], "argument --calls: takes an integer, got 'many'"),
    ],
)
def test_counts_out_of_range_are_worded_for_the_command_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--calls 0 said "use None for measuring for a duration only": the Python API's words, no option."""
    with pytest.raises(SystemExit) as exited:
        main(["tune", "--stdio", "/nonexistent/server", "--synthetic", "reads", "--quiet", *argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert said in err
    assert "None" not in err


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio")
async def test_a_workload_of_one_call_is_described_as_one_call() -> None:
    """A one-line workload file (fetch.jsonl in the docs) read "1 calls of fetch"."""
    report = await tune(
        Workspace(latency=0).server,
        load_workload(['{"name": "search_notes", "arguments": {"query": "x"}}']),
        (1,),
        trusted=True,
        calls=3,
        repeats=1,
    )
    assert report.workload == "1 call of search_notes"


def test_flat_throughput_quotes_the_range_measured_when_the_smallest_setting_is_the_fastest() -> None:
    """When 1 got the most calls/s the sentence read "stays at 15.2 to 15.2", hiding the drop at 2."""
    _, _, why = recommend([setting(1, 100.0, 0.01), setting(2, 92.0, 0.02), setting(4, 95.0, 0.04)])
    assert why.startswith("no setting matters here: throughput stays at 92.0 to 100 calls/s from 1 to 4"), why
    _, _, why = recommend([setting(1, 100.0, 0.01), setting(2, 100.0, 0.02)])
    assert why.startswith("no setting matters here: throughput stays at 100 calls/s from 1 to 2"), why


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("1,,2", "--range has an empty item in '1,,2' (two commas together, or one at an end)"),
        ("1,2,", "--range has an empty item in '1,2,'"),
        (",4", "--range has an empty item in ',4'"),
        ("1,2,2,4", "--range lists 2 more than once in '1,2,2,4': give each setting once"),
        ("4,1,4,1", "--range lists 1 and 4 more than once"),
        ("1,two", "--range takes integers separated by commas, got '1,two'"),
    ],
)
def test_a_range_with_an_empty_item_or_a_setting_twice_is_a_usage_error(
    given: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`1,,2` swept 1 and 2 and `1,2,2,4` swept 1, 2 and 4, silently: a typo measured what was not meant."""
    err = usage(["--range", given], capsys)
    assert said in err, err
    assert "e.g. --range 1,2,4,8" in err


def test_a_range_with_a_setting_below_1_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Checked by tune() itself, before anything connects."""
    assert "every setting must be an int >= 1, got [0]" in usage(["--range", "1,0,2"], capsys)


def test_a_range_in_any_order_with_spaces_is_read_as_written() -> None:
    """Order and spaces around the commas are no mistake: the sweep measures the settings in increasing order."""
    assert parse_range("8, 2,4") == [8, 2, 4]


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio")
async def test_tune_refuses_a_setting_listed_twice() -> None:
    """The Python API dropped the repeat silently too: it names it instead."""
    with pytest.raises(ConfigurationError, match=r"settings lists \[2\] more than once"):
        await tune(Workspace(latency=0).server, "reads", (1, 2, 2), trusted=True, calls=3, repeats=1)
