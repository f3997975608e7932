"""`FleetServer`: what a fleet shares about one server, and a hold's locks as the Redis scripts read them."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core import _checks as checks
from .._core._errors import ConfigurationError
from .._core._gate import ROOT_KEYS, lock_nodes, normalize_keys
from ._lua import MAX_OVERRUN

if TYPE_CHECKING:
    from collections.abc import Collection, Hashable


__all__ = ["FleetServer", "hold_locks", "positive"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FleetServer:
    """What the fleet shares about one server. Every process must configure it the same way.

    Args:
        limit: The most calls in flight on this server across the fleet, or None for no shared limit.
        shared_state: Whether the processes share this server's state (one repository, one database):
            then a call that may mutate runs alone across the fleet, and reads run together, in
            arrival order. Without it each process orders its own calls and the fleet shares only the
            limit.
        share_retry_budget: Whether the server's retry budget (`RetryPolicy.budget`) is one token
            bucket for the fleet rather than one per process.
        share_limit: Whether an adaptive limit of this server (``max_concurrency="auto"`` or an
            `AdaptiveLimit` in `connect` / `add_mcp_server`) is one level for the fleet, moved by every
            process's calls and capping the server's holds across the fleet (bounded by `limit` too,
            if set), rather than one limit per process. See docs/fleet.md ("An adaptive limit").
        fence_argument: The name of the argument in which every call of this server carries its hold's
            fencing token (an int that grows with every grant on the server, across the fleet), for a
            server that refuses a token lower than the highest it has seen (see
            `dispatcher.testing.FencedResource`). The argument is added to the call's arguments as sent.
        fence_meta: The `_meta` entry of the request in which the token is sent instead (a name such as
            ``"example.com/fence"``), for a server that reads it there. At most one of the two.
        max_write_time: Seconds a write of this server may still run on the server after its request
            was sent, whatever becomes of its client (at least your `call_timeout` if the server goes on
            with a write its client cancelled or lost, about 0 if it stops it): a write whose holder
            stops (killed, frozen, cut off from Redis) or gives it up keeps its turn for this long beyond
            its lease, so the next write does not start beside it (as Chubby's lock-delay). A namespace
            whose state was lost, or is new, waits `lease_ttl` plus this long before granting. Required
            on a `shared_state` server that declares no fencing token (there the server refuses the late
            write itself, and None means 0); only for a `shared_state` server. At most an hour
            (`_lua.MAX_OVERRUN`): a time further ahead in Redis is read as junk (`_lua`, "The horizon").
        max_call_time: Seconds any call of this server may still run on the server after its client
            stopped or gave it up (as `max_write_time`, for a server's `limit`): a call given up after its
            request was sent (timed out, cancelled, its hold lost on the wire: effect unknown) keeps its
            place under `limit` for `lease_ttl` plus this long from then, as long as the place of a
            holder killed at that moment, and the place of a holder that stops renewing is kept this long
            beyond its lease; so the fleet never starts more than `limit` calls while the ones it gave
            up may still run. None means 0 (a given-up call still keeps its place `lease_ttl`); only
            for a server with a `limit`, or with `share_limit` (the fleet's level is then the limit, on a
            server connected with an adaptive limit). At most an hour, as `max_write_time`.

    Raises:
        ConfigurationError: A value is out of range.
    """

    limit: int | None = None
    shared_state: bool = False
    share_retry_budget: bool = True
    share_limit: bool = True
    fence_argument: str | None = None
    fence_meta: str | None = None
    max_write_time: float | None = None
    max_call_time: float | None = None

    def __post_init__(self) -> None:
        limit = self.limit
        checks.whole("limit", limit, none="no fleet-wide limit")
        for name in ("shared_state", "share_retry_budget", "share_limit"):
            checks.flag(name, getattr(self, name))
        for name in ("fence_argument", "fence_meta"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or value != value.strip()):
                raise ConfigurationError(f"{name} must be a non-empty name without surrounding spaces, got {value!r}")
        if self.fence_argument is not None and self.fence_meta is not None:
            raise ConfigurationError("declare the fencing token in fence_argument or in fence_meta, not both")
        if (self.fence_argument is not None or self.fence_meta is not None) and not self.shared_state:
            # Holds that only share a limit run together, their tokens in no order a server could check:
            # a fenced server would refuse writes the fleet let run.
            raise ConfigurationError(
                "a fencing token orders writes that exclude each other: declare it on a shared_state=True server"
            )
        for name in ("max_write_time", "max_call_time"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= MAX_OVERRUN
            ):
                raise ConfigurationError(
                    f"{name} must be a number of seconds >= 0 and at most {MAX_OVERRUN:.0f}, got {value!r};"
                    " use None for 0"
                    " (the fleet reads a time set further ahead in Redis as junk written by another process)"
                )
        if self.max_call_time is not None and limit is None and not self.share_limit:
            raise ConfigurationError(
                "max_call_time keeps a call's place under the limit: set it with limit= or share_limit=True"
            )
        bound = self.max_write_time
        if bound is not None:
            if not self.shared_state:
                raise ConfigurationError("max_write_time keeps a write's turn: set it on a shared_state=True server")
        elif self.shared_state and not self.fenced:
            raise ConfigurationError(
                "a shared_state server needs max_write_time=seconds (how long a write may go on on the server "
                "once its client stopped or gave it up; 0 if the server stops a write its client cancels or "
                "loses) or a fencing token (fence_meta= or fence_argument=) that the server checks"
            )

    @property
    def holds(self) -> bool:
        """Whether calls to this server take a hold at all."""
        return self.limit is not None or self.shared_state

    @property
    def fenced(self) -> bool:
        """Whether the server's requests carry a fencing token."""
        return self.fence_argument is not None or self.fence_meta is not None

    @property
    def write_bound(self) -> float:
        """Seconds a write's turn is kept beyond its lease: `max_write_time`, 0 when not set."""
        return float(self.max_write_time or 0.0)

    @property
    def call_bound(self) -> float:
        """Seconds a call's place under the limit is kept beyond its lease: `max_call_time`, 0 when not set."""
        return float(self.max_call_time or 0.0)


_ROOT_READ = json.dumps(["", 2])

# What a hold may carry to Redis, where every script reads every holder's locks: keys come partly from a
# model's arguments (up to 100 keys of 1000 characters), so they are coarsened first. A key cut to an
# ancestor conflicts with everything the key did and more, so coarsening only ever excludes more.
_MAX_DEPTH = 8  # segments kept of a key
_MAX_KEYS = 16  # keys kept: more, and each is cut to its first segment; more still, the whole server
_MAX_PATH = 48  # characters of a path sent as is; a longer one is sent as its digest


def hold_locks(config: FleetServer, exclusive: bool, keys: Collection[Hashable]) -> str:
    """A hold's locks as the scripts read them: JSON ``[path, mode, ...]`` (`_lua`)."""
    if not config.shared_state:
        return _ROOT_READ  # only the limit is shared: every hold is a read of the whole server
    normal = normalize_keys(str(key) for key in keys) if keys else ROOT_KEYS
    if any(key.count("/") >= _MAX_DEPTH for key in normal):
        normal = normalize_keys("/".join(key.split("/")[:_MAX_DEPTH]) for key in normal)
    if len(normal) > _MAX_KEYS:
        normal = normalize_keys(key.split("/", 1)[0] for key in normal)
        if len(normal) > _MAX_KEYS:
            normal = ROOT_KEYS
    parts: list[str | int] = []
    for path, mode in lock_nodes(normal, exclusive):
        if len(path) > _MAX_PATH:
            path = "#" + hashlib.blake2b(path.encode(), digest_size=16).hexdigest()
        parts += [path, mode]
    return json.dumps(parts, separators=(",", ":"))


def positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
