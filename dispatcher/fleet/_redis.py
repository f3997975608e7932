"""`RedisCoordinator`: limits, shared-state order and retry budgets shared by a fleet through Redis.

Each process runs its own `Dispatcher` with the same `RedisCoordinator` configuration (the namespace and
the servers by name). After a dispatcher admits a call locally, the call takes a *hold* on its server in
Redis before it runs:

- a server with a `limit` never has more holds than that across the fleet;
- a `shared_state` server gives a writing call (not read-only) the server to itself, and lets reads run
  together, in arrival order across the fleet (a fair readers-writer lock; a queued write is never
  overtaken by later reads);
- its retries spend from one token bucket per server, shared by the fleet.

Admission is atomic: one Lua script (`_lua`) purges expired leases, queues the request and grants
what fits, in Redis' own clock. A grant is published on the owner process's channel, and a listener task
per process wakes the waiting call at once; a waiting call also checks again every `recheck` seconds,
which is the bound on noticing a lease that expired with nobody left to release it (a killed process).

Holds are leases: each process renews all its holds every `lease_ttl / 3` in one script call per server.
A process that stops renewing (killed, frozen, cut off) loses its holds `lease_ttl` after its last
renewal, a write's hold on a `shared_state` server `max_write_time` later still (`FleetServer`); they
are then free for the others within `recheck` more. A process that cannot renew gives the calls up
itself `recheck` seconds before their leases end: a call whose request had not left ends FAILED (never
ran), one whose request had left ends TIMEOUT with an unknown effect (the server may still be running
it), and that write's turn is kept in Redis for `max_write_time` from then (as is the turn of any write
that ends of unknown effect: timed out, cancelled in flight). On a server with a `limit`, any call given
up so keeps its place under the limit for `lease_ttl` plus `max_call_time` from then, and a holder that
stops renewing keeps it `max_call_time` beyond its lease: a call that may still run on the server
counts. Each lease end is measured from before the request that granted or renewed it was sent, and each
request a hold covers is confirmed against it right before it is sent (`Lease.confirm`, synchronous): no
request leaves after its lease could have ended, and a grant whose reply came too late is given back. A
request already on its way when the lease ends (delayed in the client, the network or the server) can
still run beside the next holder's once `max_write_time` has passed too; only the server can refuse it,
by the hold's fencing token (`FleetServer.fence_argument` / `fence_meta`; see `_lua`). A call that
cannot get its hold because Redis cannot be reached ends FAILED with the reason, and never runs
unguarded.

redis-py's asyncio client runs only on asyncio. Under trio the coordinator uses redis-py's blocking
client in worker threads (its own `CapacityLimiter`, so it never starves `anyio.to_thread` users);
script calls are not abandoned on cancellation (they are short and bounded by `timeout`), so Redis
never keeps a request the process has already forgotten.
"""

from __future__ import annotations

import itertools
import math
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Self

import anyio

from .._core._errors import ConfigurationError, CoordinationError
from .._driver._coordination import Lease
from ._config import FleetServer, hold_locks, positive
from ._links import AsyncioLink, Link, ThreadLink, running_trio, safe_url
from ._lua import MAX_LEASE_TTL
from ._shared import SharedLimit

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Hashable, Mapping
    from types import TracebackType

    from anyio.abc import TaskGroup

    from .._core._limit_setting import AdaptiveLimit

__all__ = ["RedisCoordinator"]


class _Lease(Lease):
    """A hold in Redis: its lease id, its locks and the namespace's epoch when it was granted."""

    __slots__ = ("_active", "epoch", "id", "locks")

    def __init__(
        self,
        lease_id: str,
        server: str,
        locks: str,
        on_lost: Callable[[str], None],
        config: FleetServer,
        margin: float,
        active: dict[str, _Lease],
    ) -> None:
        super().__init__(
            server, on_lost, margin=margin, fence_argument=config.fence_argument, fence_meta=config.fence_meta
        )
        self.id = lease_id
        self.locks = locks
        self.epoch = ""
        self._active = active
        self.valid_until = -math.inf  # until granted

    def lose(self, why: str) -> bool:
        if not super().lose(why):
            return False
        self._active.pop(self.id, None)  # no longer renewed
        return True


class RedisCoordinator:
    """Shares per-server limits, shared-state order and retry budgets between processes through Redis.

    Enter it, then give it to the dispatcher (it may serve several dispatchers of one process)::

        fleet = RedisCoordinator(
            "redis://redis.internal:6379/0",
            namespace="agents-prod",
            servers={
                "repo": FleetServer(limit=8, shared_state=True, max_write_time=30.0),
                "search": FleetServer(limit=32),
            },
        )
        async with fleet, Dispatcher(coordinator=fleet) as dispatcher:
            await dispatcher.connect("repo", url, trusted=True)
            ...

    Servers are named as the dispatcher names them (`add_mcp_server` / `connect`); a server not in
    `servers`, and local functions, are not coordinated. Needs the `fleet` extra
    (``pip install "mcp-dispatcher[fleet]"``) and Redis 6.2 or later (tested with 7.0).

    Args:
        url: The Redis URL (``redis://host:port/db``, ``rediss://`` for TLS, a password in the URL).
        namespace: The fleet's name: the prefix of every key and channel it uses. Processes with the
            same namespace share; two fleets on one Redis use two namespaces.
        servers: What is shared, by server name.
        lease_ttl: Seconds a hold outlives its last renewal. It bounds how long a killed process's holds
            block the others (`lease_ttl + recheck` at most); holds are renewed every third of it. At
            most an hour (`_lua.MAX_LEASE_TTL`): processes of one fleet may use different values, and every
            one reads a time set in Redis further ahead than the longest allowed as junk (`_lua`).
        recheck: Seconds between a waiting call's own checks, besides the wake-up Redis sends it on
            a grant: the bound on noticing a hold that expired. At most half of `lease_ttl`.
        timeout: Seconds one Redis request may take (connecting included) before the call it is for
            fails.
        wait_timeout: Seconds a call may wait for its hold before it fails, or None to wait as long as
            the fleet's queue takes (a call waiting in the local queue has no limit either).

    Raises:
        ConfigurationError: A value is out of range, or the `redis` package is not installed.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        namespace: str = "dispatcher",
        servers: Mapping[str, FleetServer],
        lease_ttl: float = 10.0,
        recheck: float = 1.0,
        timeout: float = 2.0,
        wait_timeout: float | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(f"url must be a redis://, rediss:// or unix:// URL, got {url!r}")
        if not isinstance(namespace, str) or not namespace or any(char.isspace() for char in namespace):
            raise ConfigurationError(f"namespace must be a non-empty name without spaces, got {namespace!r}")
        servers = dict(servers)
        for name, config in servers.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"servers are named by non-empty strings, got {name!r}")
            if not isinstance(config, FleetServer):
                raise ConfigurationError(f"servers[{name!r}] must be a FleetServer, got {type(config).__name__}")
        if not positive(lease_ttl) or not 0.1 <= lease_ttl <= MAX_LEASE_TTL:
            raise ConfigurationError(
                f"lease_ttl must be a number of seconds >= 0.1 and at most {MAX_LEASE_TTL:.0f}, got {lease_ttl!r}"
                " (the fleet reads a time set further ahead in Redis as junk written by another process)"
            )
        if not positive(recheck) or recheck > lease_ttl / 2:
            raise ConfigurationError(
                f"recheck must be a positive number of seconds at most lease_ttl / 2 ({lease_ttl / 2}), got {recheck!r}"
            )
        if not positive(timeout):
            raise ConfigurationError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if wait_timeout is not None and not positive(wait_timeout):
            raise ConfigurationError(f"wait_timeout must be a positive number of seconds or None, got {wait_timeout!r}")
        try:
            import redis  # noqa: F401  # the extra is checked now rather than at the first call
        except ImportError:
            raise ConfigurationError(
                'RedisCoordinator needs the redis package: pip install "mcp-dispatcher[fleet]"'
            ) from None
        self.url = url
        self.namespace = namespace
        self.servers: Mapping[str, FleetServer] = servers
        self.lease_ttl = float(lease_ttl)
        self.recheck = float(recheck)
        self.timeout = float(timeout)
        self.wait_timeout = wait_timeout
        self._uid = uuid.uuid4().hex
        self._counter = itertools.count()
        self._link: Link | None = None
        self._tg: TaskGroup | None = None
        self._waiters: dict[str, anyio.Event] = {}
        self._active: dict[str, dict[str, _Lease]] = {}
        self._budgets: dict[str, _SharedBudget] = {}
        # The servers whose adaptive limit the fleet shares (`shared_limit`), and the event that wakes
        # the task sending their moves (None while closed).
        self._limits: dict[str, SharedLimit] = {}
        self._limit_moved: anyio.Event | None = None

    def __repr__(self) -> str:
        return f"RedisCoordinator({safe_url(self.url)!r}, namespace={self.namespace!r})"

    @property
    def _channel(self) -> str:
        return f"{self.namespace}:wake:{self._uid}"

    def _keys(self, server: str) -> list[str]:
        prefix = f"{self.namespace}:server:{server}:"
        names = ("queue", "waiting", "waiting_exp", "holders", "holders_exp", "seq", "meta", "tokens", "fence", "limit")
        return [prefix + name for name in names]

    def _args(self, server: str) -> list[Any]:
        config = self.servers[server]
        shared = self._limits.get(server)
        return [
            round(self.lease_ttl * 1000),
            shared.argument if shared is not None else config.limit or 0,
            f"{self.namespace}:wake:",
            round(config.write_bound * 1000),
            round(config.call_bound * 1000),
        ]

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise RuntimeError("this RedisCoordinator is already open")
        link = ThreadLink(self) if running_trio() else AsyncioLink(self)
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._link = link
        tg.start_soon(link.listen, self._channel, self._wake)
        tg.start_soon(self._renew_loop)
        tg.start_soon(self._watch_loop)
        self._limit_moved = anyio.Event()
        tg.start_soon(self._limit_loop)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        tg, link = self._tg, self._link
        assert tg is not None and link is not None
        # Nothing renews holds from here on: calls still holding one are given up now rather than left
        # running once their leases expire (close dispatchers before their coordinator).
        with anyio.CancelScope(shield=True):
            for leases in list(self._active.values()):
                for lease in list(leases.values()):
                    self._lose(lease, "the RedisCoordinator closed")
                    await self._release(lease)
        self._link = None
        self._limit_moved = None
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self._flush_budgets(link)
                await link.aclose()

    def fencing(self, server: str) -> tuple[str | None, str | None]:
        """Where `server`'s requests carry their fencing token: (argument, `_meta` entry), None where not.

        `Dispatcher.connect` reads it to refuse an idempotency key declared in the same place.
        """
        config = self.servers.get(server)
        if config is None:
            return None, None
        return config.fence_argument, config.fence_meta

    # The Coordinator protocol ---------------------------------------------------------------------

    @asynccontextmanager
    async def hold(
        self,
        *,
        server: str,
        exclusive: bool,
        keys: Collection[Hashable] = (),
        on_lost: Callable[[str], None],
    ) -> AsyncIterator[Lease | None]:
        """Wait for a fleet-wide hold on `server`, keep it renewed for the block, then give it back.

        On a `shared_state` server the hold excludes what the gate of one process would: a write
        (`exclusive`) excludes the holds whose `keys` conflict with its own, reads exclude writes of
        their keys, and no keys means the root key (the whole server).

        Yields the hold (its fencing `token`, and `confirm()` to call right before each request it
        covers is sent), or None for a server without holds.

        Raises:
            CoordinationError: Redis cannot be reached, the coordinator is not open, or `wait_timeout`
                passed.
        """
        config = self.servers.get(server)
        if config is None or not (config.holds or server in self._limits):
            yield None
            return
        active = self._active.setdefault(server, {})
        lease = _Lease(
            f"{self._uid}:{next(self._counter)}",
            server,
            hold_locks(config, exclusive, keys),
            on_lost,
            config,
            self.recheck,
            active,
        )
        await self._acquire(lease)
        active[lease.id] = lease
        try:
            yield lease
        finally:
            active.pop(lease.id, None)
            with anyio.CancelScope(shield=True):
                await self._release(lease)

    def retry_budget(self, server: str, capacity: float, refill: float) -> _SharedBudget | None:
        """The fleet's token bucket for `server`'s retries, or None when the server does not share one."""
        config = self.servers.get(server)
        if config is None or not config.share_retry_budget:
            return None
        budget = self._budgets.get(server)
        if budget is None:
            budget = self._budgets[server] = _SharedBudget(self, server, capacity, refill)
        return budget

    def shared_limit(self, server: str, setting: AdaptiveLimit) -> SharedLimit | None:
        """The fleet's one adaptive limit of `server`, or None when the server does not share one.

        `Dispatcher.connect` / `add_mcp_server` ask for it when the server's `max_concurrency` is an
        `AdaptiveLimit` (or ``"auto"``): the server's holds are then granted under the shared level
        (see `_shared`), bounded by `setting`'s floor and ceiling and by `FleetServer.limit` if set.
        """
        config = self.servers.get(server)
        if config is None or not config.share_limit:
            return None
        shared = self._limits.get(server)
        if shared is None:
            key = f"{self.namespace}:server:{server}:limit"
            shared = self._limits[server] = SharedLimit(key, setting, config.limit, self._wake_limits)
        return shared

    def _wake_limits(self) -> None:
        moved = self._limit_moved
        if moved is not None:
            moved.set()

    async def _limit_loop(self) -> None:
        # Moves are sent here, not on a call's path: the call's end never waits for Redis.
        while True:
            link = self._link
            if link is None:
                return
            for shared in list(self._limits.values()):
                if shared.pending:
                    await shared.flush(link)
            moved = self._limit_moved
            if moved is None:
                return
            # Idle, the level is read again every third of a lease: a process that sends no calls for a
            # while still sees the fleet's cuts (a busy one sees them in every grant's reply).
            with anyio.move_on_after(self.lease_ttl / 3):
                await moved.wait()
            self._limit_moved = anyio.Event()
            if not moved.is_set():
                for shared in self._limits.values():
                    shared.move(None, "read", -1, 0.0)

    # Holds ----------------------------------------------------------------------------------------

    def _open_link(self) -> Link:
        link = self._link
        if link is None:
            raise CoordinationError(
                "the RedisCoordinator is not open: enter it (async with) before its dispatchers run calls"
            )
        return link

    async def _acquire(self, lease: _Lease) -> None:
        link = self._open_link()
        server = lease.server
        keys = self._keys(server)
        args = [*self._args(server), lease.id, lease.locks]
        started = anyio.current_time()
        deadline = math.inf if self.wait_timeout is None else started + self.wait_timeout
        event = self._waiters[lease.id] = anyio.Event()
        try:
            while True:
                sent = anyio.current_time()
                reply = await link.run("acquire", keys, args)
                now = anyio.current_time()
                if reply[0] == 1:
                    # Redis set the lease's end after this request was sent: sent + ttl is no later.
                    lease.valid_until = sent + self.lease_ttl
                    lease.token = int(reply[1])
                    lease.epoch = str(reply[2])
                    lease.held = int(reply[3])
                    shared = self._limits.get(server)
                    if shared is not None:
                        shared.seen(list(reply))
                    if now >= lease.valid_until - self.recheck:
                        # The reply came too late to be sure the lease still holds (a frozen process,
                        # a stalled network): not granted, and given back by the handler below.
                        raise CoordinationError(
                            f"the fleet hold on server {server!r} was granted, but the reply came {now - sent:.3f}s "
                            f"after the request, too late to trust a lease_ttl={self.lease_ttl}s lease"
                        )
                    return
                if now >= deadline:
                    raise CoordinationError(
                        f"no fleet hold on server {server!r} within wait_timeout={self.wait_timeout}s"
                    )
                # Woken by the grant's message; the timeout re-checks for holds that expired meanwhile.
                with anyio.move_on_after(min(self.recheck, deadline - now)):
                    await event.wait()
                event = self._waiters[lease.id] = anyio.Event()
        except BaseException:
            # Leave the queue, or give back a hold granted meanwhile (its lease would expire anyway).
            with anyio.CancelScope(shield=True):
                await self._release(lease)
            raise
        finally:
            self._waiters.pop(lease.id, None)

    async def _release(self, lease: _Lease) -> None:
        link = self._link
        if link is None:
            return
        # Best effort: a hold that cannot be given back expires after lease_ttl.
        with anyio.move_on_after(2 * self.timeout):
            try:
                # A call given up after it was sent (its hold lost, or its call ended of unknown effect: timed
                # out, cancelled) keeps a write's turn in Redis for the server's max write time, and its
                # place under the server's limit for lease_ttl plus its max call time.
                abandoned = "1" if lease.abandoned or (lease.lost and lease.sent) else "0"
                await link.run("release", self._keys(lease.server), [*self._args(lease.server), lease.id, abandoned])
            except CoordinationError:
                pass

    def _wake(self, lease_id: str) -> None:
        event = self._waiters.get(lease_id)
        if event is not None:
            event.set()

    async def _renew_loop(self) -> None:
        interval = self.lease_ttl / 3
        while True:
            await anyio.sleep(interval)
            link = self._link
            if link is None:
                return
            for server, leases in list(self._active.items()):
                if leases:
                    await self._renew(link, server, list(leases.values()), interval)
            await self._flush_budgets(link)

    async def _watch_loop(self) -> None:
        # Renewals can be late (several servers, budgets and a slow Redis share one loop), so the leases'
        # ends are watched on their own: a call is given up before Redis can hand its place to another.
        step = self.recheck / 2
        while True:
            await anyio.sleep(step)
            for leases in list(self._active.values()):
                self._give_up_ending(list(leases.values()), self.recheck, "it could not be renewed in time")

    def _give_up_ending(self, leases: list[_Lease], margin: float, why: str) -> None:
        """Lose the holds among `leases` whose lease may end within `margin` seconds."""
        now = anyio.current_time()
        for lease in leases:
            if now + margin >= lease.valid_until:
                self._lose(lease, why)

    async def _renew(self, link: Link, server: str, leases: list[_Lease], interval: float) -> None:
        args = self._args(server)
        for lease in leases:
            args += [lease.id, lease.locks, lease.epoch]
        sent = anyio.current_time()
        try:
            renewed = await link.run("renew", self._keys(server), args)
        except CoordinationError as exc:
            # Give a call up before Redis could hand its place to another: by the next renewal the lease
            # may have expired there.
            active = self._active.get(server, {})
            in_force = [lease for lease in leases if lease.id in active]
            self._give_up_ending(in_force, interval, f"could not renew it ({exc})")
            return
        active = self._active.get(server, {})
        for lease, flag in zip(leases, renewed, strict=True):
            if lease.id not in active:
                # Given back while the renewal was on its way: if the renewal came second it put the hold
                # back, so give it back again (a second release is harmless).
                if flag == 1 and not lease.lost:
                    await self._release(lease)
            elif flag == 1 and sent < lease.valid_until:
                lease.valid_until = sent + self.lease_ttl
            elif flag == 1:
                # Redis still had it (a call's place is kept beyond its lease), but here it ran out before
                # this renewal left: the process was frozen, and its call is given up as the watch would.
                self._lose(lease, "its lease ran out before it was renewed (the process was late, or frozen)")
            else:
                self._lose(lease, "it expired in Redis and was taken, or Redis lost the fleet's state since its grant")

    def _lose(self, lease: _Lease, why: str) -> None:
        lease.lose(why)

    async def _flush_budgets(self, link: Link) -> None:
        for budget in self._budgets.values():
            await budget.flush(link)


class _SharedBudget:
    """A server's retry budget kept in Redis. Earnings are sent with the next spend or renewal round."""

    __slots__ = ("_capacity", "_coordinator", "_earned", "_key", "_refill")

    def __init__(self, coordinator: RedisCoordinator, server: str, capacity: float, refill: float) -> None:
        self._coordinator = coordinator
        self._key = f"{coordinator.namespace}:server:{server}:budget"
        self._capacity = capacity
        self._refill = refill
        self._earned = 0.0

    def succeeded(self, retried: bool) -> None:
        self._earned = min(self._capacity, self._earned + (1.0 if retried else self._refill))

    async def spend(self) -> bool:
        """Take one token from the fleet's bucket; False when it is empty or Redis cannot be reached."""
        link = self._coordinator._link
        if link is None:
            return False
        earned, self._earned = self._earned, 0.0
        try:
            return bool(await link.run("spend", [self._key], [self._capacity, earned, 1]) == 1)
        except CoordinationError:
            # Cut off: no retries (the safe side of an outage), and the earnings are kept for later.
            self._earned = min(self._capacity, self._earned + earned)
            return False

    async def flush(self, link: Link) -> None:
        earned = self._earned
        if earned <= 0:
            return
        self._earned = 0.0
        try:
            await link.run("spend", [self._key], [self._capacity, earned, 0])
        except CoordinationError:
            self._earned = min(self._capacity, self._earned + earned)
