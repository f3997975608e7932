"""Adversarial review of issue 26: odd inputs to `tune` and the online limit that once hung or misled."""

from __future__ import annotations

import pytest

from dispatcher import ConfigurationError
from dispatcher.cli import main
from dispatcher.examples import Workspace
from dispatcher.tuning import tune


@pytest.mark.anyio
async def test_a_huge_setting_fails_before_connecting() -> None:
    """A setting of 1e20 once spawned as many callers and planned 2e20 warm-up calls: the sweep never ended
    and its memory grew. It is a configuration error, raised before the server is reached."""
    server = Workspace().server
    with pytest.raises(ConfigurationError, match="at most 10000"):
        await tune(server, "reads", (1, 10**20), calls=3)
    with pytest.raises(ConfigurationError, match="clients must be"):
        await tune(server, "reads", (1, 2), calls=3, clients=10**20)


def test_a_huge_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """The command says what is accepted (exit 2), for --range and --to alike, with no traceback."""
    for argv in (["--range", "1,99999999999999999999"], ["--from", "1", "--to", "99999999999999999999"]):
        code = main(["tune", "--stdio", "python -c pass", "--synthetic", "reads", *argv])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "at most 10000" in err
        assert "Traceback" not in err
