"""Checks of the settings users pass: one wording, one definition of a valid number, for every setting.

A setting's check says what the setting must be, what it got, and, where a value has a meaning the user
may be looking for, how to get it (`"; use None for no limit"`). A bool is never a number here (True is
an int to Python, not a concurrency limit), and NaN or infinity is never a number of seconds.
"""

from __future__ import annotations

import math
from typing import overload

from ._errors import ConfigurationError

__all__ = ["flag", "seconds", "whole"]


def _message(name: str, wanted: str, value: object, none: str | None, hint: str) -> str:
    return (
        f"{name} must be {wanted}, got {value!r}"
        + (f"; use None for {none}" if none else "")
        + (f"; {hint}" if hint else "")
    )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@overload
def whole(
    name: str, value: object, *, minimum: int = ..., maximum: int | None = ..., none: None = ..., hint: str = ...
) -> int: ...
@overload
def whole(
    name: str, value: object, *, minimum: int = ..., maximum: int | None = ..., none: str, hint: str = ...
) -> int | None: ...
def whole(
    name: str,
    value: object,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    none: str | None = None,
    hint: str = "",
) -> int | None:
    """`value` as a whole number from `minimum` (to `maximum`).

    Args:
        name: The setting, as the user wrote it.
        value: What the user passed.
        minimum: The smallest value allowed.
        maximum: The largest value allowed, if any.
        none: What None means, when None is allowed ("no limit"); None: it is not allowed.
        hint: What else the message should tell (how to get what the user may want).

    Raises:
        ConfigurationError: `value` is not an int in the range (a bool is not an int here).
    """
    if value is None and none is not None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        if maximum is None or value <= maximum:
            return value
    wanted = f"an int >= {minimum}" if maximum is None else f"an int from {minimum} to {maximum}"
    raise ConfigurationError(_message(name, wanted, value, none, hint))


@overload
def seconds(name: str, value: object, *, none: None = ..., zero: bool = ..., hint: str = ...) -> float: ...
@overload
def seconds(name: str, value: object, *, none: str, zero: bool = ..., hint: str = ...) -> float | None: ...
def seconds(name: str, value: object, *, none: str | None = None, zero: bool = False, hint: str = "") -> float | None:
    """`value` as a finite, positive number of seconds (or zero, when `zero` allows it).

    Args:
        name: The setting, as the user wrote it.
        value: What the user passed.
        none: What None means, when None is allowed ("none", "no bound"); None: it is not allowed.
        zero: Whether 0 is allowed.
        hint: What else the message should tell.

    Raises:
        ConfigurationError: `value` is not such a number (a bool, NaN and infinity are not).
    """
    if value is None and none is not None:
        return None
    if _number(value) and math.isfinite(value) and (value > 0 or (zero and value == 0)):  # type: ignore[arg-type, operator]
        return value  # type: ignore[return-value]
    wanted = "a number of seconds >= 0" if zero else "a positive number of seconds"
    raise ConfigurationError(_message(name, wanted, value, none, hint))


def flag(name: str, value: object) -> bool:
    """`value` as True or False.

    Raises:
        ConfigurationError: `value` is not a bool.
    """
    if isinstance(value, bool):
        return value
    raise ConfigurationError(f"{name} must be True or False, got {value!r}")
