"""The backoff shape shared by `RetryPolicy` and `ReconnectPolicy`: an initial wait doubling up to a maximum."""

from __future__ import annotations

import math

from ._errors import ConfigurationError

__all__ = ["ceiling", "check_waits", "is_number"]


def is_number(value: object) -> bool:
    """Whether `value` is an int or float (not a bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return not math.isnan(value)
    except OverflowError:
        return False  # an int too large for a float (JSON's and Python's ints have no bound): no seconds


def check_waits(wait_initial: object, wait_max: object) -> None:
    """Raise `ConfigurationError` unless ``0 <= wait_initial <= wait_max < inf``."""
    if not is_number(wait_initial) or not 0 <= wait_initial < math.inf:  # type: ignore[operator]
        raise ConfigurationError(f"wait_initial must be a finite number of seconds >= 0, got {wait_initial!r}")
    if not is_number(wait_max) or not wait_initial <= wait_max < math.inf:  # type: ignore[operator]
        raise ConfigurationError(
            f"wait_max must be a finite number of seconds >= wait_initial ({wait_initial!r}), got {wait_max!r}"
        )


def ceiling(n: int, wait_initial: float, wait_max: float) -> float:
    """The wait before the `n`-th retry (1 for the first): ``min(wait_max, wait_initial * 2**(n-1))``."""
    return min(wait_max, wait_initial * 2.0 ** min(n - 1, 64))
