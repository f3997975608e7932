"""The `Dispatcher`: the facade users hold. It registers tools and servers and submits batches.

What a call does once submitted (admission by the gate, attempts, retries, timeouts, settling) is the
executor's (`_execution`); the handles a caller waits on are in `_batch`; which tool a name means is the
catalogue's; connections to servers are the registry's (`_registry`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Literal, Self

import anyio

from ._core import _checks as checks
from ._core._adaptive import AdaptiveLimit, check_limit
from ._core._annotations import effective_annotations
from ._core._catalog import Catalog, ToolEntry
from ._core._errors import ConfigurationError, DispatcherClosedError, ServerConnectionError
from ._core._idempotency import IdempotencyKeys
from ._core._keys import check_domain, check_key_functions
from ._driver._approval import ApprovalPolicy, ApprovalRequest, SessionGuard
from ._driver._batch import Batch
from ._driver._execution import Executor
from ._driver._hooks import CallHooks
from ._driver._observe import Observer, resolve_tracer
from ._driver._person import Person
from ._driver._retry import RetryPolicy
from ._functions import FunctionTool, ThreadWatch
from ._mcp._connections import check_target
from ._mcp._failures import explain as _describe
from ._mcp._failures import innermost as _innermost
from ._mcp._online import OnlineLimit
from ._mcp._questions import Asker, QuestionPolicy
from ._mcp._registry import ServerRegistry, check_annotations, check_reconnect
from ._mcp._transport import DEFAULT_MAX_ANSWER_BYTES

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
    from types import TracebackType

    from anyio.abc import TaskGroup
    from mcp import Client, StdioServerParameters
    from mcp.server import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations
    from opentelemetry.trace import TracerProvider

    from ._core._calls import ToolCall, ToolResult
    from ._core._keys import KeyFunction
    from ._driver._approval import Approver
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
        _check_approvals(approve, approval, guard)
        if on_event is not None and not callable(on_event):
            raise ConfigurationError(f"on_event must be a callable taking a CallEvent, got {on_event!r}")
        self._max_concurrency = max_concurrency
        self._call_timeout = call_timeout
        self._retry = retry
        self._fail_fast = checks.flag("fail_fast", fail_fast)
        self._catalog = Catalog(qualified=checks.flag("qualified_names", qualified_names))
        self._servers = ServerRegistry(self._catalog)
        self._coordinator = coordinator
        self._executor = Executor(
            self._catalog,
            max_concurrency=max_concurrency,
            call_timeout=call_timeout,
            retry=retry,
            coordinator=coordinator,
        )
        self._servers.on_update = self._executor.accepted
        if ask_user is not None and not callable(ask_user):
            raise ConfigurationError(f"ask_user must be an async callable taking a Question, got {ask_user!r}")
        if questions is not None and not isinstance(questions, QuestionPolicy):
            raise ConfigurationError(f"questions must be a QuestionPolicy or None, got {type(questions).__name__}")
        # The one human channel: approvals and servers' questions reach the person one at a time.
        self._person = Person()
        if ask_user is not None:
            self._servers.asker = Asker(
                ask_user, questions if questions is not None else QuestionPolicy(), person=self._person
            )
        self._tg: TaskGroup | None = None
        self._threads = ThreadWatch()
        self._approve = approve
        self._approval = approval if approval is not None else ApprovalPolicy()
        self._guard = guard
        self._on_event = on_event
        self._tracer_provider = tracer_provider
        self._observer: Observer | None = None
        # The servers whose limit is adaptive (`AdaptiveLimit`), by name.
        self._online: dict[str, OnlineLimit] = {}
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

    @property
    def approval(self) -> ApprovalPolicy:
        """The approval policy of batches that set none of their own (`ApprovalPolicy()` unless given)."""
        return self._approval

    @property
    def approver(self) -> Approver | None:
        """The approver of batches that set none of their own (None: nothing is asked)."""
        return self._approve

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
        policy = approval if approval is not None else self._approval
        async with self._person.turn():
            return await policy.ask(approver, request)

    @property
    def abandoned_threads(self) -> int:
        """Worker threads of sync functions still running after their call ended TIMEOUT or CANCELLED.

        A thread cannot be interrupted: the call ends on time, and its function goes on in the background
        until it returns by itself. A number that keeps growing points at a function that hangs.
        """
        return self._threads.abandoned

    @property
    def idle(self) -> bool:
        """Whether every call submitted so far has its result: none is queued, waiting or running."""
        return self._executor.idle

    @property
    def running(self) -> int:
        """How many calls are running at this moment."""
        return self._executor.running

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise DispatcherClosedError("this Dispatcher is already open; create one per async with block")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._executor.start(tg)
        # Resolved on entry, so a tracer provider configured after construction is still found.
        tracer = resolve_tracer(self._tracer_provider)
        if tracer is not None or self._on_event is not None:
            self._observer = Observer(self._on_event, tracer, limits=functools.partial(OnlineLimit.shown, self._online))
        if self._observer is not None or self._approve is not None or self._guard is not None:
            self._hooks = CallHooks(
                approver=self._approve,
                policy=self._approval,
                guard=self._guard,
                observer=self._observer,
                person=self._person,
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
        # Outstanding calls end as CANCELLED; waiters get their results instead of hanging.
        self._executor.close()
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
        self._check_not_closed()
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(tool_name, str) or not tool_name or tool_name == "<lambda>":
            raise ConfigurationError("a tool needs a name: pass name=... for lambdas and callable objects")
        if self._catalog.has(None, tool_name):
            raise ConfigurationError(f"a local function named {tool_name!r} is already registered")
        check_annotations(annotations, tool_name)
        owner = f"function {tool_name!r}"
        domain = check_domain(domain, owner)
        if keys is not None and not callable(keys):
            raise ConfigurationError(f"keys for {owner} must be a function of the arguments, got {keys!r}")
        key_function = check_key_functions({tool_name: keys} if keys is not None else None, domain, owner)
        impl = FunctionTool(fn, threads=self._threads)
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
            domain=domain,
            key_function=key_function.get(tool_name),
        )
        self._catalog.put([(entry, impl)])
        return self._entry(None, tool_name)

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
        self._check_not_closed()
        idempotency = self._check_idempotency(name, idempotency)
        overrides = self._check_server(name, max_concurrency, overrides)
        limit, online = self._server_limit_setting(name, max_concurrency, trusted)
        server = self._servers.reserve(
            name,
            trusted=trusted,
            overrides=overrides,
            on_change=on_definition_change,
            domain=domain,
            keys=keys,
            review_new_tools=review_new_tools,
            online=online,
            filled=_filled(idempotency),
        )
        self._executor.gate.set_server_limit(name, limit)
        self._executor.set_idempotency(name, idempotency)
        try:
            await self._servers.add_client(server, client)
        except BaseException:
            self._servers.release(server)
            self._executor.gate.set_server_limit(name, None)
            self._online.pop(name, None)
            self._executor.set_idempotency(name, None)
            raise
        return self._server_entries(name)

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
        self._check_open()
        overrides = self._check_server(name, max_concurrency, overrides)
        limit, online = self._server_limit_setting(name, max_concurrency, trusted)
        check_target(target)
        if mode not in ("auto", "legacy"):
            raise ConfigurationError(f"mode must be 'auto' or 'legacy', got {mode!r}")
        if mode != "auto" and callable(target) and not isinstance(target, str):
            raise ConfigurationError("mode cannot be set for a client factory: pass mode=... to the Client it builds")
        connect_timeout = checks.seconds("connect_timeout", connect_timeout, none="no bound")
        policy = check_reconnect(reconnect)
        self._check_task_timeout(task_timeout)
        idempotency = self._check_idempotency(name, idempotency)
        idle_timeout = checks.seconds("idle_timeout", idle_timeout, none="no idle bound")
        max_answer_bytes = checks.whole("max_answer_bytes", max_answer_bytes, minimum=1024, none="no limit")
        server = self._servers.reserve(
            name,
            trusted=trusted,
            overrides=overrides,
            on_change=on_definition_change,
            domain=domain,
            keys=keys,
            review_new_tools=review_new_tools,
            online=online,
            filled=_filled(idempotency),
        )
        connection = self._servers.connection(
            server,
            target,
            mode=mode,
            follow=follow_changes,
            timeout=connect_timeout,
            policy=policy,
            max_answer_bytes=max_answer_bytes,
            task_timeout=task_timeout,
            idle_timeout=idle_timeout,
        )
        self._executor.gate.set_server_limit(name, limit)
        self._executor.set_idempotency(name, idempotency)
        assert self._tg is not None
        try:
            await self._tg.start(connection.run)
        except BaseException as exc:
            self._servers.release(server)
            self._executor.gate.set_server_limit(name, None)
            self._online.pop(name, None)
            self._executor.set_idempotency(name, None)
            cause = _innermost(exc)
            if isinstance(cause, ConfigurationError):
                raise cause from None  # the caller's mistake, found in the listing
            if isinstance(exc, Exception):
                raise ServerConnectionError(f"could not connect to server {name!r}: {_describe(exc)}") from exc
            raise
        return self._server_entries(name)

    def _check_idempotency(self, name: str, idempotency: object) -> IdempotencyKeys | None:
        keys = _check_idempotency(idempotency)
        # A fleet coordinator that fences the server says where its token goes: a key sent in the same
        # place would be overwritten by the token, and the server could not deduplicate the retries.
        fencing = getattr(self._coordinator, "fencing", None)
        if keys is None or fencing is None:
            return keys
        argument, meta = fencing(name)
        if (keys.argument is not None and keys.argument == argument) or (keys.meta is not None and keys.meta == meta):
            where = f"argument {argument!r}" if keys.argument is not None else f"_meta entry {meta!r}"
            raise ConfigurationError(
                f"server {name!r} takes its idempotency key and its fleet fencing token in the same {where}: "
                "the token would overwrite the key; give IdempotencyKeys and FleetServer different names"
            )
        return keys

    def _check_task_timeout(self, task_timeout: object) -> None:
        task_timeout = checks.seconds("task_timeout", task_timeout, none="the call timeout alone")
        if task_timeout is None:
            return
        if self._call_timeout is not None and task_timeout > self._call_timeout:
            raise ConfigurationError(
                f"task_timeout={task_timeout}s exceeds the dispatcher's call_timeout={self._call_timeout}s, "
                "which caps every call, tasks included: raise Dispatcher(call_timeout=...) or set it to None"
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
        try:
            await self._servers.refresh(name)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise ServerConnectionError(f"could not list the tools of server {name!r}: {_describe(exc)}") from exc
        return self._server_entries(name)

    def pending_changes(self, server: str | None = None) -> list[DefinitionChange]:
        """The tools blocked because their definition changed since it was approved, or because they are new.

        Args:
            server: Only this server's changes; None for every server's.

        Raises:
            ConfigurationError: No server has this name.
        """
        return self._servers.pending(server)

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
        return self._servers.accept(server, tool)

    def export_pins(self) -> dict[str, dict[str, str]]:
        """The approved definition hash of every tool seen, as ``{server: {tool: "sha256:..."}}``.

        Save it (it is plain JSON) and pass it to `import_pins` in a later run, so that definitions
        that changed between runs are blocked too, and tools added between runs are reviewed. Tools
        still awaiting review are left out; a server listed with none approved maps to ``{}``.
        """
        return self._servers.pins.export()

    def import_pins(self, pins: Mapping[str, Mapping[str, str]]) -> None:
        """Load approvals saved with `export_pins`, replacing the pins of the servers they name.

        Import before registering servers: a tool whose definition differs from its imported pin is
        blocked when first listed, and so is a tool the imported pins of its server do not name (a new
        tool: for an untrusted server, or a trusted one with ``review_new_tools``). Tools already
        listed are checked against the imported pins at once.

        Raises:
            ConfigurationError: `pins` is not in the form `export_pins` returns.
        """
        self._servers.load_pins(pins)

    def _check_server(
        self, name: str, max_concurrency: object, overrides: Mapping[str, ToolAnnotations] | None
    ) -> dict[str, ToolAnnotations]:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a server needs a non-empty name, got {name!r}")
        if name in self._catalog.servers or name in self._servers:
            raise ConfigurationError(f"a server named {name!r} is already registered")
        check_limit(max_concurrency, name)
        return dict(overrides or {})

    def _server_limit_setting(
        self, name: str, max_concurrency: object, trusted: bool
    ) -> tuple[int | None, OnlineLimit | None]:
        """The gate's limit for a server and, for an adaptive one, its `OnlineLimit` (registered here)."""
        setting = check_limit(max_concurrency, name)
        if not isinstance(setting, AdaptiveLimit):
            return setting, None
        online = self._online[name] = OnlineLimit(
            name,
            setting,
            trusted=trusted,
            apply=functools.partial(self._executor.gate.set_server_limit, name),
            waiting=functools.partial(self._executor.gate.server_waiting, name),
            call_timeout=self._call_timeout,
            coordinator=self._coordinator,
        )
        return online.limit, online

    def server_limit(self, name: str) -> int | None:
        """The most calls in flight on a server now: its `max_concurrency`, where an adaptive one is now, or None.

        Raises:
            ConfigurationError: No server has this name.
        """
        if name not in self._catalog.servers:
            known = ", ".join(sorted(self._catalog.servers)) or "none"
            raise ConfigurationError(f"no MCP server named {name!r} (servers: {known})")
        online = self._online.get(name)
        return online.limit if online is not None else self._executor.gate.server_limit(name)

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
        fail_fast: bool | None = None,
    ) -> Batch:
        """Start an incremental batch: submit calls one by one, as they arrive.

        ``approve``, ``approval``, ``guard`` and ``fail_fast`` replace the dispatcher's own for this
        batch (see `dispatch`).
        """
        self._check_open()
        fail = _check_fail_fast(fail_fast, default=self._fail_fast)
        return Batch(self._executor, self._batch_hooks(approve, approval, guard), fail_fast=fail)

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
        fail = _check_fail_fast(fail_fast, default=self._fail_fast)
        batch = Batch(self._executor, self._batch_hooks(approve, approval, guard), fail_fast=fail)
        await self._executor.submit_yielding(batch, batch._accept(calls))
        return await batch.wait()

    def _batch_hooks(
        self, approve: Approver | None, approval: ApprovalPolicy | None, guard: SessionGuard | None
    ) -> CallHooks | None:
        (approval if isinstance(approval, ApprovalPolicy) else self._approval).check(self._catalog)
        hooks = self._hooks
        if approve is not None or approval is not None or guard is not None:
            _check_approvals(approve, approval, guard)
            hooks = CallHooks(
                approver=approve if approve is not None else self._approve,
                policy=approval if approval is not None else self._approval,
                guard=guard if guard is not None else self._guard,
                observer=self._observer,
                person=self._person,
            )
        if hooks is not None and hooks.guard is not None:
            hooks.submitted(self._catalog.shown())
        return hooks

    def _check_open(self) -> None:
        self._executor.check_open()

    def _check_not_closed(self) -> None:
        if self._tg is not None:
            self._executor.check_open()  # entered once: registering is only for while it is open


def _filled(keys: IdempotencyKeys | None) -> frozenset[str]:
    """The arguments of a server's calls that the dispatcher fills in: its idempotency key's, if any."""
    return frozenset() if keys is None or keys.argument is None else frozenset({keys.argument})


def _check_idempotency(value: object) -> IdempotencyKeys | None:
    if value is not None and not isinstance(value, IdempotencyKeys):
        raise ConfigurationError(
            f"idempotency must be an IdempotencyKeys (how the server takes a key) or None, got {type(value).__name__}"
        )
    return value


def _check_fail_fast(value: object, *, default: bool) -> bool:
    return default if value is None else checks.flag("fail_fast", value)


def _check_approvals(approve: object, approval: object, guard: object) -> None:
    if approve is not None and not callable(approve):
        raise ConfigurationError(
            f"approve must be an async callable taking an ApprovalRequest and returning a bool, got {approve!r}"
        )
    if approval is not None and not isinstance(approval, ApprovalPolicy):
        raise ConfigurationError(f"approval must be an ApprovalPolicy, got {type(approval).__name__}")
    if guard is not None and not isinstance(guard, SessionGuard):
        raise ConfigurationError(f"guard must be a SessionGuard, got {type(guard).__name__}")
