"""The workspace: a small MCP server with honest annotations and knobs for latency, load and faults.

The server keeps notes, fetches web pages and sends messages: its tools, and the annotations they
declare, are described in `dispatcher.examples._tools`.

Faults are injected by `dispatcher.testing.inject_faults`, the package's one fault injector, installed
on the workspace's server when `Workspace(faults=FaultConfig(...))` asks for them: a fault strikes
before the tool runs, so the notes and the outbox are left unchanged, and `Workspace.faults` is the
injector, with its ledger of every call and the fault it got.

Every tool execution that gets past the injector runs through one gate that models the server's costs:

1. It is numbered and recorded in the workspace's ledger as running, with the executions already running.
2. It sleeps for its latency (`anyio.sleep`, so virtual clocks drive it), stretched by saturation.
3. The effect is applied atomically and the result returned.
4. The ledger entry is completed with the end time and the outcome, even on cancellation.

The tool list can change while clients are connected, as real servers' lists do: `set_annotations`,
`set_description`, `remove_tool` and `restore_tool` change what `tools/list` returns, and
`notify_tools_changed` tells every connected client (on 2026-07-28 connections through
`subscriptions/listen`, on legacy ones with `notifications/tools/list_changed`).
"""

from __future__ import annotations

import contextvars
import inspect
import math
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from dispatcher.testing import FaultInjector, FencedResource, Outcome, inject_faults

from ._ledger import KEY, ToolRun, replay
from ._loops import LoopAwareBus, on_loop, root_logger_kept
from ._models import RATE_LIMITED, FaultConfig, check_latency, saturated_latency
from ._tools import ANNOTATIONS, NOTE_NAME, NOTE_SUFFIX, check_note_name, check_tool_names, simulated_page

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable, Mapping

    from anyio.lowlevel import EventLoopToken
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.server.session import ServerSession
    from mcp.types import ToolAnnotations

_FENCE_TOKEN: contextvars.ContextVar[object] = contextvars.ContextVar("_FENCE_TOKEN")
"""The fencing token of the write this task runs (fenced mode), set by `Workspace._check_fence`."""


class Workspace:
    """An example MCP server and the state behind it, for tests, demos and benchmarks.

    Connect to `server` with the SDK (`mcp.Client(workspace.server)` in-process, or serve it over
    HTTP with `serve_http`), then read what happened from the ledger. The state is guarded by a
    lock, so it stays consistent when the server runs on another thread (as `serve_http` does).

    Args:
        root: A folder to mirror the notes to, one `<name>.txt` file each; notes already there are
            loaded. `None` keeps the notes in memory only.
        latency: Seconds every tool execution takes on an idle server.
        latency_by_tool: Per-tool latencies that replace `latency` for the named tools.
        saturation: The number of concurrent executions at which the server saturates (see
            `saturated_latency`); `None` never saturates.
        faults: Which calls fail on purpose (through `dispatcher.testing.inject_faults`); `None` injects
            no faults.
        name: The server name announced to clients.
        fence: The `_meta` entry in which each write carries its fleet hold's fencing token (what
            `FleetServer(fence_meta=...)` declares): the fenced mode. A write whose token is missing or
            lower than the highest seen is refused with a JSON-RPC error (`FencedResource.code`),
            checked as it arrives and again where it takes effect, so the late write of a holder whose
            turn was handed on changes nothing. `fenced` counts the refusals. The whole workspace is
            one resource, which fits a fleet whose writes hold the whole server (no conflict keys);
            writes held per key overlap, and would refuse each other. None: no fencing.
        collapse: How much goodput falls past `saturation` (see `saturated_latency`); 0 keeps it flat.
            `saturation` and `collapse` can be changed while the server runs (`Workspace.saturation`).
        rate_limit: A token bucket in front of every tool: this many calls per second on average,
            `rate_burst` at once; a call that finds the bucket empty is answered at once with a
            JSON-RPC error `RATE_LIMITED` ("rate limit exceeded: retry after ... s", its data
            ``{"retryAfter": seconds}`` until the next token) and never runs. None: no rate limit.
        rate_burst: The bucket's size (calls that may go through at once after a quiet spell).
        idempotency_key: The name of an argument through which the tools that may mutate take an
            idempotency key (declare it to the dispatcher with ``IdempotencyKeys(argument=...)``):
            the workspace remembers each key with the first outcome of its call and answers a
            repeated key with that outcome, applying nothing again. None (the default): no keys.
        uncancellable: Whether every call runs to its end even when its client cancels it or goes away
            (as a database transaction or a build would), for tests of writes that outlive their caller:
            the ledger then shows how long an abandoned write went on.

    Raises:
        ValueError: A knob is out of range or names a tool the workspace does not have.

    Example:
        ```python
        workspace = Workspace(latency=0.05, saturation=4)
        async with mcp.Client(workspace.server) as client:
            await client.call_tool("set_note", {"name": "todo", "text": "ship it"})
        assert workspace.notes == {"todo": "ship it"}
        ```
    """

    tool_names: ClassVar[tuple[str, ...]] = tuple(ANNOTATIONS)
    """The names of the workspace's tools."""

    def __init__(
        self,
        *,
        root: pathlib.Path | None = None,
        latency: float = 0.0,
        latency_by_tool: Mapping[str, float] | None = None,
        saturation: int | None = None,
        faults: FaultConfig | None = None,
        name: str = "workspace",
        fence: str | None = None,
        idempotency_key: str | None = None,
        collapse: float = 0.0,
        rate_limit: float | None = None,
        rate_burst: int = 1,
        uncancellable: bool = False,
    ) -> None:
        check_latency("latency", latency)
        if not (math.isfinite(collapse) and collapse >= 0):
            raise ValueError(f"collapse must be a finite number >= 0, got {collapse!r}")
        if rate_limit is not None and not (math.isfinite(rate_limit) and rate_limit > 0):
            raise ValueError(f"rate_limit must be a positive number of calls per second, got {rate_limit!r}")
        if not isinstance(rate_burst, int) or rate_burst < 1:
            raise ValueError(f"rate_burst must be an int >= 1, got {rate_burst!r}")
        self._uncancellable = uncancellable
        if fence is not None and (not isinstance(fence, str) or not fence):
            raise ValueError(f"fence must be the name of a _meta entry, got {fence!r}; use None for no fencing")
        self._fence_meta = fence
        self.fenced = FencedResource() if fence is not None else None
        """The fenced mode's resource (the whole workspace): its `highest` token and `refused` count."""
        latency_by_tool = dict(latency_by_tool or {})
        check_tool_names("latency_by_tool", latency_by_tool)
        for tool, seconds in latency_by_tool.items():
            check_latency(f"latency_by_tool[{tool!r}]", seconds)
        if saturation is not None and saturation < 1:
            raise ValueError(f"saturation must be >= 1, got {saturation}; use None for no saturation")
        if faults is not None and faults.tools is not None:
            check_tool_names("faults.tools", faults.tools)

        self._root = root
        self._latency = latency
        self._latency_by_tool = latency_by_tool
        self._saturation = saturation
        self._collapse = collapse
        self._rate = rate_limit
        self._burst = rate_burst
        # The token bucket: its tokens and when they were counted (None: not yet, it starts full).
        self._tokens = float(rate_burst)
        self._counted: float | None = None
        self.rate_limited = 0
        """Calls answered with `RATE_LIMITED` so far."""
        self._lock = threading.Lock()
        self._ledger: list[ToolRun] = []
        self._running: set[int] = set()
        self._max_in_flight = 0
        self._notes: dict[str, str] = {}
        self._outbox: list[tuple[str, str]] = []
        if root is not None:
            self._load(root)
        self._annotations: dict[str, ToolAnnotations | None] = dict(ANNOTATIONS)
        self._descriptions: dict[str, str | None] = dict.fromkeys(ANNOTATIONS)
        self._removed: set[str] = set()
        self._bus = LoopAwareBus()
        self._key_argument = idempotency_key
        # The first outcome (a result text or the error raised) of each idempotency key, and how
        # many times each key's effect was applied (once, for a server that honours keys).
        self._answers: dict[str, str | Exception] = {}
        self._applied: dict[str, int] = {}
        self._legacy_clients: list[tuple[ServerSession, EventLoopToken]] = []
        self.server: MCPServer[Any] = self._build_server(name)
        """The MCP server, to pass to `mcp.Client` or `serve_http`."""
        self.faults: FaultInjector | None = None
        """The fault injector on `server` when `faults` was given, with its ledger of every call."""
        if faults is not None:
            self.faults = inject_faults(
                self.server,
                rate=faults.rate,
                seed=faults.seed,
                tools=faults.tools,
                kinds=faults.kinds,
                strike=faults.strike,
            )

    @property
    def saturation(self) -> int | None:
        """The concurrency at which the server saturates now; set it to change the server's capacity mid-run."""
        return self._saturation

    @saturation.setter
    def saturation(self, value: int | None) -> None:
        if value is not None and value < 1:
            raise ValueError(f"saturation must be >= 1, got {value}; use None for no saturation")
        with self._lock:
            self._saturation = value

    # -- what happened -------------------------------------------------------------------------

    @property
    def ledger(self) -> tuple[ToolRun, ...]:
        """Every tool execution so far, in the order they started."""
        with self._lock:
            return tuple(self._ledger)

    @property
    def in_flight(self) -> int:
        """The number of tool executions running now."""
        with self._lock:
            return len(self._running)

    @property
    def max_in_flight(self) -> int:
        """The largest number of tool executions that have run at the same time."""
        with self._lock:
            return self._max_in_flight

    @property
    def applied_by_key(self) -> dict[str, int]:
        """How many times the effect of each idempotency key was applied (1 each, when keys are honoured)."""
        with self._lock:
            return dict(self._applied)

    @property
    def notes(self) -> dict[str, str]:
        """A copy of the notes, by name."""
        with self._lock:
            return dict(self._notes)

    @property
    def outbox(self) -> tuple[tuple[str, str], ...]:
        """Every message `send_message` sent, as `(to, text)` pairs in the order they were sent."""
        with self._lock:
            return tuple(self._outbox)

    @property
    def offered_tools(self) -> tuple[str, ...]:
        """The names of the tools `tools/list` returns now, in the order of `tool_names`."""
        with self._lock:
            return tuple(name for name in self.tool_names if name not in self._removed)

    # -- changing the tool list ----------------------------------------------------------------

    def set_annotations(self, tool: str, annotations: ToolAnnotations | None) -> None:
        """Change the annotations a tool declares from now on (`None`: declare none).

        Clients see the new definition the next time they list tools; call `notify_tools_changed`
        to tell them it changed. The tool's behaviour stays the same: this is how a server lies.
        """
        check_tool_names("set_annotations", frozenset({tool}))
        with self._lock:
            self._annotations[tool] = annotations
            self._register_tools(self.server)

    def set_description(self, tool: str, description: str | None) -> None:
        """Change the description a tool declares from now on (`None`: back to its docstring)."""
        check_tool_names("set_description", frozenset({tool}))
        with self._lock:
            self._descriptions[tool] = description
            self._register_tools(self.server)

    def remove_tool(self, tool: str) -> None:
        """Stop offering a tool: it leaves `tools/list`, and calling it is an unknown-tool error."""
        check_tool_names("remove_tool", frozenset({tool}))
        with self._lock:
            self._removed.add(tool)
            self._register_tools(self.server)

    def restore_tool(self, tool: str) -> None:
        """Offer a removed tool again, with its current annotations and description."""
        check_tool_names("restore_tool", frozenset({tool}))
        with self._lock:
            self._removed.discard(tool)
            self._register_tools(self.server)

    async def notify_tools_changed(self) -> None:
        """Tell every connected client that the tool list changed.

        Clients on 2026-07-28 connections hear it if they listen (`Client.listen(tools_list_changed=
        True)`); legacy clients get `notifications/tools/list_changed`. The notification is sent on
        the event loop that serves each client, so this works while `serve_http` serves the
        workspace from its own thread. Clients that have gone away are skipped.
        """
        await self._bus.publish(ToolsListChanged())
        with self._lock:
            clients = list(self._legacy_clients)
        for session, token in clients:
            await on_loop(token, session.send_tool_list_changed)

    # -- the tools -----------------------------------------------------------------------------

    def _build_server(self, name: str) -> MCPServer[Any]:
        with root_logger_kept():
            server: MCPServer[Any] = MCPServer(
                name,
                instructions=(
                    "A notes workspace. Notes are plain text addressed by name. fetch_url returns "
                    "untrusted web content; send_message sends text to someone outside the workspace."
                ),
                subscriptions=self._bus,
                middleware=[self._remember_legacy_client, *([self._check_fence] if self._fence_meta else [])],
            )

        async def search_notes(query: str) -> str:
            """List the names of the notes whose name or text contains the query (case-insensitive)."""
            return await self._execute("search_notes", {"query": query}, lambda: self._search(query))

        async def read_note(name: str) -> str:
            """Return the text of a note. Fails if there is no such note."""
            return await self._execute("read_note", {"name": name}, lambda: self._read(name))

        async def create_note(name: str, text: str) -> str:
            """Create a new note. Fails, changing nothing, if a note with that name exists."""
            args = {"name": name, "text": text}
            return await self._execute("create_note", args, lambda: self._create(name, text))

        async def set_note(name: str, text: str) -> str:
            """Create a note or replace its text. Repeating it leaves the same state."""
            args = {"name": name, "text": text}
            return await self._execute("set_note", args, lambda: self._set(name, text))

        async def append_note(name: str, text: str) -> str:
            """Append text to a note as a new line, creating the note if it is missing."""
            args = {"name": name, "text": text}
            return await self._execute("append_note", args, lambda: self._append(name, text))

        async def delete_note(name: str) -> str:
            """Delete a note. Deleting a note that does not exist succeeds and changes nothing."""
            return await self._execute("delete_note", {"name": name}, lambda: self._delete(name))

        async def fetch_url(url: str) -> str:
            """Fetch a web page and return its text. The page is untrusted content."""
            return await self._execute("fetch_url", {"url": url}, lambda: simulated_page(url))

        async def send_message(to: str, text: str) -> str:
            """Send a message to someone outside the workspace. Every call sends another message."""
            args = {"to": to, "text": text}
            return await self._execute("send_message", args, lambda: self._send(to, text))

        tools: tuple[Callable[..., Any], ...] = (
            search_notes,
            read_note,
            create_note,
            set_note,
            append_note,
            delete_note,
            fetch_url,
            send_message,
        )
        self._functions = {tool.__name__: tool for tool in tools}
        self._registered: set[str] = set()
        self._register_tools(server)
        return server

    def _register_tools(self, server: MCPServer[Any]) -> None:
        """Make the server's tools match the current definitions, in the order of `tool_names`."""
        for name in sorted(self._registered):
            server.remove_tool(name)
        self._registered.clear()
        for name in self.tool_names:
            if name in self._removed:
                continue
            function = self._functions[name]
            annotations = self._annotations[name]
            if self._key_argument is not None and not (annotations is not None and annotations.read_only_hint):
                function = self._taking_key(function, self._key_argument)
            server.add_tool(
                function,
                description=self._descriptions[name],
                annotations=annotations,
                # Plain text results: an output schema would add nothing for one string.
                structured_output=False,
            )
            self._registered.add(name)

    def _taking_key(self, function: Callable[..., Any], argument: str) -> Callable[..., Any]:
        """`function` with one more optional argument, `argument`, the call's idempotency key."""
        signature = inspect.signature(function)
        if argument in signature.parameters:
            raise ValueError(f"idempotency_key {argument!r} is already an argument of {function.__name__}")

        async def keyed(**arguments: Any) -> str:
            key = arguments.pop(argument, None)
            if key is not None:
                with self._lock:
                    answer = self._answers.get(key)
                if answer is not None:
                    return replay(answer)
            token = KEY.set(key)
            try:
                result: str = await function(**arguments)
                return result
            finally:
                KEY.reset(token)

        keyed.__name__ = function.__name__
        keyed.__doc__ = function.__doc__
        extra = inspect.Parameter(argument, inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None")
        keyed.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*signature.parameters.values(), extra]
        )
        return keyed

    async def _remember_legacy_client(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware: note each legacy connection, which `notify_tools_changed` must reach by itself.

        A legacy client ends its handshake with `notifications/initialized`, once per connection; its
        session can send notifications on the connection's standalone channel later.
        """
        if ctx.method == "notifications/initialized" and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            with self._lock:
                self._legacy_clients.append((ctx.session, anyio.lowlevel.current_token()))
        return await call_next(ctx)

    async def _check_fence(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware of the fenced mode: refuse a write whose fencing token is missing or stale on arrival.

        The token is kept for the write's task, where `_execute` admits it again as the write takes effect.
        """
        params = ctx.params
        fenced = self.fenced
        if ctx.method != "tools/call" or not isinstance(params, dict) or fenced is None:
            return await call_next(ctx)
        if not self._writes(params.get("name")):
            return await call_next(ctx)
        meta = params.get("_meta")
        token = meta.get(self._fence_meta) if isinstance(meta, dict) else None
        fenced.admit(token)
        reset = _FENCE_TOKEN.set(token)
        try:
            return await call_next(ctx)
        finally:
            _FENCE_TOKEN.reset(reset)

    def _writes(self, tool: object) -> bool:
        annotations = self._annotations.get(tool) if isinstance(tool, str) else None
        return not (annotations is not None and annotations.read_only_hint)

    def _take_token(self) -> None:
        """Spend a token of the rate limit, or raise `RATE_LIMITED` with the wait for the next one (under the lock)."""
        rate = self._rate
        if rate is None:
            return
        now = anyio.current_time()
        if self._counted is not None:
            self._tokens = min(float(self._burst), self._tokens + (now - self._counted) * rate)
        self._counted = now
        if self._tokens >= 1:
            self._tokens -= 1
            return
        self.rate_limited += 1
        wait = round((1 - self._tokens) / rate, 6)
        raise MCPError(RATE_LIMITED, f"rate limit exceeded: retry after {wait} s", {"retryAfter": wait})

    async def _execute(self, tool: str, arguments: dict[str, str], effect: Callable[[], str]) -> str:
        """Run one execution through the gate described in the module docstring."""
        with self._lock:
            self._take_token()
            seq = len(self._ledger)
            running_at_start = frozenset(self._running)
            self._running.add(seq)
            self._max_in_flight = max(self._max_in_flight, len(self._running))
            delay = saturated_latency(
                self._latency_by_tool.get(tool, self._latency), len(self._running), self._saturation, self._collapse
            )
            self._ledger.append(
                ToolRun(
                    seq=seq,
                    tool=tool,
                    arguments=arguments,
                    started=anyio.current_time(),
                    running_at_start=running_at_start,
                )
            )
        outcome: Outcome = "tool_error"
        try:
            # Sleep even for zero latency: the checkpoint lets concurrent calls start and overlap.
            with anyio.CancelScope(shield=self._uncancellable):
                await anyio.sleep(delay)
            key = KEY.get()
            with self._lock:
                if self.fenced is not None and self._writes(tool):
                    # Where the write takes effect: refused if a newer holder was admitted meanwhile.
                    self.fenced.admit(_FENCE_TOKEN.get(None))
                result = effect() if key is None else self._once(key, effect)
        except anyio.get_cancelled_exc_class():
            outcome = "cancelled"
            raise
        except MCPError:
            outcome = "error"
            raise
        else:
            outcome = "ok"
            return result
        finally:
            with self._lock:
                self._running.discard(seq)
                self._ledger[seq] = replace(self._ledger[seq], ended=anyio.current_time(), outcome=outcome)

    # -- the effects, applied under the lock ---------------------------------------------------

    def _once(self, key: str, effect: Callable[[], str]) -> str:
        """Apply a keyed call's effect the first time its key is seen; replay its outcome after that."""
        answer = self._answers.get(key)
        if answer is not None:  # an attempt with the same key got here first, while this one waited
            return replay(answer)
        self._applied[key] = self._applied.get(key, 0) + 1
        try:
            result = effect()
        except Exception as exc:
            self._answers[key] = exc
            raise
        self._answers[key] = result
        return result

    def _search(self, query: str) -> str:
        needle = query.casefold()
        found = sorted(
            name for name, text in self._notes.items() if needle in name.casefold() or needle in text.casefold()
        )
        if not found:
            return f"no notes match {query!r}"
        return "\n".join(found)

    def _read(self, name: str) -> str:
        check_note_name(name)
        try:
            return self._notes[name]
        except KeyError:
            raise ToolError(f"there is no note named {name!r}; search_notes lists the notes") from None

    def _create(self, name: str, text: str) -> str:
        check_note_name(name)
        if name in self._notes:
            raise ToolError(f"a note named {name!r} already exists; use set_note to replace its text")
        self._store(name, text)
        return f"created note {name!r}"

    def _set(self, name: str, text: str) -> str:
        check_note_name(name)
        self._store(name, text)
        return f"set note {name!r}"

    def _append(self, name: str, text: str) -> str:
        check_note_name(name)
        old = self._notes.get(name)
        self._store(name, text if old is None else f"{old}\n{text}")
        return f"appended to note {name!r}"

    def _delete(self, name: str) -> str:
        check_note_name(name)
        if self._notes.pop(name, None) is None:
            return f"note {name!r} did not exist"
        if self._root is not None:
            (self._root / f"{name}{NOTE_SUFFIX}").unlink(missing_ok=True)
        return f"deleted note {name!r}"

    def _send(self, to: str, text: str) -> str:
        if not to.strip():
            raise ToolError("to must name a recipient")
        self._outbox.append((to, text))
        return f"sent message {len(self._outbox)} to {to}"

    def _store(self, name: str, text: str) -> None:
        self._notes[name] = text
        if self._root is not None:
            # Synchronous on purpose: the files are tiny, and a hop to a worker thread would let a
            # virtual clock jump ahead while the write is in progress.
            (self._root / f"{name}{NOTE_SUFFIX}").write_text(text, encoding="utf-8")

    def _load(self, root: pathlib.Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        for path in sorted(root.glob(f"*{NOTE_SUFFIX}")):
            if NOTE_NAME.fullmatch(path.stem):
                self._notes[path.stem] = path.read_text(encoding="utf-8")
