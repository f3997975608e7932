"""The wiring of an adaptive per-server limit (`AdaptiveLimit`): each call's send and answer, fed to its controller.

The controller (`_core._adaptive.Controller`) decides; this module only tells it what happened and applies
what it decides. `OnlineLimit` is one server's: `LimitedTool` wraps each of the server's tools, so that
every attempt waits out a Retry-After, is counted from the moment it is sent until it ends, and reports
how it ended; the limit the controller then holds is put into the gate (the place every per-server
limit is enforced) through `apply`. The executor needs no change: every call that ends is followed by
the gate admitting what it now allows.

Whose words count
-----------------
What a server says about its own load (an error code, a 429, "rate limit exceeded", a Retry-After) is
the server's word, and an untrusted server's words never decide how calls are scheduled: for it only
what the dispatcher observes counts, the latency of its answers and the calls that got no answer in
time. A trusted server's words count too:

- an `MCPError` in the server-defined range -32000..-32099 (not the dispatcher's own -32098 for an
  answer over `max_answer_bytes`), a code 429, or an error whose message says it is overloaded or
  rate limited (`says_overloaded`) is an overload;
- so is a tool's error result (``isError``) whose text says so: many servers report a rate limit
  inside an ordinary result;
- a Retry-After in the error's data (``{"retryAfter": 2}``) or its text holds back the server's next
  calls, up to `AdaptiveLimit.max_wait`.

Any other error result, from any server, counts for nothing: how fast a server refuses a call is no
measure of how fast it does the work, so only successful results are latency samples.

Timeouts count for every server: the call's own timeout (`call_timeout`), its idle timeout and the
SDK's read timeout (-32001; from an untrusted server only the SDK's own, not an error it answered with
that code). Cancellation by the caller and failures that say nothing about load (a bad request, a lost
connection, a blocked tool) count for nothing. Only calls of read-only tools move the
limit (writes run alone whatever it is); calls that run as MCP tasks are not latency samples (their
time is the task's, not the server's queue).

A limit shared by the fleet
---------------------------
With a fleet coordinator that shares the server's limit (`RedisCoordinator.shared_limit`: see
`dispatcher.fleet._shared`), the limit is the fleet's level, not the controller's. The controller runs
the same rule on the same signals, fed each call's view of the fleet (the holds in force across the fleet
when it was granted, the shared limit then); what it does with an answer (its level cut by a factor, or
grown by some calls) is sent to the fleet as a move, and it follows every level the fleet's replies show
(a cut it did not make is adopted as a cut: its calls sent before it cannot cut again). The gate then
holds the shared limit, and events and spans carry it, said to be the fleet's. A trusted server's
Retry-After is sent as well, as a pause of the fleet (capped at `max_wait`), and the pause a reply
shows holds this process's sends. A call whose fleet hold was lost, or whose lease ran out before it
ended (a frozen process), reports nothing: its latency and words are not the fleet's load under a hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import REQUEST_TIMEOUT

from .._core._adaptive import Controller, Flight, Signal
from .._core._overload import retry_after, says_overloaded
from ._failures import ANSWER_TOO_LARGE

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from mcp.types import CallToolResult

    from .._core._catalog import ToolImpl
    from .._core._limit_setting import AdaptiveLimit
    from .._driver._coordination import Lease
    from ..fleet._shared import SharedLimit

__all__ = ["FleetController", "LimitedTool", "OnlineLimit", "classify_error", "classify_result"]

# The server-defined error codes of JSON-RPC: a server's own way of saying it failed.
_SERVER_ERRORS = range(-32099, -32000 + 1)
# Codes some servers borrow from HTTP for "too many requests" and "unavailable".
_HTTP_OVERLOAD = (429, 503)


class FleetController(Controller):
    """The controller of a server whose limit the fleet shares: the same rule, its level the fleet's.

    What `OnlineLimit` needs on top of `Controller`'s public `level`, `follow` and `hold`: the fleet's
    calls in flight, whether a probe is armed, and the fleet's bounds.
    """

    __slots__ = ()

    def sending(self, held: int | None) -> None:
        """A call is about to be sent with `held` holds in force across the fleet (itself included).

        The calls in flight are the fleet's, so a probe armed here goes out with the call that the
        fleet's admission let past the level (`SharedLimit.argument`).
        """
        if held is not None:
            self.in_flight = max(0, held - 1)

    @property
    def probing(self) -> bool:
        """Whether a probe is armed: the limit shows one call more than the level."""
        return self.limit > self.level_limit()

    def bound(self, floor: int, ceiling: int) -> None:
        """Take the fleet's floor and ceiling (the first process's, when this one configured others)."""
        self.floor, self.ceiling = floor, ceiling
        self.follow(self.level)


class OnlineLimit:
    """One server's adaptive limit: its controller, and how its limit reaches the gate.

    Args:
        server: Your name for the server.
        setting: The floor, ceiling and factors.
        trusted: Whether the server's own words about its load count (see the module docstring).
        apply: Called with the new limit whenever it changes.
        waiting: Whether calls of the server wait for room under its limit now.
        call_timeout: The dispatcher's `call_timeout`: a call cancelled once it has run that long
            timed out.
        coordinator: The dispatcher's fleet coordinator, if any: the limit is the fleet's when it
            shares the server's (its ``shared_limit(server, setting)`` returns one).
    """

    __slots__ = (
        "__weakref__",
        "_apply",
        "_epoch",
        "applied",
        "call_timeout",
        "controller",
        "server",
        "shared",
        "trusted",
        "waiting",
    )

    def __init__(
        self,
        server: str,
        setting: AdaptiveLimit,
        *,
        trusted: bool,
        apply: Callable[[int], object],
        waiting: Callable[[], bool],
        call_timeout: float | None,
        coordinator: object = None,
    ) -> None:
        self.waiting = waiting
        self.server = server
        factory = getattr(coordinator, "shared_limit", None)
        self.shared: SharedLimit | None = factory(server, setting) if callable(factory) else None
        """The fleet's limit of the server, when the fleet shares it; None: the limit is this process's."""
        self.controller = FleetController(setting) if self.shared is not None else Controller(setting)
        self.trusted = trusted
        self._apply = apply
        self.call_timeout = call_timeout
        # The fleet's epoch last followed: a new one the controller did not cause is a cut to adopt.
        self._epoch = 0
        self.applied = self.limit
        """The limit last put into the gate."""
        apply(self.applied)
        if self.shared is not None:
            self.shared.follow(self)

    @staticmethod
    def shown(online: Mapping[str, OnlineLimit], server: str | None) -> tuple[int, Literal["server", "fleet"]] | None:
        """What events and spans show of `server`'s adaptive limit: the limit now and whose it is, or None."""
        limit = online.get(server) if server is not None else None
        if limit is None:
            return None
        return limit.limit, "fleet" if limit.shared is not None else "server"

    @property
    def limit(self) -> int:
        """The server's limit now: the fleet's when it shares it."""
        shared = self.shared
        return shared.limit if shared is not None else self.controller.limit

    def sync(self) -> None:
        """Put the limit into the gate if it moved."""
        limit = self.limit
        if limit != self.applied:
            self.applied = limit
            self._apply(limit)

    def follow_fleet(self, level: float, epoch: int, source: object, pause: float) -> None:
        """The fleet's level now (`SharedLimit` tells it); `source` made the move that set it, if known.

        A new epoch it did not cause is a cut it adopts; an epoch lower than the last (Redis lost the
        hash and the fleet started again) is followed as it is. `pause`: seconds left of the fleet's
        pause (a trusted server's Retry-After heard by any process), held here too up to `max_wait`.
        """
        controller = self.controller
        shared = self.shared
        if isinstance(controller, FleetController) and shared is not None:
            floor, ceiling = shared.within
            if (floor, ceiling) != (controller.floor, controller.ceiling):
                controller.bound(floor, ceiling)
            cut = epoch > self._epoch and source is not self
            self._epoch = epoch
            controller.follow(level, cut=cut)
            if pause > 0:
                controller.hold(anyio.current_time(), pause)
        self.sync()

    @property
    def probing(self) -> bool:
        """Whether the server's controller probes (one call past the fleet's level)."""
        controller = self.controller
        return isinstance(controller, FleetController) and controller.probing

    def sending(self, lease: Lease | None) -> None:
        """A call is about to be sent under `lease`: with a shared limit, the controller counts the fleet's calls."""
        controller = self.controller
        if isinstance(controller, FleetController):
            controller.sending(lease.held if lease is not None else None)

    def sent(self, flight: Flight, lease: Lease | None) -> int:
        """A call was sent under `lease`; with a shared limit, its record shows the fleet's load then.

        Returns the fleet's epoch it was sent under (what its moves are judged by).
        """
        if self.shared is not None:
            held = lease.held if lease is not None else None
            if held is not None:
                flight.in_flight = max(flight.in_flight, held)
            flight.limit = self.limit
        return self._epoch

    def level(self) -> float:
        """The controller's level (0 for a limit that is this process's: nothing to send)."""
        return self.controller.level if self.shared is not None else 0.0

    def moved(self, before: float, epoch: int, pause: float | None = None) -> None:
        """The controller went from level `before` on a call sent under the fleet's `epoch`: tell the fleet.

        `pause`: the seconds a trusted server's Retry-After asked for (the controller holds them up to
        `max_wait`): the fleet holds them too, up to the same.
        """
        shared = self.shared
        if shared is None:
            return
        after = self.level()
        if after < before:
            shared.move(self, "cut", epoch, after / before)
        elif after > before:
            shared.move(self, "grow", epoch, after - before, self.controller.top)
        wait = min(pause or 0.0, self.controller.setting.max_wait)
        if wait > 0:
            shared.move(self, "pause", epoch, wait)


class LimitedTool:
    """A tool of a server with an adaptive limit: each attempt is reported to the server's controller.

    Args:
        inner: The tool as it would run without the limit.
        online: The server's adaptive limit.
        tool: The tool's name on its server (its latency baseline is its own).
        read: Whether the tool is read-only (only those calls move the limit).
    """

    __slots__ = ("inner", "online", "read", "tool")

    def __init__(self, inner: ToolImpl, online: OnlineLimit, tool: str, *, read: bool) -> None:
        self.inner = inner
        self.online = online
        self.tool = tool
        # A task's time is the task's, not the server's queue: not a latency sample.
        self.read = read and getattr(inner, "task", None) is None

    def prepare(self, arguments: Mapping[str, Any]) -> Any:
        return self.inner.prepare(arguments)

    async def invoke(self, prepared: Any, lease: Lease | None = None) -> CallToolResult:
        online = self.online
        controller = online.controller
        entered = anyio.current_time()
        wait = controller.wait(entered)
        if wait > 0:
            # The server asked for a pause: this call keeps its place under the limit and waits it out.
            await anyio.sleep(wait)
        online.sending(lease)
        flight = controller.start(anyio.current_time())
        epoch = online.sent(flight, lease)
        online.sync()
        signal, pause = Signal.OTHER, None
        try:
            result = await self.inner.invoke(prepared, lease)
        except Exception as exc:
            signal, pause = classify_error(exc, online.trusted)
            raise
        except BaseException:
            timeout = online.call_timeout
            if timeout is not None and anyio.current_time() >= entered + timeout:
                signal = Signal.TIMEOUT  # cut off at the call's timeout (a cancellation by the caller is not)
            raise
        else:
            signal, pause = classify_result(result, online.trusted)
            return result
        finally:
            if lease is not None and (lease.lost or anyio.current_time() >= lease.valid_until):
                # Its hold was lost or its lease ran out (the process was frozen, cut off from Redis): what
                # it saw is not the fleet's load under its hold, and a Retry-After may be long past.
                signal, pause = Signal.OTHER, None
            before = online.level()
            controller.finish(
                flight,
                anyio.current_time(),
                signal,
                tool=self.tool,
                read=self.read,
                retry_after=pause,
                waiting=online.waiting(),
            )
            online.moved(before, epoch, pause if signal is Signal.OVERLOAD else None)
            online.sync()


def classify_result(result: CallToolResult, trusted: bool) -> tuple[Signal, float | None]:
    """What a tool's result says about its server's load: an answer, (trusted only) an overload, or nothing.

    An error result is no latency sample: how fast a server refuses a call says nothing about how fast it
    does the work (one that answers errors at once would otherwise grow its limit to the ceiling, and then
    be cut to the floor by its first real answer, measured against the errors' speed).
    """
    if not result.is_error:
        return Signal.ANSWER, None
    if trusted:
        text = " ".join(getattr(block, "text", "") for block in result.content[:8])
        if says_overloaded(text):
            return Signal.OVERLOAD, retry_after(text)
    return Signal.OTHER, None


def classify_error(exc: Exception, trusted: bool) -> tuple[Signal, float | None]:
    """What a failed attempt says about its server's load (see the module docstring)."""
    if isinstance(exc, TimeoutError):
        return Signal.TIMEOUT, None  # the idle timeout: no progress in time
    if not isinstance(exc, MCPError):
        return Signal.OTHER, None
    code = exc.error.code
    if code == REQUEST_TIMEOUT and (trusted or _timed_out_here(exc)):
        return Signal.TIMEOUT, None
    if not trusted or code == ANSWER_TOO_LARGE:
        return Signal.OTHER, None
    message = exc.error.message if isinstance(exc.error.message, str) else ""
    if code in _SERVER_ERRORS or code in _HTTP_OVERLOAD or says_overloaded(message):
        return Signal.OVERLOAD, retry_after(message, exc.error.data)
    return Signal.OTHER, None


def _timed_out_here(exc: MCPError) -> bool:
    """Whether a -32001 is the SDK's own read timeout, not an error the server answered with that code.

    The SDK raises its timeout ``from None``; a server's error answer is raised as it came. An untrusted
    server could otherwise cut its own limit by answering -32001 at once, which is its word, not a
    timeout the dispatcher observed.
    """
    return exc.__suppress_context__ and exc.__cause__ is None
