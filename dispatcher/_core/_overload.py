"""What a trusted server's own words say about its load: overload words and a Retry-After.

The wiring (`_mcp._online`) reads these in a trusted server's errors and error results only (an untrusted
server's words never count), and turns them into the adaptive controller's `Signal.OVERLOAD` and its
`retry_after` (`_adaptive.Controller.finish`). No I/O.

Cost: one regular-expression search over at most the first `_TEXT_READ` characters of a message.
"""

from __future__ import annotations

import math
import re

from ._backoff import is_number

__all__ = ["retry_after", "says_overloaded"]

# Words with which servers and the APIs behind them say they are overloaded or rate limited.
_OVERLOAD_WORDS = re.compile(
    r"\b(?:429|503)\b|too many requests|rate[ _-]?limit|overload|throttl|over capacity|capacity exceeded"
    r"|retry[ _-]?after|service unavailable|server (?:is )?busy",
    re.IGNORECASE,
)
_RETRY_AFTER_TEXT = re.compile(
    r"(?:retry[ _-]?after|try again in|retry in)[\"'\s:=]*(\d+(?:\.\d+)?)\s*"
    r"(milliseconds?|millis|msecs?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h)?\b",
    re.IGNORECASE,
)
# Seconds per unit, by the unit's first letters ("100 msecs" is a tenth of a second, not 100 seconds).
_UNITS = (("ms", 0.001), ("mil", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))
_RETRY_AFTER_KEYS = ("retryAfter", "retry_after", "retry-after", "Retry-After", "retryAfterSeconds")
# The most of a text that is read for these words: an answer can be megabytes.
_TEXT_READ = 4096


def says_overloaded(text: str) -> bool:
    """Whether a message says the server is overloaded or rate limited (a 429, "rate limit", ...)."""
    return _OVERLOAD_WORDS.search(text[:_TEXT_READ]) is not None


def retry_after(text: str = "", data: object = None) -> float | None:
    """The seconds a server asked to wait, from an error's data (``{"retryAfter": 2}``) or its text.

    Returns:
        A finite number of seconds >= 0, or None when the server named none (or nonsense).
    """
    if isinstance(data, dict):
        for key in _RETRY_AFTER_KEYS:
            value: object = data.get(key)
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    continue
            if isinstance(value, int | float) and is_number(value) and 0 <= value < math.inf:
                return float(value)
    found = _RETRY_AFTER_TEXT.search(text[:_TEXT_READ])
    if found is None:
        return None
    seconds = float(found.group(1))
    unit = (found.group(2) or "s").lower()
    seconds *= next(scale for prefix, scale in _UNITS if unit.startswith(prefix))
    return seconds if math.isfinite(seconds) else None
