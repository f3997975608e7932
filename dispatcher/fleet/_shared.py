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

Every reply (the moves', and each grant's) carries the level and its epoch, and each process's
controller follows it: a new epoch it did not cause is a cut it adopts (its calls sent before it
cannot cut again), so a cut anywhere is seen by every process at its next grant or move, within the
round. Moves are sent by the coordinator's own task, never on a call's path: a call's end does not wait
for Redis. A move that cannot reach Redis is dropped (the level stays where Redis has it; calls get
no hold meanwhile, per the fleet's failure rules) and the next reply brings the processes back to it.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Protocol

from .._core._errors import CoordinationError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core._adaptive import AdaptiveLimit
    from ._links import Link

__all__ = ["Follower", "SharedLimit"]


class Follower(Protocol):
    """What follows a shared limit: told the fleet's level whenever a reply shows it."""

    def follow_fleet(self, level: float, epoch: int, source: object) -> None:
        """The level and epoch in Redis now; `source` is who sent the move that made it, else None."""
        ...

    @property
    def probing(self) -> bool:
        """Whether its controller has a probe armed: one call past the level, to see what it costs."""
        ...


class SharedLimit:
    """One server's shared adaptive limit, as this process last saw it, and the moves it has to send.

    Args:
        key: The server's ``limit`` hash in Redis.
        setting: The floor, ceiling and start of the level (every process configures them alike).
        cap: The server's `FleetServer.limit`, if it has one: the shared limit never goes above it.
        wake: Asks the coordinator's task to send the moves waiting here.
    """

    __slots__ = ("_followers", "_pending", "_wake", "cap", "epoch", "key", "level", "setting")

    def __init__(self, key: str, setting: AdaptiveLimit, cap: int | None, wake: Callable[[], None]) -> None:
        self.key = key
        self.setting = setting
        self.cap = cap
        self.level = float(setting.start)
        """The fleet's level as last seen in Redis."""
        self.epoch = 0
        """Its epoch: how many times the fleet cut it."""
        self._wake = wake
        self._followers: weakref.WeakSet[Follower] = weakref.WeakSet()
        # Moves to send, in order: (who, "read" | "cut" | "grow", the epoch it was sent under, its value).
        self._pending: list[tuple[object, str, int, float]] = [(None, "read", -1, 0.0)]

    @property
    def limit(self) -> int:
        """The most calls the fleet may have in flight on the server now (the level in whole calls)."""
        limit = max(1, math.floor(self.level + 1e-9))
        return limit if self.cap is None else min(limit, self.cap)

    @property
    def argument(self) -> str:
        """What the admission scripts are given for the server's limit (`_lua`'s ARGV[2])."""
        probe = any(follower.probing for follower in self._followers)
        return f"auto:{self.setting.start}:{self.cap or 0}:{int(probe)}"

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def follow(self, follower: Follower) -> None:
        """Tell `follower` of every level seen from now on, starting with the one known now."""
        self._followers.add(follower)
        follower.follow_fleet(self.level, self.epoch, None)

    def move(self, source: object, op: str, epoch: int, value: float) -> None:
        """Queue a move of `source`'s controller (``"cut"`` by a factor, ``"grow"`` by calls), or a ``"read"``."""
        pending = self._pending
        last = pending[-1] if pending else None
        if op == "read" and last is not None:
            return  # any reply shows the level
        if op == "grow" and last is not None and last[:3] == (source, op, epoch):
            pending[-1] = (source, op, epoch, last[3] + value)  # one request for a run of answers
        else:
            pending.append((source, op, epoch, value))
        self._wake()

    def seen(self, level: str, epoch: str) -> None:
        """A grant's reply showed the level (`_lua.ACQUIRE`): follow it."""
        try:
            self._show(float(level), int(epoch), None)
        except ValueError:
            pass  # a reply without the shared level (a server configured otherwise by another process)

    async def flush(self, link: Link) -> None:
        """Send the moves waiting here, one script call each; a move that cannot reach Redis is dropped."""
        setting = self.setting
        while self._pending:
            source, op, epoch, value = self._pending.pop(0)
            try:
                reply = await link.run(
                    "limit", [self.key], [setting.floor, setting.ceiling, setting.start, op, epoch, repr(value)]
                )
            except CoordinationError:
                continue
            self._show(float(reply[0]), int(reply[1]), source if int(reply[2]) == 1 else None)

    def _show(self, level: float, epoch: int, source: object) -> None:
        if level == self.level and epoch == self.epoch and source is None:
            return
        self.level, self.epoch = level, epoch
        for follower in list(self._followers):
            follower.follow_fleet(level, epoch, source)
