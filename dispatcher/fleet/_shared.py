"""`SharedLimit`: one server's adaptive limit (`AdaptiveLimit`) shared by the fleet, kept in Redis.

Without a fleet, each process's controller (`_core._adaptive.Controller`) moves its own limit; ten
processes then find ten knees and together send ten times the server's. With a `RedisCoordinator` that
lists the server (`FleetServer(share_limit=True)`, the default), the fleet has one *level* instead, in
the server's ``limit`` hash (`_lua.LIMIT`: the level, its epoch, when it was last cut), and the fleet's
admission (`_lua.ACQUIRE`) grants holds under it: the level, not a fixed `FleetServer.limit`, is the
cap of the server's holds across the fleet (a `limit` set as well still bounds it).

Each process still runs its controller on its own calls, fed what the fleet saw when the call was
granted (the holds in force across the fleet, the shared limit: `_mcp._online`), so its judgement of
latency and overload is the same rule on the fleet's load; the trust rules are the controller's own (an
untrusted server's words never reach it). What the controller does with an answer is sent here as a
*move* and applied to the level in Redis, atomically:

- a cut (its level went down) by the same factor, once per epoch: the first cut reported for calls
  sent under epoch ``e`` moves the level and starts ``e + 1``; cuts of calls sent under ``e`` that
  arrive later, from any process, report the load that cut answered and change nothing;
- a growth (its level went up) by the same number of calls, for calls sent under the current epoch.
  Each growth is one answer's, reported by the one process that got it, so the fleet's level grows as
  one controller seeing every answer of the fleet would, not that times the processes.

Every reply (the moves', and each grant's) carries the level, its epoch, what is left of the fleet's
pause and the fleet's bounds, and each process's
controller follows it: a new epoch it did not cause is a cut it adopts (its calls sent before it
cannot cut again), so a cut anywhere is seen by every process at its next grant or move, within the
round. Moves are sent by the coordinator's own task, never on a call's path: a call's end does not wait
for Redis. A move that cannot reach Redis is dropped (the level stays where Redis has it; calls get
no hold meanwhile, per the fleet's failure rules) and the next reply brings the processes back to it.

What it trusts. The hash is state anyone with write access to Redis can change, and a process of the
fleet can be misconfigured, buggy or frozen, so nothing read from Redis or sent as a move is taken as
it is (`_lua`'s ``read_limit``, and `_show` here reads replies the same way):

- the fleet's floor, ceiling and initial level are the first process's (the hash's ``bounds``); a
  process configured otherwise logs a warning, records it in `conflict` and follows the fleet's, but
  never past its own ceiling (`within`; ACQUIRE caps the limit at the caller's ceiling too): bounds
  written first by a hostile or misconfigured writer can narrow the fleet, not widen it (nor, with a
  floor above this process's, hold its cuts up);
- a level that is not a finite number is the initial level, and every level is clamped into the
  bounds, so no content of the hash admits more than the ceiling; an epoch that is not a whole number
  is 0; a move whose value or epoch is not a finite number moves nothing;
- a trusted server's Retry-After (the controller's; an untrusted server's never reaches it) is a
  ``pause`` move: the hash keeps its end, capped at the reporting call's `max_wait` and at an hour
  (`_lua.MAX_PAUSE_MS`), and every reply carries what is left of it, which each process holds up to
  its own `max_wait`;
- a call whose hold was lost or whose lease ran out before it ended moves nothing (`_mcp._online`).

A hash that is lost (a FLUSHALL) starts again at the initial level and epoch 0: an epoch lower than a
process's last is followed, not adopted as a cut.
"""

from __future__ import annotations

import logging
import math
import weakref
from typing import TYPE_CHECKING, Protocol

import anyio

from .._core._errors import CoordinationError
from ._lua_limit import MAX_PAUSE_MS

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core._limit_setting import AdaptiveLimit
    from ._links import Link

__all__ = ["Follower", "SharedLimit"]

logger = logging.getLogger("dispatcher")

# The most distinct bounds conflicts one shared limit logs (a hostile writer could flip them at every reply).
_WARNINGS = 8


class Follower(Protocol):
    """What follows a shared limit: told the fleet's level whenever a reply shows it."""

    def follow_fleet(self, level: float, epoch: int, source: object, pause: float) -> None:
        """The level and epoch in Redis now (`source`: who sent the move that made it, else None), and the
        seconds left of the fleet's pause (0: none)."""
        ...

    @property
    def probing(self) -> bool:
        """Whether its controller has a probe armed: one call past the level, to see what it costs."""
        ...


class SharedLimit:
    """One server's shared adaptive limit, as this process last saw it, and the moves it has to send.

    Args:
        key: The server's ``limit`` hash in Redis.
        setting: The floor, ceiling and start of the level this process configured (the fleet's are
            the first process's: `bounds`).
        cap: The server's `FleetServer.limit`, if it has one: the shared limit never goes above it.
        wake: Asks the coordinator's task to send the moves waiting here.
    """

    __slots__ = (
        "_followers",
        "_pending",
        "_wake",
        "_warned",
        "bounds",
        "cap",
        "conflict",
        "epoch",
        "key",
        "level",
        "setting",
    )

    def __init__(self, key: str, setting: AdaptiveLimit, cap: int | None, wake: Callable[[], None]) -> None:
        self.key = key
        self.setting = setting
        self.cap = cap
        self.bounds = (setting.floor, setting.ceiling, setting.start)
        """The fleet's floor, ceiling and initial level: the first process's (this one's until Redis shows them)."""
        self.conflict: str | None = None
        """What differs between this process's bounds and the fleet's, once a reply showed it; else None."""
        self.level = float(setting.start)
        """The fleet's level as last seen in Redis (always within `bounds`)."""
        self.epoch = 0
        """Its epoch: how many times the fleet cut it (0 again after Redis lost the hash)."""
        self._wake = wake
        # The conflicts already logged: bounds flipped back and forth in Redis log each once, not per reply.
        self._warned: set[str] = set()
        self._followers: weakref.WeakSet[Follower] = weakref.WeakSet()
        # Moves to send, in order: (who, "read" | "cut" | "grow" | "pause", the epoch it was sent under,
        # its value; for a pause, when it ends by the event loop's clock, so one sent late asks for less;
        # for a growth, the most it may take the level to (`Controller.top`), else inf).
        self._pending: list[tuple[object, str, int, float, float]] = [(None, "read", -1, 0.0, math.inf)]

    @property
    def limit(self) -> int:
        """The most calls the fleet may have in flight on the server now (the level in whole calls).

        Never past this process's own ceiling: the fleet's bounds (the first writer's) narrow it, never widen it.
        """
        floor, ceiling = self.within
        limit = min(ceiling, max(floor, math.floor(self.level + 1e-9)))
        return limit if self.cap is None else min(limit, self.cap)

    @property
    def within(self) -> tuple[int, int]:
        """The floor and ceiling its controller keeps to: the fleet's, never above its own floor or ceiling."""
        floor, ceiling, _ = self.bounds
        ceiling = min(ceiling, self.setting.ceiling)
        return min(floor, self.setting.floor, ceiling), ceiling

    @property
    def argument(self) -> str:
        """What the admission scripts are given for the server's limit (`_lua`'s ARGV[2])."""
        probe = any(follower.probing for follower in self._followers)
        setting = self.setting
        return f"auto:{setting.floor}:{setting.ceiling}:{setting.start}:{self.cap or 0}:{int(probe)}"

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def follow(self, follower: Follower) -> None:
        """Tell `follower` of every level seen from now on, starting with the one known now."""
        self._followers.add(follower)
        follower.follow_fleet(self.level, self.epoch, None, 0.0)

    def move(self, source: object, op: str, epoch: int, value: float, top: float = math.inf) -> None:
        """Queue a move of `source`'s controller (``"cut"`` by a factor, ``"grow"`` by calls up to `top`,
        ``"pause"`` for seconds), or a ``"read"``."""
        pending = self._pending
        last = pending[-1] if pending else None
        if op == "read" and last is not None:
            return  # any reply shows the level
        if op == "pause":
            value = anyio.current_time() + value
        if op in ("grow", "pause") and last is not None and last[:3] == (source, op, epoch):
            # One request for a run of answers; the longest of a run of pauses.
            pending[-1] = (source, op, epoch, last[3] + value if op == "grow" else max(last[3], value), top)
        else:
            pending.append((source, op, epoch, value, top))
        self._wake()

    def seen(self, reply: list[object]) -> None:
        """A grant's reply showed the level (`_lua.ACQUIRE`: level, epoch, pause, bounds from [4]): follow it."""
        if len(reply) >= 8 and reply[4] != "":
            self._show(reply[4], reply[5], reply[6], reply[7], None)

    async def flush(self, link: Link) -> None:
        """Send the moves waiting here, one script call each; a move that cannot reach Redis is dropped."""
        setting = self.setting
        while self._pending:
            source, op, epoch, value, top = self._pending.pop(0)
            if op == "pause":
                # What is left of it now: a move that waited behind a slow Redis does not pause anew.
                value -= anyio.current_time()
                if value <= 0:
                    continue
            try:
                reply = await link.run(
                    "limit",
                    [self.key],
                    [setting.floor, setting.ceiling, setting.start, op, epoch, repr(value), repr(top)],
                )
            except CoordinationError:
                continue
            if isinstance(reply, list) and len(reply) >= 5:
                self._show(reply[0], reply[1], reply[3], reply[4], source if _whole(reply[2]) == 1 else None)

    def _show(self, level: object, epoch: object, pause: object, bounds: object, source: object) -> None:
        """Follow what a reply showed, read as the scripts read the hash: nothing takes it outside `bounds`."""
        fleet = _bounds(bounds)
        if fleet is not None and fleet != self.bounds:
            self._rebound(fleet)
        shown = _whole(epoch)
        if shown is None:
            return  # not a reply of these scripts: nothing to follow
        floor, ceiling, initial = self.bounds
        floor = min(floor, self.setting.floor)  # as the scripts read it: the fleet's floor never holds a cut up
        number = _number(level)
        number = float(initial) if number is None else min(float(ceiling), max(float(floor), number))
        seconds = min(_whole(pause) or 0, MAX_PAUSE_MS) / 1000
        if number == self.level and shown == self.epoch and source is None and seconds <= 0:
            return
        self.level, self.epoch = number, shown
        for follower in list(self._followers):
            follower.follow_fleet(number, shown, source, seconds)

    def _rebound(self, fleet: tuple[int, int, int]) -> None:
        self.bounds = fleet
        setting = self.setting
        own = (setting.floor, setting.ceiling, setting.start)
        conflict = None
        if fleet != own:
            conflict = "floor:ceiling:initial {}:{}:{} here, {}:{}:{} in the fleet".format(*own, *fleet)
        if conflict is not None and conflict not in self._warned and len(self._warned) < _WARNINGS:
            self._warned.add(conflict)
            logger.warning(
                "the shared limit %s has other bounds than this process's AdaptiveLimit (%s): following the "
                "fleet's, set by the first to write them, up to this process's own ceiling; configure every "
                "process alike",
                self.key,
                conflict,
            )
        self.conflict = conflict


def _number(value: object) -> float | None:
    """A finite number from a reply, else None."""
    try:
        number = float(value)  # type: ignore[arg-type]  # a str or int from Redis, or anything else
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _whole(value: object) -> int | None:
    """A whole number >= 0 from a reply, else None."""
    number = _number(value)
    return int(number) if number is not None and number >= 0 and number == math.floor(number) else None


def _bounds(value: object) -> tuple[int, int, int] | None:
    """The fleet's ``floor:ceiling:initial`` from a reply, if valid."""
    parts = [_whole(part) for part in str(value).split(":")] if isinstance(value, str) else []
    if len(parts) != 3 or None in parts:
        return None
    floor, ceiling, initial = (part or 0 for part in parts)
    return (floor, ceiling, initial) if 1 <= floor <= initial <= ceiling else None
