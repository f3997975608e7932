"""Settings are checked in one place, with one wording: what the setting must be, what it got, what to do."""

from __future__ import annotations

import math

import pytest

from dispatcher import ConfigurationError, Dispatcher, RetryPolicy
from dispatcher._core import _checks as checks
from dispatcher.fleet import FleetServer


@pytest.mark.parametrize("value", [True, False, 0, -1, 1.5, "2", None, math.nan])
def test_a_whole_number_is_an_int_in_range_and_never_a_bool(value: object) -> None:
    """`whole` takes ints from its minimum only: bools, floats, strings, NaN and (by default) None are refused."""
    with pytest.raises(ConfigurationError, match=r"^limit must be an int >= 1, got "):
        checks.whole("limit", value)


def test_a_whole_number_reports_its_range_none_and_hint() -> None:
    """The message says the range, what None means and the hint; the value passes through unchanged."""
    assert checks.whole("n", 3, maximum=3) == 3
    assert checks.whole("n", None, none="no limit") is None
    with pytest.raises(ConfigurationError) as caught:
        checks.whole("n", 4, minimum=2, maximum=3, none="no limit", hint="more is never faster")
    assert str(caught.value) == "n must be an int from 2 to 3, got 4; use None for no limit; more is never faster"


@pytest.mark.parametrize("value", [True, 0, -0.5, math.inf, -math.inf, math.nan, "1", None])
def test_seconds_are_finite_positive_numbers_and_never_bools(value: object) -> None:
    """`seconds` refuses bools, zero, negatives, infinities, NaN, strings and (by default) None."""
    with pytest.raises(ConfigurationError, match=r"^timeout must be a positive number of seconds, got "):
        checks.seconds("timeout", value)


def test_seconds_may_allow_zero_and_none() -> None:
    """Zero is allowed when asked for; None when it means something; the value comes back as given."""
    assert checks.seconds("wait", 0, zero=True) == 0.0
    assert checks.seconds("t", 2) == 2 and isinstance(checks.seconds("t", 2), int)
    assert checks.seconds("t", None, none="none") is None
    with pytest.raises(ConfigurationError, match=r"wait must be a number of seconds >= 0, got -1"):
        checks.seconds("wait", -1, zero=True)


@pytest.mark.parametrize("value", [1, 0, None, "yes"])
def test_a_flag_is_a_bool(value: object) -> None:
    """`flag` takes True and False only."""
    with pytest.raises(ConfigurationError, match=r"^jitter must be True or False, got "):
        checks.flag("jitter", value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Dispatcher(call_timeout=True), "call_timeout must be a positive number of seconds, got True"),
        (
            lambda: Dispatcher(call_timeout="5"),  # type: ignore[arg-type]
            "call_timeout must be a positive number of seconds, got '5'",
        ),
        (lambda: Dispatcher(max_concurrency=True), "max_concurrency must be an int >= 1, got True"),
        (lambda: RetryPolicy(timeout=math.nan), "timeout must be a positive number of seconds, got nan"),
        (lambda: RetryPolicy(attempts=2.0), "attempts must be an int >= 1, got 2.0"),  # type: ignore[arg-type]
        (lambda: FleetServer(limit=True), "limit must be an int >= 1, got True"),
    ],
)
def test_the_public_settings_use_the_checks(make: object, message: str) -> None:
    """Settings that once let a bool or a string through (True > 0) now refuse it with the shared wording."""
    with pytest.raises(ConfigurationError, match="^" + message.replace("(", r"\(")):
        make()  # type: ignore[operator]
