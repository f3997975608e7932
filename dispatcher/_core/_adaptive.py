"""The online concurrency limit of one server: a state machine fed each call's latency and outcome.

What decides an adaptive limit lives here and in `_growth` (its setting, `AdaptiveLimit`, in
`_limit_setting`; what a server's words say about its load in `_overload`). `Controller` does no I/O and
reads no clock: the wiring (`_online`) tells it when a call is sent (`start`, with the loop's time) and
how it ended (`finish`: the time and a `Signal`), and reads `limit` back, the most calls the server may
have in flight now. Every interleaving can be tested without an event loop.

The rule
--------
The limit follows the *knee*: the most calls the server serves at its unloaded speed. Three kinds of
evidence move it:

- Latency, judged per *round* (the answers of a limit's worth of calls, 4 to 32). Each tool keeps its
  own unloaded baseline: its fastest answer on a server without noise; on a noisy one, its first
  round's lower quartile, moving towards the median of every unloaded round (and all the way to a
  round of calls that ran with at most `floor` in flight: the server itself got slower, not loaded).
  A call's slowdown ``r = latency / baseline`` with ``k`` calls in flight says the server serves about
  ``k / r`` at full speed (Little's law). A round is loaded when its median slowdown is above
  `tolerance`, widened by the round's noise (the spread of its middle half, relative to its median,
  over the square root of its size), and three quarters of it are slower than `tolerance`; then the
  limit drops to the round's median ``k / r`` (by at most `backoff`). The estimate becomes the *knee*.
  So one slow answer of a noisy server moves nothing: noise without load leaves the limit where it
  is. On a server whose rounds show no noise, one slower answer is load already, and cuts on its own
  (by at most `backoff` from the limit it was sent under, so an outlier cannot pin the limit down).
- Overload: an overload answer (`Signal.OVERLOAD`, only ever from a trusted server's words; see
  `_online`) or a timeout multiplies the limit by `backoff`, once per round: a call sent before the
  last cut cannot cut again, since it reports the load that cut already answered. A Retry-After the
  trusted server gave holds every send until it has passed (`wait`), capped at `max_wait`.
- Growth. Only an answer whose call found the server at its limit (``k >= limit`` when it was sent,
  or calls waiting for room when it came back: the limit, not the traffic, held them back) and whose
  slowdown stayed within `tolerance` (plus the noise) makes the limit grow: by one call per such answer
  while no knee is known, up to what is proven allows (`_growth.Proof`: 1.25x per round), by half a
  call below a known knee; at the knee, by a *probe* every 32 such answers (four rounds if more), or
  every second if that comes first (a due one rides a burst's first round), so that bursts too short
  to count up to 32 still probe. Past proven, a slowdown cuts back to proven, not below. An answer
  proves the calls in flight with it less those sent no later than it and still out (they may come
  back slower): a round is proven as far as its answers are in, not by its fastest ones.
- Noise. On a noisy server no one answer is evidence: a clean probe adds one call, and at the knee a round
  at the limit grows it by one call (the next round, judged whole, says if that was too many). A noisy
  round past what was proven before it never raises a baseline (a load would hide in the noise).

A probe is one call above the limit, not a higher limit: once that one call is sent the limit is back
where it was until the probe's answer says what one more call costs. An answer within half the
tolerance (plus the noise) of the baseline moves the knee (the server has room: one call more, and
the next is probed at once, up to just short of where the server last had had enough; after a rate
limit, one call more; past it, the knee is forgotten, with calls waiting: 4x); a slower one leaves it; no probe
counts in a round. So the server is never held down to measure it (the traffic's own quiet moments give the
baseline), and what a probe costs is at most one slower call in 32.

Quiet periods change nothing: the limit, the knee and the baselines wait for the next burst. Calls
that may mutate run alone whatever the limit (the gate's rule), so only calls of read-only tools
(`finish(..., read=True)`) move the limit; a write's Retry-After is still honoured.

Cost: `start`, `wait` and `limit` are O(1); `finish` is O(1) but at the end of a round, which sorts
the round's answers (O(n log n) once per n answers, n <= 32). A server keeps one float per tool it has
answered for, at most `_MAX_TOOLS` of them, and the answers of one round.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING

from ._backoff import is_number
from ._growth import Outstanding, Overlap, Proof, grow_to

if TYPE_CHECKING:
    from ._limit_setting import AdaptiveLimit

__all__ = ["Controller", "Flight", "Signal"]

# What counts as a tool's unloaded latency is at least this many seconds: a ratio of two latencies that
# read zero on a virtual clock (or a few microseconds on a real one) says nothing.
_EPSILON = 1e-5
# Baselines kept per server; a server that renames its tools at every listing cannot make it grow.
_MAX_TOOLS = 1024
# How far a baseline moves towards the median latency of a round judged unloaded.
_DRIFT = 0.1
# Growth per answer at the limit, in calls, while no knee is known: after one round (limit answers), the
# limit is 2x (half that below a known knee: 1.5x).
_GAIN = 1.0
# A round is this many answers (its limit's worth, within these bounds); it is judged as a whole.
_ROUND_MIN = 4
_ROUND_MAX = 32
# How much noise (the spread of a round's middle half, relative to its median) widens the tolerance: for
# a round's median, by this many standard errors; for one answer (growth, probes), by this many spreads.
_NOISE_ROUND = 2.0
_NOISE_ANSWER = 1.0
# A spread under this is a server without noise: its fastest answer is its unloaded speed.
_QUIET = 0.05
# The answers at the knee between two probes: at least this many, and at least four rounds.
_PROBE_EVERY = 32
_PROBE_ROUNDS = 4
# ... or, whichever comes first, this many seconds after the last probe.
_PROBE_SECONDS = 1.0
# After an overload answer, probes come this many times less often, and add one call at a time: a
# rate limit shows no slowdown, only the next overload, after its bucket has drained.
_RATE_PACE = 4


class Signal(enum.Enum):
    """How a call sent to the server ended, as far as its load is concerned."""

    ANSWER = "answer"
    """The server answered with a result (not an error result: how fast a server refuses a call is no
    measure of its load): a latency sample."""
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
        "_fresh",
        "_hold_until",
        "_knee",
        "_level",
        "_out",
        "_overlap",
        "_probe",
        "_probed_at",
        "_probing",
        "_proof",
        "_rated",
        "_round",
        "_round_proven",
        "_since",
        "_spread",
        "_too_many",
        "ceiling",
        "floor",
        "in_flight",
        "limit",
        "setting",
        "top",
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
        self.top = math.inf
        """The most its last growth may take the level to (slow start: what is proven allows; else no bound):
        a fleet sharing the limit applies each process's growth up to it, so growths do not add up."""
        self._too_many: int | None = None
        # Whether to probe as soon as the level reaches the knee (a clean probe set it, below a cut).
        self._eager = False
        self._base: dict[str, float] = {}
        # Tools whose baseline is one answer so far: their first round sets it.
        self._fresh: set[str] = set()
        # The answers of the round under way: (tool, latency, calls in flight when it was sent).
        self._round: list[tuple[str, float, int]] = []
        self._round_proven = 0  # what was proven when the round under way began
        # The spread of the last round's latencies (see `_sample`): 0 for a server without noise; None
        # until a round has shown it.
        self._spread: float | None = None
        self._rated = False
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
        self._proof = Proof()
        self._overlap = Overlap()
        self._out = Outstanding()

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
        self._ride(now)
        probe = self._probe and self.in_flight > self._level_limit()
        if probe:
            # The one call past the limit is sent; the limit is back where it was until it answers.
            self._probe = False
            self._probing = True
            self._since = 0
            self._probed_at = now
            self.limit = self._level_limit()
        flight = Flight(now, self.in_flight, self.limit, self._epoch, probe)
        self._overlap.start(flight, now)
        self._out.start(now)
        return flight

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
        self._overlap.finish(flight, now)
        ahead = self._out.finish(flight.at)
        self.in_flight -= 1
        if flight.probe:
            self._probing = False
        if signal is Signal.OVERLOAD and retry_after is not None and retry_after > 0:
            self._hold_until = max(self._hold_until, now + min(retry_after, self.setting.max_wait))
        if not read:
            return
        if signal is Signal.ANSWER:
            self._answer(flight, now, tool, waiting=waiting, ahead=ahead)
        elif signal is Signal.OVERLOAD or signal is Signal.TIMEOUT:
            self._overload(flight)
        self._overlap.grown(now, self.limit, self._epoch)

    def _ride(self, now: float) -> None:
        """A burst fills the limit at the knee: a probe that is due rides its first round (one call more),
        if the server was probed before and not after a rate limit (a bucket answers that later)."""
        knee = self._knee
        if (
            knee is None
            or self._probe
            or self._probing
            or self._rated
            or self._probed_at == -math.inf
            or self._level < knee
            or self._level >= self.ceiling
            or self.in_flight != self._level_limit()
            or now - self._probed_at < _PROBE_SECONDS
        ):
            return
        self._probe = True
        self.limit = self._level_limit() + 1

    def _level_limit(self) -> int:
        return min(self.ceiling, max(self.floor, math.floor(self._level + 1e-9)))

    def _set_level(self, level: float) -> None:
        self.top = math.inf
        self._level = min(float(self.ceiling), max(float(self.floor), level))
        self._since = 0
        self._probe = False
        self.limit = self._level_limit()

    def _cut(self, level: float, knee: float, too_many: int) -> None:
        self._epoch += 1
        self._eager = False
        self._knee = knee
        self._too_many = too_many  # where the server had had enough: fast growth stops short of it
        self._proof.cut(level)
        self._set_level(level)

    def _overload(self, flight: Flight) -> None:
        if flight.epoch != self._epoch:
            return  # sent before the last cut: that cut answered the load it reports
        level = max(float(self.floor), math.floor(self._level * self.setting.backoff + 1e-9))
        # The knee is just under where the server said it had had enough.
        k = flight.in_flight
        self._cut(level, max(level, min(self._level, float(k)) - 1), k)
        self._rated = True

    def _answer(self, flight: Flight, now: float, tool: str, *, waiting: bool, ahead: int) -> None:
        latency = max(0.0, now - flight.at)
        k = flight.in_flight
        base = self._baseline(tool, latency)
        ratio = (latency + _EPSILON) / (base + _EPSILON)
        current = flight.epoch == self._epoch
        # One answer is compared with what the noise of the last rounds allows, never cut on alone.
        spread = self._spread
        loose = self.setting.tolerance + _NOISE_ANSWER * (spread or 0.0)
        epoch = self._epoch
        if ratio > loose and not flight.probe and spread is not None and spread <= _QUIET:
            # No noise: one slower answer is load already; it cuts by `backoff` at most from the limit it was sent
            # under (an outlier cannot pin the limit down). One that cut stays out of its round: load, not noise.
            self._slower(k / ratio, flight.limit, k)
        if current and not flight.probe and self._epoch == epoch:
            self._sample(tool, latency, k)
        if ratio > loose:
            if flight.probe and current:
                self._knee, self._too_many = self._level, k  # the probe's one call more was one too many
            return
        if not current:
            return  # sent before the last cut: it says nothing about the limit now
        if flight.probe:
            self._probe_answered(ratio, k, loose, waiting=waiting)
            return
        self._proof.clean(k - ahead)  # the calls sent with it that are still out may come back slower
        if k < flight.limit and not waiting:
            return  # the traffic, not the limit, held it back
        knee = self._knee
        if knee is None or self._level < knee:
            top = min(float(self.ceiling), self._proof.top(noisy=(spread or 0.0) > _QUIET)) if knee is None else knee
            if self._level < top:
                # Slow start while no knee is known (2x per round of answers), half that below a known one.
                self.top = top
                self._level = min(top, self._level + (_GAIN if knee is None else _GAIN / 2))
                before, self.limit = self.limit, self._level_limit()
                if self.limit != before:
                    self._since = 0
            return
        if self._level >= self.ceiling or self._probe or self._probing:
            return
        self._since += 1
        if (spread or 0.0) > _QUIET:  # no probe: a round at the limit grows it by one; the next round judges that
            if self._since >= self.limit:
                self._knee = self._level + 1
                self._set_level(self._knee)
            return
        pace = _RATE_PACE if self._rated else 1
        due = self._since >= pace * max(_PROBE_EVERY, _PROBE_ROUNDS * self.limit)
        # Bursts too short to count up to a probe still get one, a second (or `pace` seconds) apart.
        if self._eager or due or now - self._probed_at >= pace * _PROBE_SECONDS:
            self._eager = False
            self._probe = True
            self.limit = self._level_limit() + 1

    def _probe_answered(self, ratio: float, k: int, loose: float, *, waiting: bool) -> None:
        too_many = self._too_many
        if ratio > 1 + (loose - 1) / 2:
            self._knee, self._too_many = self._level, k  # slower by a little: the one call more bought nothing
            return
        self._proof.clean(k)
        if self._rated or (self._spread or 0.0) > _QUIET:
            self._knee = float(k)  # one call more: a rate limit answers later; one noisy answer proves nothing
        elif too_many is not None and k < too_many:
            # No slowdown below where the server last had had enough: one call more, and the next one
            # is probed at once (a knee seen is approached a call at a time, never overshot).
            self._knee = float(min(too_many - 1, max(k, self._level_limit() + 1)))
            self._eager = True
        else:
            # No slowdown even there: the server has room, up to the ceiling (with calls waiting, likely
            # much more than one call).
            self._knee = self._too_many = None
            if waiting:
                k = grow_to(k)
        self._set_level(max(self._level, float(k)))

    def _slower(self, served: float, limit: int, sent: int) -> None:
        """Calls sent under `limit` (with up to `sent` in flight) came back slower: the server serves about
        `served` at its unloaded speed. Past what is proven, the limit goes back to proven."""
        estimate = max(math.floor(served + 0.5), math.floor(limit * self.setting.backoff + 1e-9))
        proof = self._proof
        if proof.explains(sent, served):
            estimate = max(estimate, proof.level)
        if estimate < self._level:
            level = max(float(self.floor), float(estimate))
            self._cut(level, level, limit)
            self._rated = False

    def _sample(self, tool: str, latency: float, k: int) -> None:
        """Count an answer into the round; at the round's end, judge the round as a whole."""
        samples = self._round
        if not samples:
            self._round_proven = self._proof.level
        samples.append((tool, latency, k))
        if len(samples) < min(_ROUND_MAX, max(_ROUND_MIN, self.limit)):
            return
        self._round = []
        bases = self._base
        by_tool: dict[str, list[float]] = {}
        for name, seconds, _ in samples:
            by_tool.setdefault(name, []).append(seconds)
        middles = {name: sorted(latencies)[len(latencies) // 2] for name, latencies in by_tool.items()}
        lows = {name: sorted(latencies)[len(latencies) // 4] for name, latencies in by_tool.items()}
        fresh = self._fresh & middles.keys()
        ratios, served, noise = self._judge(samples)
        if fresh:
            self._fresh -= fresh
            if noise > _QUIET:
                # A noisy tool's first answer is no baseline: its first round's lower quartile is (a
                # loaded round still shows its load against it, and unloaded rounds move it on).
                for name in fresh:
                    bases[name] = lows[name]
                ratios, served, noise = self._judge(samples)
        self._spread = noise
        n = len(ratios)
        median, low = ratios[n // 2], ratios[n // 4]
        tolerance = self.setting.tolerance
        allowed = tolerance + _NOISE_ROUND * noise / math.sqrt(n)
        alone = all(sample[2] <= self.floor for sample in samples)
        if median > allowed and low > tolerance and not alone:
            # Loaded: the server serves about k / ratio calls at its unloaded speed (Little's law). A
            # round cuts by `backoff` at most from the limit its calls were sent under.
            sent = max(sample[2] for sample in samples)
            self._slower(served, sent, sent)
            return
        # Unloaded, or calls that ran (almost) alone: the round shows the server's unloaded speed now,
        # and each tool's baseline moves towards the round's median latency for it (all the way for a
        # round that ran alone and was slower: the server itself got slower, not loaded).
        weight = 1.0 if alone and median > allowed else _DRIFT
        # A noisy round past what was proven before it never raises a baseline (a load hides in the noise).
        new_high = noise > _QUIET and not alone and max(sample[2] for sample in samples) > self._round_proven
        for name, middle in middles.items():
            base = bases.get(name)
            if base is not None and not (new_high and middle > base):
                bases[name] = base + weight * (middle - base)

    def _judge(self, samples: list[tuple[str, float, int]]) -> tuple[list[float], float, float]:
        """A round's slowdowns (sorted), the calls the server serves at full speed, and its noise.

        Each answer's slowdown ``r = latency / baseline`` with ``k`` calls in flight says the server serves
        about ``k / r`` at full speed; the round's median of those is `served`. The noise is the spread of
        the middle half of the slowdowns, relative to their median: 0 for a server without noise at one
        load, the noise itself for a noisy one.
        """
        bases = self._base
        pairs = [((seconds + _EPSILON) / (bases.get(name, seconds) + _EPSILON), k) for name, seconds, k in samples]
        n = len(pairs)
        served = sorted(k / ratio for ratio, k in pairs)[n // 2]
        ratios = sorted(ratio for ratio, _ in pairs)
        return ratios, served, (ratios[(3 * n) // 4] - ratios[n // 4]) / ratios[n // 2]

    def _baseline(self, tool: str, latency: float) -> float:
        bases = self._base
        base = bases.get(tool)
        if base is None:
            if len(bases) >= _MAX_TOOLS:
                self._fresh.discard(next(iter(bases)))
                bases.pop(next(iter(bases)))
            bases[tool] = latency
            self._fresh.add(tool)
            return latency
        if latency < base and (self._spread or 0.0) <= _QUIET:
            # A server without noise: the fastest answer is its unloaded speed.
            bases[tool] = latency
            return latency
        return base

    # What a limit kept elsewhere (the fleet's: `dispatcher.fleet._shared`, through `_mcp._online`) uses.

    @property
    def level(self) -> float:
        """The level the limit is the whole calls of (a float: growth below a known knee is half a call)."""
        return self._level

    def level_limit(self) -> int:
        """The limit the level gives, without a probe's one call more."""
        return self._level_limit()

    def follow(self, level: float, *, cut: bool = False) -> None:
        """Take a level decided elsewhere, within floor..ceiling (a NaN or infinite one: the initial level).

        `cut`: it was a cut; adopted as this controller's own (the knee is the new level, and calls sent
        before it cannot cut again: they report the load the cut answered).
        """
        level = float(level) if is_number(level) and math.isfinite(level) else float(self.setting.start)
        level = min(float(self.ceiling), max(float(self.floor), level))
        if cut:
            self._cut(level, level, self.limit)
        elif level != self._level:
            self._set_level(level)

    def hold(self, now: float, seconds: float) -> None:
        """Hold every send until `seconds` after `now` (a Retry-After heard elsewhere), at most `max_wait`."""
        if is_number(seconds) and 0 < seconds < math.inf:
            self._hold_until = max(self._hold_until, now + min(seconds, self.setting.max_wait))
