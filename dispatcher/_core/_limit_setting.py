"""The setting of an online concurrency limit (`AdaptiveLimit`): its floor, ceiling and factors, checked.

What a user passes as a server's ``max_concurrency=`` when it is not a fixed number: the frozen settings that
`_adaptive.Controller` follows, and `check_limit`, which reads any per-server `max_concurrency` as given. No
state, no I/O: each value is checked once, when it is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._backoff import is_number
from ._errors import ConfigurationError

__all__ = ["AUTO", "AdaptiveLimit", "check_limit"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AdaptiveLimit:
    """A per-server concurrency limit that follows the server online, between a floor and a ceiling.

    Pass it as ``max_concurrency=`` to `Dispatcher.connect` or `Dispatcher.add_mcp_server` (the string
    ``"auto"`` is `AdaptiveLimit()`). The limit grows while the server answers read-only calls at their
    unloaded speed with calls waiting for room, drops to the knee the slowdown shows when answers come
    back slower, is cut by `backoff` on a timeout or a trusted server's overload answer (a -32000
    family error, a 429, a rate-limit message) and honours the Retry-After such an answer gives. An
    untrusted server's words never count: its limit follows timeouts and latency alone. See
    docs/tuning.md ("The online limit").

    Args:
        floor: The limit never goes below this (>= 1).
        ceiling: ... nor above this (>= floor).
        initial: Where it starts; None: ``min(ceiling, max(floor, 4))``.
        tolerance: A latency up to this multiple of the tool's unloaded baseline still counts as
            unloaded (> 1). Raise it for a server whose latency is noisy at any load.
        backoff: What an overload signal multiplies the limit by (0 < backoff < 1), and the most one
            slow answer can cut it by.
        max_wait: The longest Retry-After, in seconds, that holds the server's calls back (a larger one
            is cut to this); 0 ignores Retry-After.

    Raises:
        ConfigurationError: A value is out of range; the message says what is accepted.
    """

    floor: int = 1
    ceiling: int = 64
    initial: int | None = None
    tolerance: float = 1.1
    backoff: float = 0.5
    max_wait: float = 30.0

    def __post_init__(self) -> None:
        for name in ("floor", "ceiling"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"AdaptiveLimit {name} must be an int >= 1, got {value!r}")
        if self.ceiling < self.floor:
            raise ConfigurationError(
                f"AdaptiveLimit ceiling ({self.ceiling}) must be >= floor ({self.floor}); "
                f"for a fixed limit pass max_concurrency={self.floor} instead"
            )
        initial = self.initial
        if initial is not None and (
            not isinstance(initial, int) or isinstance(initial, bool) or not self.floor <= initial <= self.ceiling
        ):
            raise ConfigurationError(
                f"AdaptiveLimit initial must be an int from floor ({self.floor}) to ceiling ({self.ceiling}) "
                f"or None, got {initial!r}"
            )
        if not is_number(self.tolerance) or not 1 < self.tolerance < math.inf:
            raise ConfigurationError(
                f"AdaptiveLimit tolerance must be a finite number > 1 (1.1: 10% slower than unloaded still "
                f"counts as unloaded), got {self.tolerance!r}"
            )
        if not is_number(self.backoff) or not 0 < self.backoff < 1:
            raise ConfigurationError(
                f"AdaptiveLimit backoff must be a number between 0 and 1 (0.5 halves the limit on overload), "
                f"got {self.backoff!r}"
            )
        if not is_number(self.max_wait) or not 0 <= self.max_wait < math.inf:
            raise ConfigurationError(
                f"AdaptiveLimit max_wait must be a finite number of seconds >= 0, got {self.max_wait!r}"
            )

    @property
    def start(self) -> int:
        """The limit it starts at."""
        return self.initial if self.initial is not None else min(self.ceiling, max(self.floor, 4))


AUTO = AdaptiveLimit()
"""What ``max_concurrency="auto"`` means."""


def check_limit(value: object, server: str) -> int | AdaptiveLimit | None:
    """A per-server `max_concurrency` as given: an int >= 1, None, "auto" or an `AdaptiveLimit`.

    Raises:
        ConfigurationError: Anything else, with what is accepted.
    """
    if value is None or isinstance(value, AdaptiveLimit):
        return value
    if value == "auto":
        return AUTO
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigurationError(
        f"max_concurrency for server {server!r} must be an int >= 1, 'auto' or an AdaptiveLimit, got {value!r}; "
        "use None for no limit"
    )
