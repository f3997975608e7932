"""The workspace's models of a server under strain: its faults, its saturation and its rate limit's answer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, get_args

from dispatcher.testing import FaultKind, Strike

__all__ = ["RATE_LIMITED", "FaultConfig", "check_latency", "saturated_latency"]

_FAULT_KINDS: Final = frozenset(get_args(FaultKind))


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultConfig:
    """Which tool calls of the workspace fail on purpose, and how.

    The workspace passes these to `dispatcher.testing.inject_faults`: the fate of the n-th targeted
    call depends only on `seed` and n, so runs that send their calls in the same order fail in the
    same places.

    Attributes:
        rate: The probability, from 0 to 1, that a targeted call fails.
        seed: The seed of the random generator.
        tools: The names of the tools whose calls may fail; `None` targets every tool.
        kinds: The fault kinds to choose from, uniformly (see `dispatcher.testing.FaultKind`).
        strike: When they strike (see `dispatcher.testing.Strike`): ``"after"`` lets the tool run and
            have its effect, then loses its answer.
    """

    rate: float = 0.0
    seed: int = 0
    tools: frozenset[str] | None = None
    kinds: tuple[FaultKind, ...] = ("error",)
    strike: Strike = "before"

    def __post_init__(self) -> None:
        if not (0.0 <= self.rate <= 1.0):
            raise ValueError(f"rate must be between 0 and 1, got {self.rate!r}")
        if isinstance(self.tools, str):
            raise TypeError(f"tools must be a set of tool names, not a str; write frozenset({{{self.tools!r}}})")
        if self.tools is not None:
            # Accept any iterable of names, but store the declared frozen type.
            object.__setattr__(self, "tools", frozenset(self.tools))
        if isinstance(self.kinds, str):
            raise TypeError(f"kinds must be a tuple of fault kinds, not a str; write ({self.kinds!r},)")
        object.__setattr__(self, "kinds", tuple(self.kinds))
        if not self.kinds:
            raise ValueError(f"kinds must name at least one fault kind out of {sorted(_FAULT_KINDS)}")
        unknown = sorted(set(self.kinds) - _FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; choose from {sorted(_FAULT_KINDS)}")


def saturated_latency(latency: float, in_flight: int, saturation: int | None, collapse: float = 0.0) -> float:
    """The latency of one execution under the workspace's saturation model.

    The server behaves like a resource that serves `saturation` executions at full speed and shares
    itself beyond that: an execution that starts with `in_flight` executions running (itself
    included) takes `latency * max(1, in_flight / saturation)`. With k executions kept in flight,
    throughput is `k / latency` up to k = `saturation`, then stays at `saturation / latency`: adding
    concurrency past the knee only adds latency. With `collapse` > 0 the server also thrashes past
    the knee (each execution beyond it costs everyone more): the latency is further multiplied by
    `1 + collapse * (in_flight - saturation) / saturation`, so throughput falls past the knee.

    Args:
        latency: The latency of an execution on an idle server, in seconds.
        in_flight: The executions running when it starts, itself included.
        saturation: The concurrency at which the server saturates; `None` never saturates.
        collapse: How fast goodput falls past the knee (0: it stays flat).

    Returns:
        The seconds the execution takes.
    """
    if saturation is None:
        return latency
    share = max(1.0, in_flight / saturation)
    if collapse and in_flight > saturation:
        share *= 1 + collapse * (in_flight - saturation) / saturation
    return latency * share


RATE_LIMITED = -32000
"""The JSON-RPC code of the workspace's answer to a call over its rate limit (a server-defined error)."""


def check_latency(what: str, seconds: float) -> None:
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {seconds!r}")
