"""The dispatcher: registration, submission, and a worker pool that carries out the gate's decisions.

Calls are admitted by `_gate.Gate` (a fair readers-writer discipline with limits) and run by a pool of
worker tasks that lives in the dispatcher's task group. A worker that finishes a call takes the next
admitted call itself, so a stream of short calls costs no task creation per call; workers are created
on demand up to the concurrency limit and park when there is nothing to run.

Every call settles exactly once into a `ToolResult`. Failures are results, never exceptions that could
cancel siblings. Cancelling a waiting caller cancels that caller's calls, waits until they have ended,
and then lets the cancellation propagate.
"""

from __future__ import annotations

import json
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self

import anyio
import anyio.lowlevel

from ._annotations import effective_annotations
from ._approval import ApprovalPolicy, SessionGuard
from ._calls import CallStatus, ToolCall, ToolResult
from ._catalog import ArgumentError, Catalog, ToolEntry, ToolImpl
from ._connections import ServerRegistry, check_target
from ._coordination import admitted_runner, budget_factory
from ._errors import BatchError, ConfigurationError, DispatcherClosedError, ServerConnectionError
from ._functions import FunctionTool
from ._gate import Gate, Ticket
from ._hooks import CallHooks
from ._mcp import ToolUnavailableError, describe_failure
from ._observe import Observer, resolve_tracer
from ._retry import Attempt, Retrier, RetryPolicy, eligible, is_transient

if TYPE_CHECKING:
    from collections.abc import Awaitable
    from types import TracebackType

    from anyio.abc import TaskGroup
    from mcp import Client, StdioServerParameters
    from mcp.server import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, ToolAnnotations
    from opentelemetry.trace import TracerProvider

    from ._approval import ApprovalRequest, Approver
    from ._coordination import Coordinator
    from ._observe import CallEvent, CallState
    from ._pins import DefinitionChange
    from ._retry import RetryBudget

__all__ = ["Batch", "Dispatcher", "PendingCall"]

# The longest `ToolResult.error` kept; a longer explanation is cut, saying how long it was.
_MAX_ERROR = 1000

# Parked workers kept for reuse when there is no concurrency limit; beyond this, idle workers exit.
_IDLE_WORKERS_UNLIMITED = 64

_DEFAULT_RETRY = RetryPolicy()


class PendingCall:
    """A submitted call. `await pending.wait()` gives its result once it has ended."""

    __slots__ = (
        "_batch",
        "_cancel_requested",
        "_entry",
        "_event",
        "_hooks",
        "_impl",
        "_prepared",
        "_result",
        "_scope",
        "_state",
        "_ticket",
        "call",
        "queued_at",
        "started_at",
    )

    def __init__(self, call: ToolCall, batch: Batch, queued_at: float) -> None:
        self.call = call
        self.queued_at = queued_at
        self.started_at: float | None = None
        self._batch: Batch | None = batch
        self._hooks = batch._hooks
        self._entry: ToolEntry | None = None
        self._impl: ToolImpl | None = None
        self._prepared: Any = None
        self._ticket: Ticket[PendingCall] | None = None
        self._scope: anyio.CancelScope | None = None
        self._cancel_requested = False
        self._result: ToolResult | None = None
        self._event: anyio.Event | None = None
        # Only calls of a batch with hooks (approvals, a guard, events, tracing) have a state.
        self._state: CallState | None = None

    @property
    def done(self) -> bool:
        """Whether the call has a result."""
        return self._result is not None

    def result(self) -> ToolResult:
        """The call's result; raises `RuntimeError` if it has not ended yet."""
        if self._result is None:
            raise RuntimeError(f"call {self.call.id!r} has not finished; await wait() first")
        return self._result

    def cancel(self) -> None:
        """Cancel this call if it has not ended: a queued call never starts, a running one is interrupted.

        It then settles as CANCELLED (unless it ended first); its batch goes on with its other calls.
        """
        batch = self._batch
        if self._result is None and batch is not None:
            batch._dispatcher._cancel([self])

    async def wait(self) -> ToolResult:
        """Wait for the call to end and return its result."""
        if self._result is None:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        assert self._result is not None
        return self._result

    def _settle(
        self,
        status: CallStatus,
        *,
        result: CallToolResult | None = None,
        error: str | None = None,
        attempts: int = 0,
        attempt_errors: tuple[str, ...] = (),
    ) -> None:
        entry = self._entry
        if error is not None and len(error) > _MAX_ERROR:
            # A tool or server can put anything in its error text; the full text stays in `result`.
            error = f"{error[:_MAX_ERROR]}... ({len(error):,} characters in all)"
        self._result = settled = ToolResult(
            self.call,
            status,
            result=result,
            error=error,
            attempts=attempts,
            tool=entry.name if entry is not None else None,
            server=entry.server if entry is not None else None,
            queued_at=self.queued_at,
            started_at=self.started_at,
            finished_at=anyio.current_time(),
            attempt_errors=attempt_errors,
            # Anything an open-world tool sent back, errors included, may carry instructions.
            untrusted_content=attempts > 0 and entry is not None and bool(entry.annotations.open_world_hint),
        )
        self._prepared = None
        # Drop the references that make cycles (call <-> batch, call <-> ticket): a finished batch is
        # then freed by reference counting instead of waiting for the garbage collector.
        self._ticket = None
        batch = self._batch
        self._batch = None
        if self._state is not None:
            hooks = self._hooks
            assert hooks is not None
            hooks.settled(self._state, settled)
        if self._event is not None:
            self._event.set()
        assert batch is not None, "a call settles once"
        batch._settled()

    def __repr__(self) -> str:
        state = self._result.status.value if self._result is not None else "pending"
        return f"<PendingCall {self.call.id!r} {self.call.name!r} {state}>"


class Batch:
    """Calls submitted one by one, for example as a model streams them.

    Each call is queued as soon as it is submitted and starts as soon as the scheduling rules allow.
    Use it as an async context manager: leaving the block normally waits for every call; leaving it with
    an exception (or a cancellation) cancels the calls that have not ended, waits for them, and lets the
    exception propagate.

    Example:
        async with dispatcher.batch() as batch:
            async for call in model_stream():
                batch.submit(call)
        results = batch.results()
    """

    __slots__ = ("_dispatcher", "_event", "_hooks", "_ids", "_remaining", "_works")

    def __init__(self, dispatcher: Dispatcher, hooks: CallHooks | None = None) -> None:
        self._dispatcher = dispatcher
        self._hooks = hooks
        self._works: list[PendingCall] = []
        self._ids: set[str] = set()
        self._remaining = 0
        self._event: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._works)

    @property
    def done(self) -> bool:
        """Whether every submitted call has a result."""
        return self._remaining == 0

    def submit(self, call: ToolCall) -> PendingCall:
        """Queue one call behind everything submitted before it.

        Raises:
            BatchError: The item is not a `ToolCall`, or its id is empty or already used in this batch.
            DispatcherClosedError: The dispatcher is not open.
        """
        self._check(call, len(self._works))
        self._ids.add(call.id)
        return self._dispatcher._submit(self, call)

    def submit_all(self, calls: Iterable[ToolCall]) -> list[PendingCall]:
        """Check every call first, then queue them all in order; nothing is queued if one is bad.

        Raises:
            BatchError: One of the items is not a `ToolCall` or has an empty or duplicate id.
        """
        calls = list(calls)
        seen = set(self._ids)
        for position, call in enumerate(calls, start=len(self._works)):
            self._check(call, position, seen)
            seen.add(call.id)
        self._dispatcher._check_open()
        self._ids = seen
        submit = self._dispatcher._submit
        return [submit(self, call) for call in calls]

    def _check(self, call: object, position: int, seen: set[str] | None = None) -> None:
        if not isinstance(call, ToolCall):
            raise BatchError(f"item {position} is a {type(call).__name__}, not a ToolCall")
        if not isinstance(call.id, str) or not call.id:
            raise BatchError(f"item {position} has an empty or non-string id: {call.id!r}")
        if call.id in (self._ids if seen is None else seen):
            raise BatchError(f"duplicate call id {call.id!r} (item {position}); every call needs its own id")

    def results(self) -> list[ToolResult]:
        """The results in submission order; raises `RuntimeError` if some call has not ended."""
        return [work.result() for work in self._works]

    def cancel(self) -> None:
        """Cancel every call of this batch that has not ended; each gets a CANCELLED result."""
        self._dispatcher._cancel(self._works)

    async def wait(self) -> list[ToolResult]:
        """Wait for every call submitted so far; return all results in submission order.

        If the waiting task is cancelled, the batch's unfinished calls are cancelled and awaited before
        the cancellation propagates.
        """
        if self._remaining:
            if self._event is None:
                self._event = anyio.Event()
            event = self._event
            try:
                await event.wait()
            finally:
                if self._remaining:
                    with anyio.CancelScope(shield=True):
                        self.cancel()
                        await event.wait()
        return [work._result for work in self._works]  # type: ignore[misc]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and self._remaining:
            self.cancel()
        await self.wait()

    def _added(self) -> None:
        self._remaining += 1
        if self._remaining == 1:
            self._event = None
            self._dispatcher._live.add(self)

    def _settled(self) -> None:
        self._remaining -= 1
        if self._remaining == 0:
            self._dispatcher._live.discard(self)
            if self._event is not None:
                self._event.set()


class _Slot:
    """A parked worker waiting to be handed a call."""

    __slots__ = ("event", "ticket")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.ticket: Ticket[PendingCall] | None = None


class Dispatcher:
    """Runs batches of tool calls: reads together, writes alone and in order.

    Args:
        max_concurrency: The most calls in flight at once across the dispatcher, or None for no limit.
        call_timeout: Seconds each call may take before it is abandoned as TIMEOUT (its server-side
            handler is cancelled), or None for no timeout. For a call that is retried, the limit of
            each attempt.
        retry: When to try a failed call again, or None to never retry. Only calls of tools declared
            idempotent by a trusted source are retried, and only after failures that may be transient.
        approve: An async callable asked to confirm the calls that `approval` selects; it gets an
            `ApprovalRequest` and returns True to let the call run. None: nothing is asked (the policy
            is not applied). Every batch can set its own.
        approval: Which calls need confirmation, and how long to wait for it (default
            `ApprovalPolicy()`: calls that are not read-only and may be destructive, 300 s).
        guard: A `SessionGuard` for the one agent session this dispatcher serves; pass a guard to each
            `dispatch` instead when it serves several sessions.
        on_event: Called with a `CallEvent` when a call is queued, starts, is retried and finishes.
        tracer_provider: The OpenTelemetry tracer provider for a span per call and per attempt; None
            uses the global one if an SDK has configured it, and traces nothing otherwise.
        coordinator: Shares limits, shared-state order and retry budgets with other processes (a
            `dispatcher.fleet.RedisCoordinator`, entered by you); None: this process decides alone.

    Use it as an async context manager; calls run in its task group::

        async with Dispatcher() as dispatcher:
            await dispatcher.add_mcp_server("files", client, trusted=True)
            results = await dispatcher.dispatch(calls)
    """

    def __init__(
        self,
        *,
        max_concurrency: int | None = 16,
        call_timeout: float | None = 60.0,
        retry: RetryPolicy | None = _DEFAULT_RETRY,
        approve: Approver | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
        on_event: Callable[[CallEvent], object] | None = None,
        tracer_provider: TracerProvider | None = None,
        coordinator: Coordinator | None = None,
    ) -> None:
        if max_concurrency is not None and (
            not isinstance(max_concurrency, int) or isinstance(max_concurrency, bool) or max_concurrency < 1
        ):
            raise ConfigurationError(
                f"max_concurrency must be an int >= 1, got {max_concurrency!r}; use None for no limit"
            )
        if call_timeout is not None and not (call_timeout > 0 and math.isfinite(call_timeout)):
            raise ConfigurationError(
                f"call_timeout must be a positive number of seconds, got {call_timeout!r}; use None for none"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be a RetryPolicy or None, got {type(retry).__name__}")
        _check_approvals(approve, approval, guard)
        if on_event is not None and not callable(on_event):
            raise ConfigurationError(f"on_event must be a callable taking a CallEvent, got {on_event!r}")
        self._max_concurrency = max_concurrency
        self._call_timeout = call_timeout
        self._retry = retry
        self._budgets: dict[str | None, RetryBudget] = {}
        # The fleet hook: how an admitted call runs (`_run` itself without a coordinator), and retry budgets.
        self._run_admitted = admitted_runner(coordinator, self._run)
        self._new_budget = budget_factory(coordinator)
        self._rng = random.Random(retry.seed if retry is not None else None)
        self._catalog = Catalog()
        self._servers = ServerRegistry(self._catalog)
        self._gate: Gate[PendingCall] = Gate(max_concurrency)
        self._tg: TaskGroup | None = None
        self._open = False
        self._idle: list[_Slot] = []
        self._idle_cap = max_concurrency if max_concurrency is not None else _IDLE_WORKERS_UNLIMITED
        self._workers = 0
        self._live: set[Batch] = set()
        self._watched: deque[PendingCall] = deque()
        self._watchdog_wake: anyio.Event | None = None
        self._approve = approve
        self._approval = approval if approval is not None else ApprovalPolicy()
        self._guard = guard
        self._on_event = on_event
        self._tracer_provider = tracer_provider
        self._observer: Observer | None = None
        # The hooks of batches that set none of their own; None when nothing is configured.
        self._hooks: CallHooks | None = None

    @property
    def max_concurrency(self) -> int | None:
        """The dispatcher-wide limit on calls in flight (None: unlimited)."""
        return self._max_concurrency

    @property
    def call_timeout(self) -> float | None:
        """The time limit of each call in seconds (None: unlimited)."""
        return self._call_timeout

    @property
    def retry(self) -> RetryPolicy | None:
        """The retry policy (None: calls are never retried)."""
        return self._retry

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise DispatcherClosedError("this Dispatcher is already open; create one per async with block")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._open = True
        if self._call_timeout is not None:
            tg.start_soon(self._watchdog, self._call_timeout)
        # Resolved on entry, so a tracer provider configured after construction is still found.
        tracer = resolve_tracer(self._tracer_provider)
        if tracer is not None or self._on_event is not None:
            self._observer = Observer(self._on_event, tracer)
        if self._observer is not None or self._approve is not None or self._guard is not None:
            self._hooks = CallHooks(
                approver=self._approve, policy=self._approval, guard=self._guard, observer=self._observer
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        assert tg is not None
        self._open = False
        # Outstanding calls end as CANCELLED; waiters get their results instead of hanging.
        for batch in list(self._live):
            batch.cancel()
        for slot in self._idle:
            slot.event.set()
        self._idle.clear()
        # Owned clients close cleanly first; cancelling them mid-exit would leave transports half-closed.
        await self._servers.aclose()
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The dispatcher's own tasks turn every failure into a result, so a group that holds only
            # the body's exception is the task group wrapping it: let it propagate as it was raised.
            if exc is not None and group.split(lambda error: error is exc)[1] is None:
                return False
            raise

    # Registration ----------------------------------------------------------------------------------

    def add_function(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        annotations: ToolAnnotations | None = None,
        description: str | None = None,
    ) -> ToolEntry:
        """Register a local sync or async callable as a tool.

        The user declares a local function, so its annotations are trusted; hints it leaves out take the
        spec defaults (a function with no annotations is treated as mutating and runs alone). The input
        schema comes from the signature; sync functions run in a worker thread.

        Args:
            fn: The callable. Its parameters must be JSON-representable (pydantic-validatable) types.
            name: The tool's name (default: the function's name).
            annotations: The tool's hints; set ``readOnlyHint=True`` for calls that may run together.
            description: Overrides the docstring as the description shown to the model.

        Returns:
            The catalogue entry.

        Raises:
            ConfigurationError: The name is taken by another local function or is not usable.
        """
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(tool_name, str) or not tool_name or tool_name == "<lambda>":
            raise ConfigurationError("a tool needs a name: pass name=... for lambdas and callable objects")
        if self._catalog.has(None, tool_name):
            raise ConfigurationError(f"a local function named {tool_name!r} is already registered")
        impl = FunctionTool(fn)
        entry = ToolEntry(
            tool_name,
            None,
            tool_name,
            effective_annotations(annotations, trusted=True),
            declared_annotations=annotations,
            trusted=True,
            description=description if description is not None else (fn.__doc__ or "").strip() or None,
            input_schema=impl.input_schema,
            output_schema=impl.output_schema,
            title=annotations.title if annotations is not None else None,
        )
        self._catalog.put([(entry, impl)])
        return self._entry(None, tool_name)

    async def add_mcp_server(
        self,
        name: str,
        client: Client,
        *,
        trusted: bool = False,
        max_concurrency: int | None = None,
        overrides: Mapping[str, ToolAnnotations] | None = None,
        on_definition_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None = None,
    ) -> list[ToolEntry]:
        """Register the tools of an MCP server reached through an entered `mcp.Client`.

        The server's tools are listed now, and again on `refresh`. The dispatcher does not own the
        client: keep it open while the dispatcher runs calls on it, and close it yourself. Use
        `connect` instead to have the dispatcher own the connection, reconnect it and follow
        changes to the tool list.

        Args:
            name: Your name for this server: its identity for trust, pins and `ToolCall.server`. It
                is never taken from the server itself, since a server can call itself anything.
            client: An entered `mcp.Client`.
            trusted: Whether to believe the server's tool annotations. An untrusted server's tools are
                all scheduled as the spec's worst case: exclusive, never retried.
            max_concurrency: The most calls in flight on this server at once, or None for no limit.
            overrides: Your own annotations for some of its tools, by the server's tool name. They are
                trusted even for an untrusted server; hints an override leaves unset fall back to the
                server's (if trusted) or the spec defaults.
            on_definition_change: Called with each `DefinitionChange` (a tool whose definition differs
                from its pin); return True (or an awaitable of True) to accept it. The tool is blocked
                until the change is accepted, here or with `accept_changes`.

        Returns:
            The server's callable catalogue entries.

        Raises:
            ConfigurationError: The name is taken or empty, a limit is invalid, or an override names a
                tool the server does not have.
        """
        overrides = self._check_server(name, max_concurrency, overrides)
        server = self._servers.reserve(name, trusted=trusted, overrides=overrides, on_change=on_definition_change)
        self._gate.set_server_limit(name, max_concurrency)
        try:
            await self._servers.add_client(server, client)
        except BaseException:
            self._servers.release(server)
            self._gate.set_server_limit(name, None)
            raise
        return self._server_entries(name)

    async def connect(
        self,
        name: str,
        target: MCPServer[Any] | Server[Any] | StdioServerParameters | str | Callable[[], Client],
        *,
        trusted: bool = False,
        max_concurrency: int | None = None,
        overrides: Mapping[str, ToolAnnotations] | None = None,
        mode: Literal["auto", "legacy"] = "auto",
        follow_changes: bool = True,
        on_definition_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None = None,
        connect_timeout: float | None = 30.0,
    ) -> list[ToolEntry]:
        """Connect to an MCP server and register its tools; the dispatcher owns the connection.

        The client is entered in the dispatcher's task group and closed when the dispatcher closes.
        If the connection is lost, the calls in flight on it end FAILED and the next call reconnects
        with a fresh client, which lists the tools again and checks them against their pins. Calls
        share one reconnect attempt; after a failed attempt they fail at once until a backoff (1 s,
        doubling up to 30 s) has passed.

        Args:
            name: Your name for this server (see `add_mcp_server`).
            target: What to connect to: an in-process `MCPServer` (or low-level `Server`), a
                `StdioServerParameters` to launch a subprocess, the URL of a streamable HTTP endpoint,
                or a function returning a new, unentered `mcp.Client` (for headers, auth, timeouts and
                other client options). A function is called again for every reconnect.
            trusted: Whether to believe the server's tool annotations (see `add_mcp_server`).
            max_concurrency: The most calls in flight on this server at once, or None for no limit.
            overrides: Your own annotations for some of its tools (see `add_mcp_server`).
            mode: The protocol negotiation: "auto" (2026-07-28, falling back to the legacy handshake)
                or "legacy" (the 2025-11-25 initialize handshake). Set it on the client yourself when
                `target` is a function.
            follow_changes: Whether to list the tools again whenever the server announces that they
                changed (`subscriptions/listen` on 2026-07-28, `notifications/tools/list_changed` on
                legacy connections).
            on_definition_change: Called with each `DefinitionChange`; return True to accept it (see
                `add_mcp_server`). On the first listing, `connect` returns once it has answered; after a
                reconnect, calls to the other tools go ahead while it decides.
            connect_timeout: Seconds that connecting and listing the tools may take (not counting
                `on_definition_change`), or None.

        Returns:
            The server's callable catalogue entries.

        Raises:
            ConfigurationError: The name is taken or empty, an argument is invalid, or an override
                names a tool the server does not have.
            ServerConnectionError: The server could not be connected to or its tools listed.
            DispatcherClosedError: The dispatcher is not open.
        """
        self._check_open()
        overrides = self._check_server(name, max_concurrency, overrides)
        check_target(target)
        if mode not in ("auto", "legacy"):
            raise ConfigurationError(f"mode must be 'auto' or 'legacy', got {mode!r}")
        if mode != "auto" and callable(target) and not isinstance(target, str):
            raise ConfigurationError("mode cannot be set for a client factory: pass mode=... to the Client it builds")
        if connect_timeout is not None and not (connect_timeout > 0 and math.isfinite(connect_timeout)):
            raise ConfigurationError(
                f"connect_timeout must be a positive number of seconds or None, got {connect_timeout!r}"
            )
        server = self._servers.reserve(name, trusted=trusted, overrides=overrides, on_change=on_definition_change)
        connection = self._servers.connection(server, target, mode=mode, follow=follow_changes, timeout=connect_timeout)
        self._gate.set_server_limit(name, max_concurrency)
        assert self._tg is not None
        try:
            await self._tg.start(connection.run)
        except BaseException as exc:
            self._servers.release(server)
            self._gate.set_server_limit(name, None)
            cause = _innermost(exc)
            if isinstance(cause, ConfigurationError):
                raise cause from None  # the caller's mistake, found in the listing
            if isinstance(exc, Exception):
                raise ServerConnectionError(f"could not connect to server {name!r}: {_describe(exc)}") from exc
            raise
        return self._server_entries(name)

    async def refresh(self, name: str) -> list[ToolEntry]:
        """List a server's tools again now and update the catalogue.

        New tools become callable, removed ones fail with a result that says so, and tools whose
        definition differs from their pin are blocked (see `pending_changes`). Connections made
        with `connect` do this by themselves when the server announces a change; call this for
        servers added with `add_mcp_server`, for example when your client hears of a change.

        Returns:
            The server's callable catalogue entries.

        Raises:
            ConfigurationError: No server has this name.
            ServerConnectionError: The server could not be reached.
        """
        try:
            await self._servers.refresh(name)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise ServerConnectionError(f"could not list the tools of server {name!r}: {_describe(exc)}") from exc
        return self._server_entries(name)

    def pending_changes(self, server: str | None = None) -> list[DefinitionChange]:
        """The tools blocked because their definition changed since it was approved.

        Args:
            server: Only this server's changes; None for every server's.

        Raises:
            ConfigurationError: No server has this name.
        """
        return self._servers.pending(server)

    def accept_changes(self, server: str, tool: str | None = None) -> list[DefinitionChange]:
        """Approve changed definitions: pin them and make their tools callable again.

        Args:
            server: The server whose changes to accept.
            tool: Only this tool's change (by the server's tool name); None accepts all of the server's.

        Returns:
            The changes accepted.

        Raises:
            ConfigurationError: No server has this name, or `tool` has no pending change.
        """
        return self._servers.accept(server, tool)

    def export_pins(self) -> dict[str, dict[str, str]]:
        """The approved definition hash of every tool seen, as ``{server: {tool: "sha256:..."}}``.

        Save it (it is plain JSON) and pass it to `import_pins` in a later run, so that definitions
        that changed between runs are blocked too.
        """
        return self._servers.pins.export()

    def import_pins(self, pins: Mapping[str, Mapping[str, str]]) -> None:
        """Load approvals saved with `export_pins`, replacing the pins of the servers they name.

        Import before registering servers: a tool whose definition differs from its imported pin is
        blocked when first listed. Tools already listed are checked against the imported pins at once.

        Raises:
            ConfigurationError: `pins` is not in the form `export_pins` returns.
        """
        self._servers.load_pins(pins)

    def _check_server(
        self, name: str, max_concurrency: int | None, overrides: Mapping[str, ToolAnnotations] | None
    ) -> dict[str, ToolAnnotations]:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a server needs a non-empty name, got {name!r}")
        if name in self._catalog.servers or name in self._servers:
            raise ConfigurationError(f"a server named {name!r} is already registered")
        if max_concurrency is not None and (
            not isinstance(max_concurrency, int) or isinstance(max_concurrency, bool) or max_concurrency < 1
        ):
            raise ConfigurationError(
                f"max_concurrency for server {name!r} must be an int >= 1, got {max_concurrency!r}; "
                "use None for no limit"
            )
        return dict(overrides or {})

    def _server_entries(self, name: str) -> list[ToolEntry]:
        return [entry for entry in self._catalog.entries() if entry.server == name]

    def tools(self) -> list[ToolEntry]:
        """The catalogue: every callable tool, in registration order."""
        return self._catalog.entries()

    def _entry(self, server: str | None, tool: str) -> ToolEntry:
        entry = self._catalog.get(server, tool)
        assert entry is not None
        return entry

    # Dispatch --------------------------------------------------------------------------------------

    def batch(
        self,
        *,
        approve: Approver | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
    ) -> Batch:
        """Start an incremental batch: submit calls one by one, as they arrive.

        ``approve``, ``approval`` and ``guard`` replace the dispatcher's own for this batch (see
        `dispatch`).
        """
        self._check_open()
        return Batch(self, self._batch_hooks(approve, approval, guard))

    async def dispatch(
        self,
        calls: Sequence[ToolCall],
        *,
        approve: Approver | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
    ) -> list[ToolResult]:
        """Run a batch of calls and return one result per call, in call order.

        Concurrent calls (effective readOnlyHint) run together within the limits; every other call
        waits for everything submitted before it and runs alone. This holds across concurrent
        `dispatch()` calls too. A failing call never affects its siblings.

        Calls that need approval are asked for all at once, as the batch is submitted; each waits
        at its place in the order until it is approved (then it runs when its turn comes) or denied
        (then it gets a DENIED result and never runs).

        Args:
            calls: The calls, in the order the model asked for them.
            approve: This batch's approver, instead of the dispatcher's.
            approval: This batch's approval policy, instead of the dispatcher's.
            guard: The `SessionGuard` of the session this batch belongs to, instead of the
                dispatcher's.

        Raises:
            BatchError: An item is not a `ToolCall`, or two calls share an id; nothing was run.
            DispatcherClosedError: The dispatcher is not open.
            ConfigurationError: ``approve``, ``approval`` or ``guard`` is not of the right kind.
        """
        batch = Batch(self, self._batch_hooks(approve, approval, guard))
        batch.submit_all(calls)
        return await batch.wait()

    def _batch_hooks(
        self, approve: Approver | None, approval: ApprovalPolicy | None, guard: SessionGuard | None
    ) -> CallHooks | None:
        if approve is None and approval is None and guard is None:
            return self._hooks
        _check_approvals(approve, approval, guard)
        return CallHooks(
            approver=approve if approve is not None else self._approve,
            policy=approval if approval is not None else self._approval,
            guard=guard if guard is not None else self._guard,
            observer=self._observer,
        )

    def _check_open(self) -> None:
        if not self._open:
            raise DispatcherClosedError("the Dispatcher is not open: use it inside `async with Dispatcher() as d:`")

    def _submit(self, batch: Batch, call: ToolCall) -> PendingCall:
        self._check_open()
        work = PendingCall(call, batch, anyio.current_time())
        batch._works.append(work)
        batch._added()
        resolution = self._catalog.resolve(call.name, call.server)
        hooks = batch._hooks
        if hooks is not None:
            work._state = hooks.queued(call, resolution.entry, work.queued_at)
        if resolution.entry is None or resolution.impl is None:
            work._settle(CallStatus.FAILED, error=resolution.error)
            return work
        work._entry = entry = resolution.entry
        work._impl = impl = resolution.impl
        arguments = call.arguments if call.arguments is not None else {}
        if not isinstance(arguments, Mapping):
            work._settle(CallStatus.FAILED, error=_invalid_arguments(arguments))
            return work
        try:
            work._prepared = impl.prepare(arguments)
        except ArgumentError as exc:
            work._settle(CallStatus.FAILED, error=str(exc))
            return work
        except Exception as exc:
            work._settle(CallStatus.FAILED, error=f"invalid arguments: {type(exc).__name__}: {exc}")
            return work
        if hooks is None:
            work._ticket = self._gate.submit(work, exclusive=entry.exclusive, server=entry.server)
        else:
            self._submit_hooked(work, entry, hooks)
        self._pump()
        return work

    def _submit_hooked(self, work: PendingCall, entry: ToolEntry, hooks: CallHooks) -> None:
        """Queue a call of a batch with hooks: held at its place while its approval is asked for."""
        state = work._state
        assert state is not None
        request = hooks.approval(work.call, entry, state)
        work._ticket = self._gate.submit(work, exclusive=entry.exclusive, server=entry.server, held=request is not None)
        if request is not None:
            assert self._tg is not None
            self._tg.start_soon(self._approve_held, work, request, hooks, state)

    async def _approve_held(
        self, work: PendingCall, request: ApprovalRequest, hooks: CallHooks, state: CallState
    ) -> None:
        """Ask for a held call's approval, then release it to take its turn, or deny it."""
        # Cancelling the call (see `_cancel`) cancels this scope: the approver stops being asked.
        with anyio.CancelScope() as scope:
            work._scope = scope
            denial = await hooks.ask(request, state)
        work._scope = None
        ticket = work._ticket
        if scope.cancelled_caught or work._result is not None or ticket is None:
            return
        if denial is None:
            self._gate.release(ticket)
        else:
            self._gate.withdraw(ticket)
            work._settle(CallStatus.DENIED, error=denial)
        if self._open:
            self._pump()

    async def _approve_at_start(self, work: PendingCall, state: CallState, scope: anyio.CancelScope) -> bool:
        """Ask the approval the session guard may now require of a call about to start.

        Returns:
            Whether the call was denied (and settled).
        """
        hooks = work._hooks
        assert hooks is not None
        request = hooks.recheck(work.call, state)
        if request is None:
            return False
        work._scope = scope
        try:
            denial = await hooks.ask(request, state)
        except BaseException:
            work._scope = None
            if work._result is None:
                why = "cancelled while waiting for approval" if work._cancel_requested else "the dispatcher closed"
                work._settle(CallStatus.CANCELLED, error=why)
            raise
        work._scope = None
        if denial is None:
            return False
        work._settle(CallStatus.DENIED, error=denial)
        return True

    def _cancel(self, works: Iterable[PendingCall]) -> None:
        withdrew = False
        for work in works:
            if work._result is not None:
                continue
            ticket = work._ticket
            if ticket is not None and self._gate.withdraw(ticket):
                withdrew = True
                work._settle(CallStatus.CANCELLED, error="cancelled before it started")
                if work._scope is not None:
                    work._scope.cancel()  # its approval is still being asked for
            else:
                work._cancel_requested = True
                if work._scope is not None:
                    work._scope.cancel()
        if withdrew and self._open:
            self._pump()

    def _pump(self) -> None:
        """Hand every call the gate admits now to a parked worker, or to a new one."""
        gate = self._gate
        idle = self._idle
        while True:
            ticket = gate.take()
            if ticket is None:
                return
            if idle:
                slot = idle.pop()
                slot.ticket = ticket
                slot.event.set()
            else:
                assert self._tg is not None
                self._workers += 1
                self._tg.start_soon(self._worker, ticket)

    async def _next(self) -> Ticket[PendingCall] | None:
        """The next admitted call for a worker that just finished one, parking if there is none."""
        # Take a call before waking others: a worker with work to do never parks.
        ticket = self._gate.take()
        self._pump()
        if ticket is None and self._open and len(self._idle) < self._idle_cap:
            slot = _Slot()
            self._idle.append(slot)
            await slot.event.wait()
            ticket = slot.ticket
        return ticket

    async def _worker(self, ticket: Ticket[PendingCall] | None) -> None:
        """Run admitted calls one after another until there is nothing left to run.

        A cancel scope per call would cost more than the rest of a short call's bookkeeping, so a worker
        runs its calls inside one scope and only opens a new one after that scope was cancelled to
        interrupt a call (a timeout, or its caller giving up).
        """
        gate = self._gate
        try:
            while ticket is not None:
                with anyio.CancelScope() as scope:
                    while ticket is not None:
                        await self._run_admitted(ticket.item, scope)
                        gate.finish(ticket)
                        ticket = None
                        if scope.cancel_called:
                            break  # the scope is spent; open a fresh one
                        ticket = await self._next()
                if ticket is not None:
                    # The call was interrupted by its scope: settle it, free its place, go on.
                    work = ticket.item
                    work._scope = None
                    if work._result is None:
                        if work._cancel_requested:
                            work._settle(CallStatus.CANCELLED, error="cancelled while running", attempts=1)
                        else:
                            timeout = self._call_timeout
                            work._settle(
                                CallStatus.TIMEOUT, error=f"no result within call_timeout={timeout}s", attempts=1
                            )
                    gate.finish(ticket)
                ticket = await self._next()
        finally:
            self._workers -= 1
            if ticket is not None and ticket.item._result is None:
                # The dispatcher is closing under this worker.
                ticket.item._settle(CallStatus.CANCELLED, error="the dispatcher closed", attempts=1)

    async def _run(self, work: PendingCall, scope: anyio.CancelScope) -> None:
        """Run one admitted call and settle it, unless its scope interrupts it."""
        if work._cancel_requested:
            work._settle(CallStatus.CANCELLED, error="cancelled before it started")
            return
        state = work._state
        if state is not None and state.recheck and await self._approve_at_start(work, state, scope):
            return
        impl = work._impl
        assert impl is not None
        retry = self._retry
        if retry is not None and work._entry is not None and eligible(retry, work._entry):
            await self._run_retrying(work, scope, retry)
            return
        work.started_at = anyio.current_time()
        if state is not None:
            hooks = work._hooks
            assert hooks is not None
            hooks.attempt_started(work.call, state, work.started_at)  # its end is reported with the result
        work._scope = scope
        if self._call_timeout is not None:
            self._watch(work)
        try:
            result = await impl.invoke(work._prepared)
        except Exception as exc:
            work._scope = None
            status, error = describe_failure(exc)
            work._settle(status, error=error, attempts=1)
            return
        work._scope = None
        if result.is_error:
            work._settle(CallStatus.TOOL_ERROR, result=result, error=_error_text(result), attempts=1)
        else:
            work._settle(CallStatus.OK, result=result, attempts=1)

    async def _run_retrying(self, work: PendingCall, scope: anyio.CancelScope, policy: RetryPolicy) -> None:
        """Run a call that may be repeated, attempt after attempt, and settle it.

        The call keeps its place in the gate through every attempt and every wait, so an exclusive
        call keeps its exclusive turn and nothing overtakes it. Each attempt has its own cancel scope
        with its deadline instead of the watchdog, since a timed-out attempt must leave the call
        running; `scope` is still what its caller's cancellation (or the dispatcher closing)
        cancels, and that always propagates.
        """
        entry = work._entry
        impl = work._impl
        assert entry is not None and impl is not None
        prepared = work._prepared
        server = entry.server
        budget = None
        if policy.budget is not None:
            budget = self._budgets.get(server)
            if budget is None:
                budget = self._budgets[server] = self._new_budget(server, policy.budget, policy.budget_refill)
        retrier = Retrier(policy, budget, self._rng, server)
        call_timeout = self._call_timeout
        state = work._state
        hooks = work._hooks

        async def attempt(start: float, limit: float) -> Attempt:
            if state is None:
                return await attempt_once(start, limit)
            assert hooks is not None
            hooks.attempt_started(work.call, state, start)
            outcome = await attempt_once(start, limit)
            hooks.attempt_finished(state, outcome.status, outcome.error)
            return outcome

        async def attempt_once(start: float, limit: float) -> Attempt:
            deadline = limit if call_timeout is None else min(limit, start + call_timeout)
            with anyio.CancelScope(deadline=deadline):
                try:
                    result = await impl.invoke(prepared)
                except Exception as exc:
                    status, error = describe_failure(exc)
                    return Attempt(status, error=error, transient=is_transient(exc))
                if result.is_error:
                    return Attempt(CallStatus.TOOL_ERROR, result, _error_text(result))
                return Attempt(CallStatus.OK, result)
            # Only the attempt's own deadline is absorbed by its scope; a cancellation of the call
            # (or of the dispatcher) is still pending and is raised here.
            await anyio.lowlevel.checkpoint_if_cancelled()
            if call_timeout is None or deadline == limit:
                return Attempt(
                    CallStatus.TIMEOUT,
                    error=f"no result before the retry deadline (RetryPolicy.timeout={policy.timeout}s)",
                    transient=True,
                )
            return Attempt(CallStatus.TIMEOUT, error=f"no result within call_timeout={call_timeout}s", transient=True)

        work.started_at = started = anyio.current_time()
        work._scope = scope
        try:
            last = await retrier.run(attempt, started)
        except BaseException:
            # Cancelled: settled now with the attempts made so far, then propagated, never retried.
            work._scope = None
            if work._result is None:
                work._settle(
                    CallStatus.CANCELLED,
                    error="cancelled while running" if work._cancel_requested else "the dispatcher closed",
                    attempts=retrier.attempts,
                    attempt_errors=tuple(retrier.errors),
                )
            raise
        work._scope = None
        errors = retrier.errors if last.error is None else retrier.errors[:-1]
        work._settle(
            last.status,
            result=last.result,
            error=last.error,
            attempts=retrier.attempts,
            attempt_errors=tuple(errors),
        )

    # Timeouts --------------------------------------------------------------------------------------

    def _watch(self, work: PendingCall) -> None:
        """Put a started call under the watchdog.

        Every call has the same timeout, so deadlines arrive in start order and a FIFO is a complete
        timer queue. Entries of calls that already ended are dropped as they reach the front.
        """
        queue = self._watched
        while queue and queue[0]._result is not None:
            queue.popleft()
        queue.append(work)
        if self._watchdog_wake is not None:
            self._watchdog_wake.set()
            self._watchdog_wake = None

    async def _watchdog(self, call_timeout: float) -> None:
        queue = self._watched
        while True:
            while queue and (queue[0]._result is not None or queue[0]._scope is None):
                queue.popleft()
            if not queue:
                wake = self._watchdog_wake = anyio.Event()
                await wake.wait()
                continue
            head = queue[0]
            assert head.started_at is not None
            remaining = head.started_at + call_timeout - anyio.current_time()
            if remaining > 0:
                await anyio.sleep(remaining)
                continue
            queue.popleft()
            if head._result is None and head._scope is not None:
                head._scope.cancel()


def _innermost(exc: BaseException) -> BaseException:
    """The one exception inside nested single-exception groups (task groups wrap what they carry)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    exc = _innermost(exc)
    if isinstance(exc, ToolUnavailableError):
        return str(exc)
    return describe_failure(exc)[1] if isinstance(exc, Exception) else type(exc).__name__


def _invalid_arguments(arguments: object) -> str:
    """Why arguments that are not a mapping are rejected; JSON text that failed to parse says where."""
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except ValueError as exc:
            text = arguments if len(arguments) <= 200 else f"{arguments[:200]}..."
            return f"invalid arguments: expected a JSON object, got text that is not valid JSON ({exc}): {text!r}"
        return "invalid arguments: expected a JSON object, got a str of JSON text; parse it into a dict"
    return f"invalid arguments: expected a JSON object, got {type(arguments).__name__}"


def _check_approvals(approve: object, approval: object, guard: object) -> None:
    if approve is not None and not callable(approve):
        raise ConfigurationError(
            f"approve must be an async callable taking an ApprovalRequest and returning a bool, got {approve!r}"
        )
    if approval is not None and not isinstance(approval, ApprovalPolicy):
        raise ConfigurationError(f"approval must be an ApprovalPolicy, got {type(approval).__name__}")
    if guard is not None and not isinstance(guard, SessionGuard):
        raise ConfigurationError(f"guard must be a SessionGuard, got {type(guard).__name__}")


def _error_text(result: CallToolResult) -> str:
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]  # type: ignore[union-attr]
    return " ".join(texts).strip() or "the tool reported an error"
