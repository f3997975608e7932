"""`dispatcher tune` options a user gets wrong, checked before anything connects."""

from __future__ import annotations

import pytest

from dispatcher.cli import main
from dispatcher.cli._tune_command import doubling


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
