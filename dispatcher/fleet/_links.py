"""The links to Redis: scripts run and wake-ups heard the right way for the event loop (asyncio or threads)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from .._core._errors import CoordinationError
from . import _lua, _lua_limit

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._redis import RedisCoordinator

__all__ = ["AsyncioLink", "Link", "ThreadLink", "running_trio", "safe_url"]

_SCRIPTS = {
    "acquire": _lua.ACQUIRE,
    "release": _lua.RELEASE,
    "renew": _lua.RENEW,
    "spend": _lua_limit.SPEND,
    "limit": _lua_limit.LIMIT,
}


class Link:
    """Runs the scripts and listens for wake-ups on one Redis, the right way for the event loop."""

    def __init__(self, coordinator: RedisCoordinator) -> None:
        self._url = coordinator.url
        self._recheck = coordinator.recheck
        # Set once aclose begins: requests still on their way then fail as CoordinationError.
        self.closing = False
        self._options: dict[str, Any] = {
            "socket_timeout": coordinator.timeout,
            "socket_connect_timeout": coordinator.timeout,
            "decode_responses": True,
        }

    async def run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        raise NotImplementedError

    async def listen(self, channel: str, deliver: Callable[[str], None]) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    def _translated(self, exc: Exception, redis_error: type[Exception]) -> BaseException:
        """What a request's failure raises: a CoordinationError where it is Redis' or the closing's.

        redis-py reading a socket closed under it (the coordinator closing while a call's release is on
        its way) raises ValueError or AttributeError from its parser; that must fail the request, not the
        dispatcher's task group. Any other exception outside a closing is a defect, raised as it is.
        """
        if self.closing or isinstance(exc, redis_error | OSError | ValueError):
            return self._failure(exc)
        return exc

    def _failure(self, exc: BaseException) -> CoordinationError:
        where = safe_url(self._url)
        if _cluster_reply(exc):
            # A script's keys all name one server, but not one hash slot, and the client is not a cluster client.
            return CoordinationError(
                f"Redis at {where} is a Redis Cluster node, which RedisCoordinator does not support: use a standalone "
                f"Redis (or a primary with replicas) for the fleet ({type(exc).__name__}: {exc})"
            )
        return CoordinationError(f"cannot reach Redis at {where}: {type(exc).__name__}: {exc}")


def _cluster_reply(exc: BaseException) -> bool:
    """Whether `exc` is what a Redis Cluster node answers a client that is not a cluster client."""
    from redis.exceptions import AskError, ClusterCrossSlotError, ClusterDownError, MovedError

    return isinstance(exc, AskError | ClusterCrossSlotError | ClusterDownError | MovedError)


def _no_retries(*, for_asyncio: bool) -> Any:
    from redis.backoff import NoBackoff

    # The coordinator decides what a failure means; a hidden retry would only stretch `timeout`.
    # An asyncio client gets the asyncio class: redis-py 8.2 warns when it has to convert a sync one.
    if for_asyncio:
        from redis.asyncio.retry import Retry as AsyncRetry

        return AsyncRetry(NoBackoff(), 0)
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


class AsyncioLink(Link):
    def __init__(self, coordinator: RedisCoordinator) -> None:
        super().__init__(coordinator)
        import redis.asyncio

        self._client = redis.asyncio.Redis.from_url(self._url, retry=_no_retries(for_asyncio=True), **self._options)
        self._scripts = {name: self._client.register_script(text) for name, text in _SCRIPTS.items()}

    async def run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import RedisError

        try:
            return await self._scripts[script](keys=keys, args=args)
        except Exception as exc:
            raise self._translated(exc, RedisError) from exc

    async def listen(self, channel: str, deliver: Callable[[str], None]) -> None:
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(channel)
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self._recheck)
                    if message is not None and message.get("type") == "message":
                        deliver(str(message["data"]))
            except Exception:
                # Redis is away; waiting calls notice by their own checks. Try again a little later.
                await anyio.sleep(self._recheck)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                    try:
                        await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # annotated from redis-py 8.2 on
                    except Exception:  # a broken connection is being dropped anyway
                        pass

    async def aclose(self) -> None:
        self.closing = True
        try:
            await self._client.aclose()
        finally:
            # Also the connections still lent out (a subscription whose close was cut short, a command
            # broken off by a cancellation): none is left for the garbage collector to find unclosed.
            with anyio.move_on_after(5.0):
                await self._client.connection_pool.disconnect(inuse_connections=True)


class ThreadLink(Link):
    """redis-py's blocking client in worker threads, for trio (redis.asyncio needs asyncio)."""

    def __init__(self, coordinator: RedisCoordinator) -> None:
        super().__init__(coordinator)
        import redis

        self._client = redis.Redis.from_url(self._url, retry=_no_retries(for_asyncio=False), **self._options)
        self._scripts = {name: self._client.register_script(text) for name, text in _SCRIPTS.items()}
        # Its own threads: waiting calls must not take the default limiter's tokens from sync tools.
        self._limiter = anyio.CapacityLimiter(16)
        self._listener = anyio.CapacityLimiter(1)

    async def run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import RedisError

        try:
            return await anyio.to_thread.run_sync(
                partial(self._scripts[script], keys=keys, args=args), limiter=self._limiter
            )
        except Exception as exc:
            raise self._translated(exc, RedisError) from exc

    async def listen(self, channel: str, deliver: Callable[[str], None]) -> None:
        while True:
            pubsub = self._client.pubsub()  # type: ignore[no-untyped-call,unused-ignore]  # annotated from redis-py 8.2 on
            try:
                await anyio.to_thread.run_sync(pubsub.subscribe, channel, limiter=self._listener)
                while True:
                    # A blocking read in a thread, at most `recheck` long so that closing never waits more.
                    message = await anyio.to_thread.run_sync(
                        partial(pubsub.get_message, ignore_subscribe_messages=True, timeout=self._recheck),
                        limiter=self._listener,
                    )
                    if message is not None and message.get("type") == "message":
                        deliver(str(message["data"]))
            except Exception:
                await anyio.sleep(self._recheck)
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await anyio.to_thread.run_sync(pubsub.close, limiter=self._listener)
                    except Exception:  # a broken connection is being dropped anyway
                        pass

    async def aclose(self) -> None:
        self.closing = True
        await anyio.to_thread.run_sync(self._client.close, limiter=self._limiter)


def running_trio() -> bool:
    try:
        import sniffio
    except ImportError:  # anyio runs without sniffio only on asyncio
        return False
    try:
        return sniffio.current_async_library() == "trio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"
