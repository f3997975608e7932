"""The online concurrency limit of one server: a state machine fed each call's latency and outcome.

Everything that decides an adaptive limit (`AdaptiveLimit`) lives in this file. `Controller` does no I/O
and reads no clock: the wiring (`_online`) tells it when a call is sent (`start`, with the loop's time)
and how it ended (`finish`: the time and a `Signal`), and reads `limit` back, the most calls the server
may have in flight now. Every interleaving can be tested without an event loop.

The rule
--------
The limit follows the *knee*: the most calls the server serves at its unloaded speed. Three kinds of
evidence move it:

- Latency. Each tool keeps its own unloaded baseline (the lowest latency seen, drifting up only on
  calls that ran with at most `floor` calls in flight, so a server that became slower for good is
  followed). A call's ratio ``r = latency / baseline`` above `tolerance` means the server was loaded
  when the call started with ``k`` calls in flight: by Little's law it serves about ``k / r`` at full
  speed, and the limit drops to that (by at most `backoff` per answer, so that one outlier cannot
  pin the limit down). The estimate becomes the *knee*.
- Overload: an overload answer (`Signal.OVERLOAD`, only ever from a trusted server's words; see
  `_online`) or a timeout multiplies the limit by `backoff`, once per round: a call sent before the
  last cut cannot cut again, since it reports the load that cut already answered. A Retry-After the
  trusted server gave holds every send until it has passed (`wait`), capped at `max_wait`.
- Growth. Only an answer whose call found the server at its limit (``k >= limit`` when it was sent,
  or calls waiting for room when it came back: the limit, not the traffic, held them back) and whose
  latency stayed within `tolerance` of the baseline makes the limit grow: by half a call per such
  answer (1.5x per round of calls) while no knee is known or the limit is below it; at the knee, by a
  *probe* every 32 such answers (four rounds if more), or every second if that comes first, so that
  bursts too short to count up to 32 still probe.

A probe is one call above the limit, not a higher limit: once that one call is sent the limit is back
where it was until the probe's answer says what one more call costs. An answer within half the
tolerance of the baseline forgets the knee (the server has room: growth is fast again); within the
tolerance, the knee moves up by one; above it, the probe's slowdown is a latency sample like any
other. So the server is never held down to measure it (the traffic's own quiet moments give the
baseline), and what a probe costs is at most one slower call in `probe_every`.

Quiet periods change nothing: the limit, the knee and the baselines wait for the next burst. Calls
that may mutate run alone whatever the limit (the gate's rule), so only calls of read-only tools
(`finish(..., read=True)`) move the limit; a write's Retry-After is still honoured.

Cost: `start`, `finish`, `wait` and `limit` are O(1); a server keeps one float per tool it has
answered for, at most `_MAX_TOOLS` of them.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass

from ._backoff import is_number
from ._errors import ConfigurationError

__all__ = ["AUTO", "AdaptiveLimit", "Controller", "Flight", "Signal", "check_limit", "retry_after", "says_overloaded"]

# What counts as a tool's unloaded latency is at least this many seconds: a ratio of two latencies that
# read zero on a virtual clock (or a few microseconds on a real one) says nothing.
_EPSILON = 1e-5
# Baselines kept per server; a server that renames its tools at every listing cannot make it grow.
_MAX_TOOLS = 1024
# How far a baseline moves towards a call that ran (almost) alone and was slower than it.
_DRIFT = 0.1
# Growth per answer at the limit, in calls: after one round (limit answers), the limit is 1.5x.
_GAIN = 0.5
# The answers at the knee between two probes: at least this many, and at least four rounds.
_PROBE_EVERY = 32
_PROBE_ROUNDS = 4
# ... or, whichever comes first, this many seconds after the last probe.
_PROBE_SECONDS = 1.0
# After an overload answer, probes come this many times less often, and add one call at a time: a
# rate limit shows no slowdown, only the next overload, after its bucket has drained.
_RATE_PACE = 4


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


class Signal(enum.Enum):
    """How a call sent to the server ended, as far as its load is concerned."""

    ANSWER = "answer"
    """The server answered (a result, or an error result that claims no overload): a latency sample."""
    OVERLOAD = "overload"
    """A trusted server said it is overloaded (a -32000 family error, a 429, rate-limit words)."""
    TIMEOUT = "timeout"
    """No answer in time: the call's timeout, its idle timeout or the SDK's read timeout."""
    OTHER = "other"
    """Cancelled, or failed in a way that says nothing about load (a bad request, a lost connection)."""


class Flight:
    """One call on its way to the server, from `Controller.start` to `Controller.finish`."""

    __slots__ = ("at", "epoch", "in_flight", "limit", "probe")

    def __init__(self, at: float, in_flight: int, limit: int, epoch: int, probe: bool) -> None:
        self.at = at
        self.in_flight = in_flight
        """The calls in flight on the server once this one was sent, itself included."""
        self.limit = limit
        """The limit in force when it was sent (the probe's is the one it went past)."""
        self.epoch = epoch
        self.probe = probe


class Controller:
    """The adaptive limit of one server (see the module docstring for the rule).

    Args:
        setting: The floor, ceiling and factors.
    """

    __slots__ = (
        "_base",
        "_eager",
        "_epoch",
        "_hold_until",
        "_knee",
        "_level",
        "_probe",
        "_probed_at",
        "_probing",
        "_rated",
        "_since",
        "_too_many",
        "ceiling",
        "floor",
        "in_flight",
        "limit",
        "setting",
    )

    def __init__(self, setting: AdaptiveLimit) -> None:
        self.setting = setting
        self.floor = setting.floor
        self.ceiling = setting.ceiling
        self._level = float(setting.start)
        self.limit = setting.start
        """The most calls the server may have in flight now (one more while a probe is armed)."""
        self.in_flight = 0
        """The calls sent and not yet answered."""
        # The knee found by the last slowdown or overload, if any: growth is cautious from there.
        self._knee: float | None = None
        self._too_many: int | None = None
        # Whether to probe as soon as the level reaches the knee (a clean probe set it, below a cut).
        self._eager = False
        self._base: dict[str, float] = {}
        # Bumped at every cut: a call sent before it reports load the cut already answered.
        self._epoch = 0
        # Answers at the limit since it last changed (paces the probes).
        self._since = 0
        # Whether the limit shows one more call than the level for a probe.
        self._probe = False
        # Whether the probe's call is on its way (no other probe is armed until it answers).
        self._probing = False
        self._hold_until = -math.inf
        # When the last probe was sent.
        self._probed_at = -math.inf

    @property
    def knee(self) -> float | None:
        """The capacity the last slowdown or overload showed, or None while none is known."""
        return self._knee

    def wait(self, now: float) -> float:
        """Seconds a call must wait before it is sent: what is left of a Retry-After (else 0)."""
        return max(0.0, self._hold_until - now)

    def start(self, now: float) -> Flight:
        """A call is sent now; returns its record, to give back to `finish`."""
        self.in_flight += 1
        probe = self._probe and self.in_flight > self._level_limit()
        if probe:
            # The one call past the limit is sent; the limit is back where it was until it answers.
            self._probe = False
            self._probing = True
            self._since = 0
            self._probed_at = now
            self.limit = self._level_limit()
        return Flight(now, self.in_flight, self.limit, self._epoch, probe)

    def finish(
        self,
        flight: Flight,
        now: float,
        signal: Signal,
        *,
        tool: str = "",
        read: bool = True,
        retry_after: float | None = None,
        waiting: bool = False,
    ) -> None:
        """A call sent with `start` ended at `now`.

        Args:
            flight: What `start` returned.
            now: When it ended, on the clock `start` was given.
            signal: How it ended.
            tool: Its tool, whose unloaded baseline its latency is compared with.
            read: Whether it is a call of a read-only tool (only those move the limit).
            retry_after: Seconds the server asked to wait before the next call, if it did (counted for
                an OVERLOAD only).
            waiting: Whether calls of the server were waiting for room under its limit when it ended.
        """
        self.in_flight -= 1
        if flight.probe:
            self._probing = False
        if signal is Signal.OVERLOAD and retry_after is not None and retry_after > 0:
            self._hold_until = max(self._hold_until, now + min(retry_after, self.setting.max_wait))
        if not read:
            return
        if signal is Signal.ANSWER:
            self._answer(flight, now, tool, waiting=waiting)
        elif signal is Signal.OVERLOAD or signal is Signal.TIMEOUT:
            self._overload(flight)

    def _level_limit(self) -> int:
        return min(self.ceiling, max(self.floor, math.floor(self._level + 1e-9)))

    def _set_level(self, level: float) -> None:
        self._level = min(float(self.ceiling), max(float(self.floor), level))
        self._since = 0
        self._probe = False
        self.limit = self._level_limit()

    def _cut(self, level: float, knee: float, too_many: int) -> None:
        self._epoch += 1
        self._eager = False
        self._knee = knee
        # Where the server showed it had had enough: fast growth after a clean probe stops short of it.
        self._too_many = too_many
        self._set_level(level)

    def _overload(self, flight: Flight) -> None:
        if flight.epoch != self._epoch:
            return  # sent before the last cut: that cut answered the load it reports
        level = max(float(self.floor), math.floor(self._level * self.setting.backoff + 1e-9))
        # The knee is just under where the server said it had had enough.
        k = flight.in_flight
        self._cut(level, max(level, min(self._level, float(k)) - 1), k)
        self._rated = True

    def _answer(self, flight: Flight, now: float, tool: str, *, waiting: bool) -> None:
        latency = max(0.0, now - flight.at)
        k = flight.in_flight
        base = self._baseline(tool, latency, k)
        ratio = (latency + _EPSILON) / (base + _EPSILON)
        tolerance = self.setting.tolerance
        current = flight.epoch == self._epoch
        if ratio > tolerance:
            if flight.probe:
                if current:
                    self._knee = self._level  # the probe's one call more was one too many
                return
            # Loaded: the server serves about k / ratio calls at its unloaded speed (Little's law). One
            # answer cuts by `backoff` at most from the limit it was sent under, so neither an outlier
            # nor the answers of calls sent before a cut can pin the limit down.
            estimate = max(math.floor(k / ratio + 0.5), math.floor(flight.limit * self.setting.backoff + 1e-9))
            if estimate < self._level:
                level = max(float(self.floor), float(estimate))
                self._cut(level, level, k)
                self._rated = False
            return
        if not current:
            return  # sent before the last cut: it says nothing about the limit now
        if flight.probe:
            too_many = self._too_many
            if ratio > 1 + (tolerance - 1) / 2:
                self._knee = self._level  # slower by a little: the one call more bought nothing
                return
            if self._rated:
                self._knee = float(k)  # a rate limit answers a probe later, if at all: one call more
            elif too_many is not None and k < too_many:
                # No slowdown: grow fast again, up to just short of where the server last had had
                # enough, and probe that at once.
                self._knee = float(too_many - 1)
                self._eager = True
            else:
                self._knee = None  # no slowdown even there: the server has room, up to the ceiling
                self._too_many = None
            self._set_level(max(self._level, float(k)))
            return
        if k < flight.limit and not waiting:
            return  # the traffic, not the limit, held it back
        knee = self._knee
        if knee is None or self._level < knee:
            top = float(self.ceiling) if knee is None else knee
            if self._level < top:
                self._level = min(top, self._level + _GAIN)
                before, self.limit = self.limit, self._level_limit()
                if self.limit != before:
                    self._since = 0
            return
        if self._level >= self.ceiling or self._probe or self._probing:
            return
        self._since += 1
        pace = _RATE_PACE if self._rated else 1
        due = self._since >= pace * max(_PROBE_EVERY, _PROBE_ROUNDS * self.limit)
        # Bursts too short to count up to a probe still get one, a second (or `pace` seconds) apart.
        if self._eager or due or now - self._probed_at >= pace * _PROBE_SECONDS:
            self._eager = False
            self._probe = True
            self.limit = self._level_limit() + 1

    def _baseline(self, tool: str, latency: float, k: int) -> float:
        bases = self._base
        base = bases.get(tool)
        if base is None:
            if len(bases) >= _MAX_TOOLS:
                bases.pop(next(iter(bases)))
            bases[tool] = latency
            return latency
        if latency < base:
            bases[tool] = latency
            return latency
        if k <= self.floor:
            # A call that ran (almost) alone was slower: the server itself got slower, not loaded.
            bases[tool] = base = base + _DRIFT * (latency - base)
        return base


# What a trusted server's own words say about its load ------------------------------------------------------

# Words with which servers and the APIs behind them say they are overloaded or rate limited.
_OVERLOAD_WORDS = re.compile(
    r"\b(?:429|503)\b|too many requests|rate[ _-]?limit|overload|throttl|over capacity|capacity exceeded"
    r"|retry[ _-]?after|service unavailable|server (?:is )?busy",
    re.IGNORECASE,
)
_RETRY_AFTER_TEXT = re.compile(
    r"(?:retry[ _-]?after|try again in|retry in)[\"'\s:=]*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?)?\b",
    re.IGNORECASE,
)
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
    if unit.startswith("m"):
        seconds /= 1000
    return seconds if math.isfinite(seconds) else None
