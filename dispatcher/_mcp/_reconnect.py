"""`ReconnectPolicy`: how a connection the dispatcher owns is kept, checked, replaced and closed."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._core._backoff import ceiling, check_waits, is_number
from .._core._errors import ConfigurationError

__all__ = ["ReconnectPolicy"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconnectPolicy:
    """Settings of the connections `Dispatcher.connect` owns.

    A lost connection is reconnected at once, by the next call that needs it; only attempts that fail
    make the next one wait, with the same backoff shape as `RetryPolicy` (no jitter: one supervisor per
    server makes the attempts, so there is no herd to spread).

    Args:
        wait_initial: Seconds to wait after the first failed reconnect attempt before the next one.
        wait_max: The longest wait between two reconnect attempts; the wait doubles up to it.
        ping_timeout: Seconds a server has to answer the ping that checks its connection (after a call
            was given up on, or answered -32000, which is also what the SDK reports for a closed
            connection); no answer in time is a lost connection.
        close_grace: Seconds the connection gets to close cleanly when the dispatcher exits, before it
            is cancelled.
        listen_timeout: Seconds a 2026-07-28 server has to acknowledge ``subscriptions/listen``; without
            an acknowledgement, the connection is used without following tool list changes.

    Raises:
        ConfigurationError: A value is out of range; the message says what is accepted.
    """

    wait_initial: float = 1.0
    wait_max: float = 30.0
    ping_timeout: float = 10.0
    close_grace: float = 5.0
    listen_timeout: float = 10.0

    def __post_init__(self) -> None:
        check_waits(self.wait_initial, self.wait_max)
        for name in ("ping_timeout", "close_grace", "listen_timeout"):
            value = getattr(self, name)
            if not is_number(value) or not 0 < value < math.inf:
                raise ConfigurationError(f"{name} must be a finite number of seconds > 0, got {value!r}")

    def backoff(self, failures: int) -> float:
        """Seconds to wait after `failures` reconnect attempts in a row have failed (1 or more)."""
        return ceiling(failures, self.wait_initial, self.wait_max)
