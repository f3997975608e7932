"""The `Dispatcher`: the facade users hold. It registers tools and servers and submits batches.

What a call does once submitted (admission by the gate, attempts, retries, timeouts, settling) is the
executor's (`_execution`); the handles a caller waits on are in `_batch`, built with the dispatcher's own
settings (`_hooks.BatchDefaults`); which tool a name means is the catalogue's; servers are registered by
`_servers` and kept by the registry (`_registry`), local functions by `_functions`; `_lifetime` opens
and closes the task group. The methods here are those pieces' public entry points and their documentation.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Literal, Self

from ._core import _checks as checks
from ._core._catalog import Catalog, ToolEntry
from ._core._errors import ConfigurationError
from ._driver._execution import Executor
from ._driver._hooks import BatchDefaults
from ._driver._lifetime import Lifetime
from ._driver._person import Person
from ._driver._retry import RetryPolicy
from ._functions import Functions
from ._mcp._online import OnlineLimit
from ._mcp._questions import QuestionPolicy, asker_for
from ._mcp._transport import DEFAULT_MAX_ANSWER_BYTES
from ._servers import Servers

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
    from types import TracebackType

    from mcp import Client, StdioServerParameters
    from mcp.server import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations
    from opentelemetry.trace import TracerProvider

    from ._core._calls import ToolCall, ToolResult
    from ._core._idempotency import IdempotencyKeys
    from ._core._keys import KeyFunction
    from ._core._limit_setting import AdaptiveLimit
    from ._driver._approval import ApprovalPolicy, ApprovalRequest, Approver, SessionGuard
    from ._driver._batch import Batch
    from ._driver._coordination import Coordinator
    from ._driver._observe import CallEvent
    from ._mcp._pins import DefinitionChange
    from ._mcp._questions import QuestionHandler
    from ._mcp._reconnect import ReconnectPolicy

__all__ = ["Dispatcher"]

_DEFAULT_RETRY = RetryPolicy()


class Dispatcher:
    """Runs batches of tool calls: reads together, writes alone and in order.

    Args:
        max_concurrency: The most calls in flight at once across the dispatcher, or None for no limit.
        call_timeout: Seconds each call may take before it is abandoned as TIMEOUT (its server-side
            handler is cancelled), or None for no timeout. For a call that is retried, the limit of
            each attempt. A call is cut off no sooner, and at most 0.1% of it (at least 2 ms) later.
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
        qualified_names: Name every MCP tool ``server__tool`` (your name for the server, then the
            tool's own), as Claude Code and Codex prefix theirs, so that no tool's name depends on
            which servers are connected or in which order. False (the default): a tool keeps its own
            name when it is free, but an untrusted server never holds a name that a trusted server
            (or a local function) also offers (see docs/mcp.md, "Tool names"). Local functions keep
            the names you give them either way.
        fail_fast: Stop what depends on a failed write: once a call that may mutate fails or ends
            with an unknown outcome, the later calls of its batch that conflict with it (the same
            conflict key or domain; without keys, every later call) are not run, each with a FAILED,
            never-ran result naming the call it depended on. Calls that conflict with none run as
            usual. False (the default): every call runs. Every batch can set its own (docs/retries.md).
        ask_user: An async callable that shows the person a `Question` a server asks during a call (MCP
            elicitation) and returns their `Answer`. One question at a time, whichever server asks;
            while it waits, the clocks of the call it belongs to stop. None (the default): servers
            are not told that questions can be asked (the SDK refuses any that come). Applies to the
            connections `connect` makes (docs/long-running.md).
        questions: How long a question may wait for an answer and how many a server may ask (default
            `QuestionPolicy()`: 300 s, 10 a call, 4 waiting per server).

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
        qualified_names: bool = False,
        fail_fast: bool = False,
        ask_user: QuestionHandler | None = None,
        questions: QuestionPolicy | None = None,
    ) -> None:
        max_concurrency = checks.whole("max_concurrency", max_concurrency, none="no limit")
        call_timeout = checks.seconds("call_timeout", call_timeout, none="none")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be a RetryPolicy or None, got {type(retry).__name__}")
        # The one human channel: approvals and servers' questions reach the person one at a time.
        self._person = Person()
        self._defaults = BatchDefaults(
            approve=approve,
            approval=approval,
            guard=guard,
            on_event=on_event,
            tracer_provider=tracer_provider,
            fail_fast=fail_fast,
            person=self._person,
        )
        self._max_concurrency = max_concurrency
        self._call_timeout = call_timeout
        self._retry = retry
        self._catalog = Catalog(qualified=checks.flag("qualified_names", qualified_names))
        self._executor = Executor(
            self._catalog,
            max_concurrency=max_concurrency,
            call_timeout=call_timeout,
            retry=retry,
            coordinator=coordinator,
        )
        asker = asker_for(ask_user, questions, self._person)
        self._servers = Servers(
            self._catalog, self._executor, call_timeout=call_timeout, coordinator=coordinator, asker=asker
        )
        self._lifetime = Lifetime(self._executor)
        self._functions = Functions(self._catalog)

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

    @property
    def approval(self) -> ApprovalPolicy:
        """The approval policy of batches that set none of their own (`ApprovalPolicy()` unless given)."""
        return self._defaults.approval

    @property
    def approver(self) -> Approver | None:
        """The approver of batches that set none of their own (None: nothing is asked)."""
        return self._defaults.approve

    async def ask_approval(
        self, approver: Approver | None, request: ApprovalRequest, approval: ApprovalPolicy | None = None
    ) -> str | None:
        """Ask `approver` about `request` as a batch would, in turn with the dispatcher's other prompts.

        For code that asks on the dispatcher's behalf (a framework's own permission hook): the prompt
        waits for the person to be free of approvals and servers' questions, the policy's `timeout`
        counts from when it is shown, and failures and odd answers deny the call (`ApprovalPolicy.ask`).

        Returns:
            None when the call is approved, else why it is denied.
        """
        return await self._defaults.ask(approver, request, approval)

    @property
    def abandoned_threads(self) -> int:
        """Worker threads of sync functions still running after their call ended TIMEOUT or CANCELLED.

        A thread cannot be interrupted: the call ends on time, and its function goes on in the background
        until it returns by itself. A number that keeps growing points at a function that hangs.
        """
        return self._functions.threads.abandoned

    @property
    def idle(self) -> bool:
        """Whether every call submitted so far has its result: none is queued, waiting or running."""
        return self._executor.idle

    @property
    def running(self) -> int:
        """How many calls are running at this moment."""
        return self._executor.running

    async def __aenter__(self) -> Self:
        await self._lifetime.enter()
        self._defaults.start(functools.partial(OnlineLimit.shown, self._servers.online))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._lifetime.exit(self._servers.registry.aclose, exc_type, exc, tb)

    # Registration ----------------------------------------------------------------------------------

    def add_function(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        annotations: ToolAnnotations | None = None,
        description: str | None = None,
        domain: str | None = None,
        keys: KeyFunction | None = None,
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
            domain: The conflict domain of the function's calls (see docs/conflicts.md): its writes
                then wait only for calls in the same domain. None: the root key, which conflicts with
                every call.
            keys: A function from a call's arguments to its keys within `domain` (a string, an
                iterable of strings, or None for the whole domain); needs `domain`.

        Returns:
            The catalogue entry.

        Raises:
            ConfigurationError: The name is taken by another local function or is not usable.
        """
        self._lifetime.check_not_closed()
        return self._functions.add(
            fn, name=name, annotations=annotations, description=description, domain=domain, keys=keys
        )

    async def add_mcp_server(
        self,
        name: str,
        client: Client,
        *,
        trusted: bool = False,
        max_concurrency: int | AdaptiveLimit | Literal["auto"] | None = None,
        overrides: Mapping[str, ToolAnnotations] | None = None,
        on_definition_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None = None,
        domain: str | None = None,
        keys: Mapping[str, KeyFunction] | None = None,
        review_new_tools: bool = False,
        idempotency: IdempotencyKeys | None = None,
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
            max_concurrency: The most calls in flight on this server at once, or None for no limit; an
                `AdaptiveLimit` (or ``"auto"``, `AdaptiveLimit()`) for a limit that follows the server
                between a floor and a ceiling, moved by how its read-only calls fare (their latency,
                timeouts and, for a trusted server only, its overload answers); see docs/tuning.md.
            overrides: Your own annotations for some of its tools, by the server's tool name. They are
                trusted even for an untrusted server; hints an override leaves unset fall back to the
                server's (if trusted) or the spec defaults.
            on_definition_change: Called with each `DefinitionChange` (a tool whose definition differs
                from its pin, or a new tool to review); return True (or an awaitable of True) to accept
                exactly the definition it shows. The tool is blocked until the change is accepted, here
                or with `accept_changes`; if the server changes the tool again while this decides, the
                answer applies to nothing and it is asked about the newer definition.
            domain: Your conflict domain for this server's state (see docs/conflicts.md): its calls
                are keyed under it, so its writes wait only for calls in the same domain (and calls
                with no domain). Servers that share state must share a domain. None: the root key,
                which conflicts with every call.
            keys: Key functions for some of its tools, by the server's tool name: each maps a
                call's arguments to its keys within `domain`. Needs `domain`.
            review_new_tools: For a trusted server, treat a tool that appears after its tools were
                first seen (after the first listing, or with pins imported for it) as a change to
                review, as it always is for an untrusted server: hidden from `tools()` and failing its
                calls until accepted. False (the default) lets a trusted server's new tools in at once.
            idempotency: How the server takes an idempotency key (`IdempotencyKeys`: a named
                argument or a ``_meta`` entry), if it deduplicates calls by one: each call of its tools
                that may mutate carries one key, the same on every attempt. A trusted server's
                non-idempotent tools then become retryable on transient failures. None (the default):
                no key is sent. See docs/retries.md.

        Returns:
            The server's callable catalogue entries.

        Raises:
            ConfigurationError: The name is taken or empty, a limit is invalid, or an override names a
                tool the server does not have.
        """
        self._lifetime.check_not_closed()
        return await self._servers.add_mcp_server(
            name,
            client,
            trusted=trusted,
            max_concurrency=max_concurrency,
            overrides=overrides,
            on_definition_change=on_definition_change,
            domain=domain,
            keys=keys,
            review_new_tools=review_new_tools,
            idempotency=idempotency,
        )

    async def connect(
        self,
        name: str,
        target: MCPServer[Any] | Server[Any] | StdioServerParameters | str | Callable[[], Client],
        *,
        trusted: bool = False,
        max_concurrency: int | AdaptiveLimit | Literal["auto"] | None = None,
        overrides: Mapping[str, ToolAnnotations] | None = None,
        mode: Literal["auto", "legacy"] = "auto",
        follow_changes: bool = True,
        on_definition_change: Callable[[DefinitionChange], bool | Awaitable[bool]] | None = None,
        connect_timeout: float | None = 30.0,
        reconnect: ReconnectPolicy | None = None,
        domain: str | None = None,
        keys: Mapping[str, KeyFunction] | None = None,
        max_answer_bytes: int | None = DEFAULT_MAX_ANSWER_BYTES,
        review_new_tools: bool = False,
        task_timeout: float | None = None,
        idle_timeout: float | None = None,
        idempotency: IdempotencyKeys | None = None,
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
            max_concurrency: The most calls in flight on this server at once, None for no limit, or an
                `AdaptiveLimit` (``"auto"``) that follows the server (see `add_mcp_server`).
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
            reconnect: The reconnect backoff, ping timeout, close grace and subscription
                acknowledgement timeout of this connection; None for `ReconnectPolicy()`.
            domain: Your conflict domain for this server's state (see `add_mcp_server`).
            keys: Key functions for some of its tools (see `add_mcp_server`).
            max_answer_bytes: The largest message, in bytes of JSON, accepted from a stdio or HTTP
                server (default 16 MiB). A larger answer fails its call alone (FAILED, saying so)
                and the connection goes on; a larger notification is dropped. None: no cap. Not
                applied to in-process servers or client factories (their transports are not built
                here).
            review_new_tools: For a trusted server, review its new tools (see `add_mcp_server`); an
                untrusted server's new tools are always reviewed.
            task_timeout: Seconds a task may run, for the tools whose calls run as tasks (a tool that
                requires or allows tasks on a server that advertises them; docs/long-running.md), or
                None. When it passes, the task is cancelled on the server and the call ends TIMEOUT
                (FAILED, its outcome unknown, if the server does not confirm the cancellation). It is
                also the TTL asked of the server. The dispatcher's `call_timeout` caps every call,
                tasks included, so a `task_timeout` above it is rejected: raise `call_timeout` (or
                set it to None) for tasks meant to outlive it.
            idle_timeout: Seconds a call may go without a progress notification from the server
                before it ends TIMEOUT (`no progress from the server within idle_timeout=...`), or
                None. Each notification starts the wait again; `call_timeout` stays the hard cap, so
                a call that keeps reporting runs until it. A task call counts each change of its polled
                state (status or status message) as progress.
            idempotency: How the server takes an idempotency key (see `add_mcp_server`).

        Returns:
            The server's callable catalogue entries.

        Raises:
            ConfigurationError: The name is taken or empty, an argument is invalid, or an override
                names a tool the server does not have.
            ServerConnectionError: The server could not be connected to or its tools listed.
            DispatcherClosedError: The dispatcher is not open.
        """
        self._lifetime.check_open()
        return await self._servers.connect(
            self._lifetime.task_group,
            name,
            target,
            trusted=trusted,
            max_concurrency=max_concurrency,
            overrides=overrides,
            mode=mode,
            follow_changes=follow_changes,
            on_definition_change=on_definition_change,
            connect_timeout=connect_timeout,
            reconnect=reconnect,
            domain=domain,
            keys=keys,
            max_answer_bytes=max_answer_bytes,
            review_new_tools=review_new_tools,
            task_timeout=task_timeout,
            idle_timeout=idle_timeout,
            idempotency=idempotency,
        )

    async def refresh(self, name: str) -> list[ToolEntry]:
        """List a server's tools again now and update the catalogue.

        New tools become callable, removed ones fail with a result that says so, and tools whose
        definition differs from their pin, and new tools to review, are blocked (see
        `pending_changes`); with an `on_definition_change` callback, this returns once it has answered
        about every change pending (a change found while it decides included). Connections made
        with `connect` do this by themselves when the server announces a change; call this for
        servers added with `add_mcp_server`, for example when your client hears of a change.

        Returns:
            The server's callable catalogue entries.

        Raises:
            ConfigurationError: No server has this name.
            ServerConnectionError: The server could not be reached.
        """
        return await self._servers.refresh(name)

    def pending_changes(self, server: str | None = None) -> list[DefinitionChange]:
        """The tools blocked because their definition changed since it was approved, or because they are new.

        Args:
            server: Only this server's changes; None for every server's.

        Raises:
            ConfigurationError: No server has this name.
        """
        return self._servers.registry.pending(server)

    def accept_changes(
        self, server: str | DefinitionChange | Iterable[DefinitionChange], tool: str | None = None
    ) -> list[DefinitionChange]:
        """Approve changed (or new) definitions: pin them and make their tools callable again.

        Pass the changes a person reviewed (from `pending_changes`) to approve exactly what they saw:
        a change whose tool the server has changed again since is not accepted, and the tool stays
        blocked under the newer change. A server's name accepts whatever is pending now, reviewed or
        not (for scripts that accept every change).

        Calls of those tools that were queued before the change and have not started follow the new
        definition: a call queued as a read whose tool now may mutate waits for an exclusive turn at
        its place in the order, and is put to the approver if the approval policy now selects it.

        Args:
            server: The reviewed `DefinitionChange` (or several), or the name of the server whose
                pending changes to accept.
            tool: With a server's name, only this tool's change (by the server's tool name); None
                accepts all of the server's.

        Returns:
            The changes accepted (a reviewed change that is no longer pending is left out).

        Raises:
            ConfigurationError: No server has this name, `tool` has no pending change, or `server`
                is neither a name nor changes.
        """
        return self._servers.registry.accept(server, tool)

    def export_pins(self) -> dict[str, dict[str, str]]:
        """The approved definition hash of every tool seen, as ``{server: {tool: "sha256:..."}}``.

        Save it (it is plain JSON) and pass it to `import_pins` in a later run, so that definitions
        that changed between runs are blocked too, and tools added between runs are reviewed. Tools
        still awaiting review are left out; a server listed with none approved maps to ``{}``.
        """
        return self._servers.registry.pins.export()

    def import_pins(self, pins: Mapping[str, Mapping[str, str]]) -> None:
        """Load approvals saved with `export_pins`, replacing the pins of the servers they name.

        Import before registering servers: a tool whose definition differs from its imported pin is
        blocked when first listed, and so is a tool the imported pins of its server do not name (a new
        tool: for an untrusted server, or a trusted one with ``review_new_tools``). Tools already
        listed are checked against the imported pins at once.

        Raises:
            ConfigurationError: `pins` is not in the form `export_pins` returns.
        """
        self._servers.registry.load_pins(pins)

    def server_limit(self, name: str) -> int | None:
        """The most calls in flight on a server now: its `max_concurrency`, where an adaptive one is now, or None.

        Raises:
            ConfigurationError: No server has this name.
        """
        return self._servers.limit(name)

    def tools(self) -> list[ToolEntry]:
        """The catalogue: every callable tool, in registration order."""
        return self._catalog.entries()

    # Dispatch --------------------------------------------------------------------------------------

    def batch(
        self,
        *,
        approve: Approver | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
        fail_fast: bool | None = None,
    ) -> Batch:
        """Start an incremental batch: submit calls one by one, as they arrive.

        ``approve``, ``approval``, ``guard`` and ``fail_fast`` replace the dispatcher's own for this
        batch (see `dispatch`).
        """
        self._lifetime.check_open()
        return self._defaults.batch(self._executor, self._catalog, approve, approval, guard, fail_fast)

    async def dispatch(
        self,
        calls: Sequence[ToolCall],
        *,
        approve: Approver | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
        fail_fast: bool | None = None,
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
            fail_fast: Whether this batch stops what depends on a failed write (see `Dispatcher`);
                None: the dispatcher's setting.

        Raises:
            BatchError: An item is not a `ToolCall`, or two calls share an id; nothing was run.
            DispatcherClosedError: The dispatcher is not open.
            ConfigurationError: ``approve``, ``approval`` or ``guard`` is not of the right kind, or the
                approval policy names a tool that is not registered (see `ApprovalPolicy`).
        """
        batch = self._defaults.batch(self._executor, self._catalog, approve, approval, guard, fail_fast)
        await self._executor.submit_yielding(batch, batch._accept(calls))
        return await batch.wait()
