"""A connection the dispatcher owns: a supervisor that enters its client, follows its tool list, reconnects.

A server registered with `Dispatcher.connect` is reached through a target (an in-process server, a stdio
command, a URL or a client factory). The dispatcher owns the client: a supervisor task in the
dispatcher's task group enters it, lists the tools, follows `tools/list_changed`, and exits it when the
connection is lost or the dispatcher closes. A `Client` can be entered only once, so the next call that
needs the server connects a fresh one, which lists the tools again and re-checks their pins. There is
one reconnect at a time per server, shared by every call that waits for it; after a failed attempt,
calls fail at once until a doubling, bounded backoff has passed, so a dead server is not hammered. The
settings are a `ReconnectPolicy`.

A connection is lost only when its transport fails. A server's error answer, whatever its code, is an
answer: -32000 is in the server-defined range as well as the SDK's code for a closed connection, so a
-32000 counts as a loss only once the connection fails to answer a ping (which the SDK refuses at
once, sending nothing, when its connection has closed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.lowlevel
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.subscriptions import SubscriptionLost
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .._core._errors import ConfigurationError
from .._core._lifecycle import mark_sent
from ._failures import ConnectionLost, ToolUnavailableError, explain, innermost, is_transport_failure
from ._session import answers
from ._tasks import TASK_CANCEL_WAIT, TaskBound, call_as_task
from ._transport import DEFAULT_MAX_ANSWER_BYTES, AuthRefusals, capped_transport

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from anyio.abc import TaskGroup, TaskStatus
    from mcp.client.session import ElicitationFnT, IncomingMessage, MessageHandlerFnT
    from mcp.shared.dispatcher import ProgressFnT
    from mcp.types import CallToolResult, RequestParamsMeta

    from ._pins import DefinitionChange
    from ._questions import Flight
    from ._reconnect import ReconnectPolicy

__all__ = ["LISTING_BURST", "LISTING_INTERVAL", "LISTING_REST", "Connection", "check_target"]

logger = logging.getLogger("dispatcher")

# The listings a server's announcements may cause: `LISTING_BURST` back to back, then one per interval (seconds),
# each followed by a rest of `LISTING_REST` times the time it took.
LISTING_BURST = 4
LISTING_INTERVAL = 1.0
LISTING_REST = 4.0


def check_target(target: object) -> None:
    """Raise `ConfigurationError` unless `target` is something `Dispatcher.connect` can connect to."""
    if isinstance(target, str) and not target.lower().startswith(("http://", "https://")):
        raise ConfigurationError(
            f"a string target is the URL of a streamable HTTP endpoint (http:// or https://), got {target!r}; "
            "to start a command, pass StdioServerParameters(command=..., args=[...])"
        )
    if isinstance(target, MCPServer | Server | StdioServerParameters | str) or callable(target):
        return
    raise ConfigurationError(
        "target must be an MCPServer, a StdioServerParameters, a URL string, or a function that returns a new "
        f"mcp.Client; got {type(target).__name__}"
    )


@dataclass(eq=False)
class _Attempt:
    done: anyio.Event = field(default_factory=anyio.Event)
    error: str | None = None


class Connection:
    """A client the dispatcher owns, entered and exited by one supervisor task (`run`).

    Calls go through `call_tool`, which waits for a connection (connecting one if needed) and reports a
    lost connection so that the next call connects afresh.
    """

    # `call_tool` marks the send itself, once it has a client to send on (`_mcp.ToolCaller`).
    marks_sent = True

    def __init__(
        self,
        server: str,
        target: MCPServer[Any] | Server[Any] | StdioServerParameters | str | Callable[[], Client],
        *,
        mode: str,
        sync: Callable[[Client], Awaitable[list[DefinitionChange]]],
        ask: Callable[..., Coroutine[Any, Any, None]],
        unavailable: Callable[[str], str | None],
        follow: bool,
        timeout: float | None,
        policy: ReconnectPolicy,
        max_answer_bytes: int | None = DEFAULT_MAX_ANSWER_BYTES,
        elicit: ElicitationFnT | None = None,
    ) -> None:
        self.server = server
        # The elicitation callback of each client (None: the dispatcher has no ask_user, nothing is advertised).
        self._elicit = elicit
        self._max_answer_bytes = max_answer_bytes
        self.policy = policy
        self._target = target
        self._mode = mode
        self._sync = sync
        self._ask = ask
        self._unavailable = unavailable
        self._follow = follow
        self._timeout = timeout
        self._client: Client | None = None
        self._drop = anyio.Event()
        self._demand = anyio.Event()
        self._attempt: _Attempt | None = None
        self._retry_at = -math.inf
        self._failures = 0
        self._error = ""
        self._closed = False
        self._closing = False
        self._running = False
        self._ended = anyio.Event()
        self._list_changed = anyio.Event()
        # Set when a call on the current client was given up on: the client is then asked to prove it is alive.
        self._suspect = anyio.Event()
        # Set while the current client is suspect: calls wait for the ping's verdict before using it.
        self._verdict: anyio.Event | None = None
        # The 401 or 403 an HTTP server last answered on a transport built here (what connecting failed on).
        self._refusals = AuthRefusals()
        # Task calls in flight, and an event set each time one ends (`aclose` waits for their cancellation).
        self._tasks = 0
        self._tasks_idle = anyio.Event()

    @property
    def protocol_version(self) -> str | None:
        """The protocol version of the current connection, if connected."""
        return self._client.protocol_version if self._client is not None else None

    # The supervisor ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect, then keep a client for as long as the dispatcher runs, reconnecting on demand.

        The first connection is made before `task_status.started()`; if it fails, this raises.
        """
        self._running = True
        try:
            await self._session(task_status)
            while not self._closing:
                await self._demand.wait()
                self._demand = anyio.Event()
                if self._closing:
                    break
                try:
                    await self._session(None)
                except Exception as exc:
                    self._failed(exc)
        finally:
            self._closed = True
            self._client = None
            self._end_attempt("the dispatcher is closing")
            self._ended.set()

    async def aclose(self) -> None:
        """Close the client normally (not by cancellation) and stop the supervisor.

        Task calls cancelled as the dispatcher closes first get their `tasks/cancel` answered (within
        `TASK_CANCEL_WAIT`): closing the client under them would leave their tasks running on the server.
        """
        self._closing = True
        if self._tasks:
            with anyio.move_on_after(TASK_CANCEL_WAIT + 1.0):
                while self._tasks:
                    await self._tasks_idle.wait()
        self._client = None
        self._drop.set()
        self._demand.set()
        if self._running:
            await self._ended.wait()

    async def _session(self, task_status: TaskStatus[None] | None) -> None:
        """Enter one client, list its tools, serve calls until it is dropped, and exit it."""
        self._refusals.clear()
        client = self._new_client()
        connected = False
        if not self._closing:
            self._drop = anyio.Event()
        deadline = math.inf if self._timeout is None else anyio.current_time() + self._timeout
        try:
            # One scope around the whole session: its deadline bounds connecting and listing, and is
            # lifted once connected (a scope cannot end while the client it encloses is still open).
            with anyio.CancelScope(deadline=deadline) as scope:
                async with client, anyio.create_task_group() as tg:
                    self._list_changed = anyio.Event()
                    self._suspect = anyio.Event()
                    self._give_verdict()
                    if self._follow:
                        # Listen first, then list: a change made in between is not missed.
                        await tg.start(self._follow_changes, client, tg)
                    changes = await self._sync(client)
                    scope.deadline = math.inf
                    self._client = client
                    connected = True
                    tg.start_soon(self._check_alive, client)
                    self._failures = 0
                    self._retry_at = -math.inf
                    if task_status is None:
                        # Calls waiting for this reconnect go ahead while the user decides: the
                        # changed tools stay blocked meanwhile.
                        self._end_attempt(None)
                        if changes:
                            await self._ask()
                    else:
                        # The first connection: `connect` returns once the user has decided.
                        if changes:
                            await self._ask()
                        task_status.started()
                    await self._drop.wait()
                    tg.cancel_scope.cancel()
            if scope.cancelled_caught and not connected:
                raise TimeoutError(f"no connection within {self._timeout}s")
        except Exception as exc:
            if not connected:
                refused = self._refusals.error(self.server)
                if refused is not None:
                    raise refused from exc
                raise
            # The transport failed under the session (a crashed server, a refused HTTP request).
            self._lost(client, exc)
        finally:
            if self._client is client:
                self._client = None

    def _new_client(self) -> Client:
        target = self._target
        if isinstance(target, StdioServerParameters | str):
            # The transports that carry bytes from another process: each message is capped on arrival.
            transport = capped_transport(target, self._max_answer_bytes, self.server, self._refusals)
            return Client(
                transport, mode=self._mode, message_handler=self._on_message, elicitation_callback=self._elicit
            )
        if isinstance(target, MCPServer | Server | StdioServerParameters | str):
            return Client(target, mode=self._mode, message_handler=self._on_message, elicitation_callback=self._elicit)
        client = target()
        if not isinstance(client, Client):
            raise TypeError(
                f"the client factory of server {self.server!r} returned {type(client).__name__}, not a Client"
            )
        client.message_handler = self._chain(client.message_handler)
        client = self._noting_refusals(client)
        if client.elicitation_callback is None:
            # The factory's own callback, if it set one, is the user's choice for this server.
            client.elicitation_callback = self._elicit
        return client

    def _noting_refusals(self, client: Client) -> Client:
        """The factory's client, its HTTP responses noted in `_refusals` where they can be (a readable 401).

        A client built on a URL gets the transport `connect` builds for a URL (the SDK's defaults, no cap)
        in its place; one built on the SDK's streamable HTTP transport over an HTTP client of the user's
        has the noting hook added to that client. Any other transport is left as it is.
        """
        target = client.server
        if isinstance(target, str):
            try:
                return dataclasses.replace(client, server=capped_transport(target, None, self.server, self._refusals))
            except ValueError:  # a client option that needs its URL (a shared cache with no target_id)
                return client
        # The keyword arguments `streamable_http_client(url, http_client=...)` was called with.
        http = (
            getattr(target, "kwds", {}).get("http_client") if isinstance(getattr(target, "kwds", None), dict) else None
        )
        if isinstance(http, httpx2.AsyncClient):
            hooks = http.event_hooks
            noted = hooks.get("response", [])
            if not any(getattr(hook, "__self__", None) is self._refusals for hook in noted):
                hooks["response"] = [*noted, self._refusals.on_response]
                http.event_hooks = hooks
        return client

    def _chain(self, user: MessageHandlerFnT | None) -> MessageHandlerFnT:
        if user is None:
            return self._on_message

        async def handler(message: IncomingMessage) -> None:
            await self._on_message(message)
            await user(message)

        return handler

    async def _on_message(self, message: IncomingMessage) -> None:
        # Runs in the session's receive loop: only note the change; the follower does the listing.
        if isinstance(message, ToolListChangedNotification):
            self._list_changed.set()
        await anyio.lowlevel.checkpoint()

    async def _follow_changes(self, client: Client, tg: TaskGroup, *, task_status: TaskStatus[None]) -> None:
        """List the tools again whenever the server says they changed; started once listening."""
        started = False
        try:
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                async with contextlib.AsyncExitStack() as stack:
                    subscription = None
                    # A server that never acknowledges must not hold up connecting: go on without.
                    with anyio.move_on_after(self.policy.listen_timeout):
                        subscription = await stack.enter_async_context(client.listen(tools_list_changed=True))
                    task_status.started()
                    started = True
                    if subscription is None or not subscription.honored.tools_list_changed:
                        logger.debug("server %r does not announce tool list changes", self.server)
                        return
                    async with anyio.create_task_group() as listing:
                        listing.start_soon(self._list_on_change, client, tg)
                        async for _ in subscription:
                            self._list_changed.set()
                        # The server closed its subscription gracefully: nothing more will be announced,
                        # but a listing under way is let finish; the lister then idles until the session ends.
            else:
                # Legacy servers send notifications/tools/list_changed unasked; `_on_message` notes them.
                task_status.started()
                started = True
                await self._list_on_change(client, tg)
        except Exception as raised:
            # The listings run in a task group beside the subscription: look inside its group.
            exc = innermost(raised)
            if not started:
                task_status.started()
            # A server can end its own subscription (or answer -32000): that alone loses no connection.
            if await self._is_lost(client, exc):
                self._lost(client, exc)
            else:
                # For example a server that does not serve subscriptions/listen: nothing to follow.
                logger.debug("not following tool list changes of server %r: %s", self.server, explain(exc))

    async def _list_on_change(self, client: Client, tg: TaskGroup) -> None:
        """List the tools again after each announced change: one listing at a time, at a bounded rate.

        Announcements only set an event, so a storm of them costs nothing per notification: those that
        arrive while a listing runs (or waits for its turn) are served by one more listing after it. The
        rate is a token bucket: up to `LISTING_BURST` listings back to back, then one per
        `LISTING_INTERVAL` seconds, so an occasional change is listed at once while a server that
        announces without pause is listed at a bounded rate. And each listing is followed by a rest of
        `LISTING_REST` times what it took, so that however large or slow a server's tool list, its
        listings take at most 1/(1 + LISTING_REST) of the time and cannot crowd out the loop that the
        other servers' calls share.
        """
        tokens = float(LISTING_BURST)
        stamp = anyio.current_time()
        not_before = -math.inf
        while True:
            await self._list_changed.wait()
            rest = not_before - anyio.current_time()
            if rest > 0:
                await anyio.sleep(rest)
            now = anyio.current_time()
            tokens = min(float(LISTING_BURST), tokens + (now - stamp) / LISTING_INTERVAL)
            stamp = now
            if tokens < 1:
                await anyio.sleep((1 - tokens) * LISTING_INTERVAL)
                tokens, stamp = 1.0, anyio.current_time()
            tokens -= 1
            # Cleared only now: announcements made during the wait are covered by this listing.
            self._list_changed = anyio.Event()
            spent = await self._resync(client, tg)
            # A listing that is slow to fetch or to check (thousands of tools) is followed by a rest
            # LISTING_REST times as long, so one server's listings take at most a small share of the time.
            not_before = anyio.current_time() + LISTING_REST * spent

    async def _check_alive(self, client: Client) -> None:
        """Ping the server after each call that was given up on; no answer in time means the connection is lost.

        A call that times out (or whose caller gives up) proves nothing about the connection, and a
        connection can stay open while nothing gets through any more: a stdio server that writes bytes
        that are not UTF-8 stops the SDK reading its output for good, while the process runs on. Without
        this check every later call would time out as well, for as long as the dispatcher runs. Any
        answer proves the connection alive, an error included (2026-07-28 servers no longer serve ping).
        """
        while True:
            await self._suspect.wait()
            self._suspect = anyio.Event()
            try:
                if not await answers(client, self.policy.ping_timeout):
                    self._lost(client, ConnectionLost(self._no_answer()))
                    return
            finally:
                self._give_verdict()

    def _give_verdict(self) -> None:
        """Let the calls waiting for the liveness check go on (to this client or to a fresh one)."""
        verdict, self._verdict = self._verdict, None
        if verdict is not None:
            verdict.set()

    def _no_answer(self) -> str:
        return f"the server did not answer a ping within {self.policy.ping_timeout}s"

    async def _is_lost(self, client: Client, exc: BaseException) -> bool:
        """Whether `exc`, raised by a request on `client`, means that the connection is gone.

        A transport failure is; a -32000 or the end of a subscription is only if the connection no
        longer answers a ping; any other answer of the server is not.
        """
        if is_transport_failure(exc):
            return True
        if isinstance(exc, MCPError) and exc.error.code != CONNECTION_CLOSED:
            return False  # an answer, whatever else happens on the connection meanwhile
        if client is not self._client:
            return True  # dropped already (by another call, or because the dispatcher is closing)
        if isinstance(exc, SubscriptionLost | MCPError):
            return not await answers(client, self.policy.ping_timeout)
        return False

    async def _resync(self, client: Client, tg: TaskGroup) -> float:
        """List the tools again and ask about the changes; return the seconds the listing itself took.

        The user is asked beside the follower (in the session's task group `tg`), which goes on
        listing: a change made while the user decides replaces the pending one at once, and the
        answer then applies to nothing.
        """
        start = anyio.current_time()
        spent = None
        try:
            changes = await self._sync(client)
            spent = anyio.current_time() - start
            if changes:
                tg.start_soon(functools.partial(self._ask, wait=False))
        except Exception as exc:
            if isinstance(exc, SubscriptionLost) or await self._is_lost(client, exc):
                raise
            logger.warning("could not list the tools of server %r again: %s", self.server, explain(exc))
        return spent if spent is not None else anyio.current_time() - start

    def _lost(self, client: Client, exc: BaseException) -> None:
        if client is self._client:
            self._client = None
            self._error = explain(exc)
            self._drop.set()
            self._give_verdict()

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        self._error = explain(exc)
        self._retry_at = anyio.current_time() + self.policy.backoff(self._failures)
        self._end_attempt(self._error)

    def _end_attempt(self, error: str | None) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            attempt.error = error
            attempt.done.set()

    # What calls use ------------------------------------------------------------------------------

    async def client(self) -> Client:
        """The connected client, after connecting a fresh one if the last was lost.

        Raises:
            ToolUnavailableError: The server cannot be reached now.
        """
        while True:
            client = self._client
            if client is not None:
                return client
            if self._closed:
                raise ToolUnavailableError(f"the connection to server {self.server!r} is closed")
            attempt = self._attempt
            if attempt is None:
                wait = self._retry_at - anyio.current_time()
                if wait > 0:
                    raise ToolUnavailableError(
                        f"server {self.server!r} is unreachable ({self._error}); "
                        f"the next reconnect attempt is in {wait:.1f}s"
                    )
                attempt = self._attempt = _Attempt()
                self._demand.set()
            await attempt.done.wait()
            if attempt.error is not None:
                raise ToolUnavailableError(f"could not reconnect to server {self.server!r}: {attempt.error}")

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        progress_callback: ProgressFnT | None = None,
        meta: dict[str, Any] | None = None,
        confirm: Callable[[], None] | None = None,
    ) -> CallToolResult:
        """Call a tool on the current client; a lost connection is noted and the error re-raised.

        `meta` is the request's `_meta`; `confirm` (a fleet hold's check) is called right before the send.
        """
        return await self._call(name, arguments, None, progress_callback, meta, confirm)

    async def call_task(
        self,
        name: str,
        arguments: dict[str, Any],
        bound: TaskBound,
        *,
        confirm: Callable[[], None] | None = None,
        flight: Flight | None = None,
        meta: dict[str, Any] | None = None,
    ) -> CallToolResult:
        """Call a tool as a task on the current client (`call_as_task`), with `call_tool`'s connection handling."""
        self._tasks += 1
        try:
            return await self._call(name, arguments, bound, meta=meta, confirm=confirm, flight=flight)
        finally:
            self._tasks -= 1
            self._tasks_idle.set()
            self._tasks_idle = anyio.Event()

    async def _call(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        task: TaskBound | None,
        progress: ProgressFnT | None = None,
        meta: dict[str, Any] | None = None,
        confirm: Callable[[], None] | None = None,
        flight: Flight | None = None,
    ) -> CallToolResult:
        if self._verdict is not None:
            # A call on this client was given up on: first learn whether the client still answers.
            await self._verdict.wait()
        client = self._client
        if client is None:
            client = await self.client()
        # Checked again now: connecting lists the tools anew, which may have blocked or removed this one.
        reason = self._unavailable(name)
        if reason is not None:
            raise ToolUnavailableError(reason)
        if confirm is not None:
            confirm()  # no await between it and the send
        mark_sent()  # past this point the SDK may write the request (see `_lifecycle.Moment`)
        try:
            if task is not None:
                return await call_as_task(client, name, arguments or {}, task, flight, meta=meta)
            return await client.call_tool(
                name, arguments, progress_callback=progress, meta=cast("RequestParamsMeta | None", meta)
            )
        except anyio.get_cancelled_exc_class():
            # Given up on (a timeout, or its caller's cancellation): check that the connection still answers.
            if client is self._client:
                self._suspect.set()
                if self._verdict is None:
                    self._verdict = anyio.Event()
            raise
        except Exception as exc:
            # An answer stays the server's answer (its code decides retries: -32602 is never retried),
            # unless it is the SDK's -32000 for a connection that no longer answers.
            if not await self._is_lost(client, exc):
                raise
            self._lost(client, exc)
            raise self._connection_lost() from exc

    def _connection_lost(self) -> ConnectionLost:
        # An outcome nobody knows, which the retry rules treat as transient.
        return ConnectionLost(f"{self._error} (server {self.server!r}; the next call reconnects)")

    async def refresh(self) -> None:
        """List the tools again now (connecting first if needed)."""
        client = await self.client()
        try:
            changes = await self._sync(client)
        except Exception as exc:
            if await self._is_lost(client, exc):
                self._lost(client, exc)
            raise
        if changes:
            await self._ask()
