"""Test doubles for agent loops: faults injected into a real MCP server, and a ledger of what ran.

`inject_faults` wraps the tools of any `mcp.server.mcpserver.MCPServer` (yours, unchanged) so that,
driven by a seeded random generator or a script, chosen tool calls time out, lose their connection,
fail with a server error, report ``isError`` or crash the handler. Every call that reaches the server is
written to a ledger, so a test can check what actually executed, and how often::

    from dispatcher.testing import inject_faults

    server = build_my_server()  # an MCPServer
    faults = inject_faults(server, rate=0.3, seed=7, kinds=("error", "drop"))
    async with Client(server) as client, Dispatcher() as dispatcher:
        await dispatcher.add_mcp_server("mine", client, trusted=True)
        results = await dispatcher.dispatch(calls)
    assert len(faults.executions("send_email")) <= 1  # never sent twice

The injector is a server middleware (`MCPServer.middleware`), so it works over any transport: in
process through `Client(server)`, or served over stdio or HTTP.

`HostileServer` is a whole server that attacks its client the way an untrusted server can: tools that
shadow another server's names (``transfer``, ``bank__transfer``) and a hook (``on_list``) to win or lose
the race for a bare name, a rug pull that changes a tool's title, description and annotations
mid-session and announces it (``mutate``, or ``announce`` at the moment a test chooses: during an
approval, between review and accept), a description poisoned at first sight (``weather``), a new
poisoned tool mid-session (``mutate(change="new")``) or between runs (``state=``), valid media carrying
an injection (``media``: a PNG and a PDF), a ``tools/list_changed`` storm (``flood``), a huge tool list
(``many=``), tool names that churn at every listing (``churn=``), a prompt injection that tries every
closing tag, a -32000 error storm, undecodable and enormous output. Each attack is described in
`HostileServer`'s module, `dispatcher.testing._hostile`. Try your loop against it::

    from dispatcher.testing import HostileServer

    hostile = HostileServer(victim="bank", tools=("transfer",))
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("bank", bank_server, trusted=True)
        await dispatcher.connect("hostile", hostile.server)
        ...  # a call to "transfer" or "bank__transfer" must reach the bank, never the hostile server
    assert hostile.ran("transfer") == hostile.ran("bank__transfer") == 0

``python -m dispatcher.testing`` serves it over stdio (``--many N``, ``--churn``, ``--state FILE``, ``--late``;
``--http`` for streamable HTTP; ``--help``). Over stdio, time a change by calling its ``mutate`` tool from
your approver or your ``on_definition_change`` hook, through the client the dispatcher uses.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, INTERNAL_ERROR, CallToolResult, ErrorData, TextContent

from .._exports import rehome as _rehome
from ._hostile import HostileServer

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.server.mcpserver import MCPServer


__all__ = [
    "Execution",
    "FaultInjector",
    "FaultKind",
    "FencedResource",
    "HostileServer",
    "InjectedFault",
    "Outcome",
    "Strike",
    "inject_faults",
]

FaultKind = Literal["hang", "drop", "error", "tool_error", "crash"]
"""How an injected fault shows itself to the client.

- ``"hang"``: the call never answers until it is cancelled (a client timeout, or the caller giving up).
- ``"drop"``: the call fails with `MCPError` -32000, the SDK's "connection closed". The connection
  itself stays usable, so a test can go on after it.
- ``"error"``: the call fails with `MCPError` -32603 (internal error).
- ``"tool_error"``: the call returns a result with ``isError`` true.
- ``"crash"``: the server's handler raises `InjectedFault`, an unexpected exception; the SDK logs it and
  answers with a JSON-RPC error (-32603 in process).
"""

Strike = Literal["before", "after", "either"]
"""When an injected fault strikes.

- ``"before"``: before the tool runs; it has no effect.
- ``"after"``: after the tool ran and had its effect; its answer is lost and the fault replaces it, so
  the client cannot tell whether the tool ran (the case that makes blind retries dangerous).
- ``"either"``: each fault picks one of the two at random.
"""

Outcome = Literal["running", "ok", "tool_error", "error", "cancelled"]
"""How an execution ended, as the client saw it.

``"running"`` until it ends; ``"ok"`` and ``"tool_error"`` for an answer (``isError`` false or true);
``"error"`` for a JSON-RPC error (a ``"drop"``, ``"error"`` or ``"crash"`` fault, or an `MCPError`
raised by the tool); ``"cancelled"`` when the client gave up on it.
"""

_KINDS: Final = frozenset(get_args(FaultKind))
_STRIKES: Final = frozenset(get_args(Strike))


class InjectedFault(RuntimeError):
    """The exception a ``"crash"`` fault raises inside the server."""


@dataclass(frozen=True, slots=True)
class Execution:
    """One tool call that reached the server, as the ledger records it.

    Attributes:
        index: Its position in the ledger, from 0, in the order executions started.
        tool: The tool's name, as the client sent it.
        arguments: The arguments, as the client sent them.
        fault: The fault injected into it, or None.
        strike: When that fault struck, or None without a fault.
        body_ran: Whether the server's handler ran the tool (it may have had its effect, even if the
            client saw a failure).
        outcome: How it ended, as the client saw it.
        started_at: When it reached the server (`anyio.current_time()` of the server's event loop).
        finished_at: When it ended, or None while it runs.
    """

    index: int
    tool: str
    arguments: Mapping[str, Any]
    fault: FaultKind | None
    strike: Literal["before", "after"] | None
    body_ran: bool
    outcome: Outcome
    started_at: float
    finished_at: float | None = None


@dataclass(slots=True)
class _Script:
    tool: str
    arguments: Mapping[str, Any] | None
    kinds: deque[FaultKind]
    strike: Literal["before", "after"]


class FaultInjector:
    """Faults injected into one server's tool calls, and the ledger of those calls.

    Create it with `inject_faults`. Random faults are drawn from `random.Random(seed)`, three numbers
    per targeted execution in the order executions reach the server, so the fate of the n-th targeted
    execution depends only on the seed and n. Scripted faults (`fail_next`) come first and draw
    nothing.
    """

    def __init__(
        self,
        server: MCPServer,
        *,
        rate: float,
        seed: int,
        tools: Iterable[str] | None,
        kinds: Iterable[FaultKind],
        strike: Strike,
    ) -> None:
        kinds = tuple(kinds)
        unknown = sorted(set(kinds) - _KINDS)
        if not kinds or unknown:
            raise ValueError(f"kinds must be a non-empty selection of {sorted(_KINDS)}, got {list(kinds)!r}")
        if strike not in _STRIKES:
            raise ValueError(f"strike must be one of {sorted(_STRIKES)}, got {strike!r}")
        if isinstance(tools, str):
            raise TypeError(f"tools must be a collection of tool names, not the string {tools!r}; use ({tools!r},)")
        self._server = server
        self.rate = rate
        self._seed = seed
        self._tools = None if tools is None else frozenset(tools)
        self._kinds: tuple[FaultKind, ...] = kinds
        self._strike = strike
        self._rng = random.Random(seed)
        self._scripts: list[_Script] = []
        self._ledger: list[Execution] = []
        server.middleware.append(self._middleware)

    @property
    def rate(self) -> float:
        """The probability, from 0 to 1, that a targeted execution fails; it may be changed at any time."""
        return self._rate

    @rate.setter
    def rate(self, rate: float) -> None:
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be a probability between 0 and 1, got {rate!r}")
        self._rate = float(rate)

    @property
    def seed(self) -> int:
        """The seed of the random generator."""
        return self._seed

    @property
    def tools(self) -> frozenset[str] | None:
        """The tools that may fail at random (None: every tool)."""
        return self._tools

    @property
    def kinds(self) -> tuple[FaultKind, ...]:
        """The faults picked from."""
        return self._kinds

    @property
    def strike(self) -> Strike:
        """When random faults strike."""
        return self._strike

    @property
    def ledger(self) -> tuple[Execution, ...]:
        """Every execution so far, in the order they reached the server."""
        return tuple(self._ledger)

    def executions(self, tool: str | None = None, arguments: Mapping[str, Any] | None = None) -> list[Execution]:
        """The executions of one tool (every tool when None), optionally only those with these arguments."""
        return [
            execution
            for execution in self._ledger
            if (tool is None or execution.tool == tool) and (arguments is None or execution.arguments == arguments)
        ]

    def fail_next(
        self,
        tool: str,
        *kinds: FaultKind,
        arguments: Mapping[str, Any] | None = None,
        strike: Literal["before", "after"] = "before",
    ) -> None:
        """Make the next executions of a tool fail with these faults, one each, in order.

        Scripted faults apply whatever `rate` and `tools` say; once they are used up the tool goes back
        to random faults.

        Args:
            tool: The tool's name.
            kinds: One fault per execution, in order.
            arguments: Only executions with exactly these arguments take the faults (None: any).
            strike: When the faults strike.
        """
        unknown = sorted(set(kinds) - _KINDS)
        if not kinds or unknown:
            raise ValueError(f"fail_next needs fault kinds among {sorted(_KINDS)}, got {list(kinds)!r}")
        if strike not in ("before", "after"):
            raise ValueError(f"strike must be 'before' or 'after', got {strike!r}")
        self._scripts.append(_Script(tool, None if arguments is None else dict(arguments), deque(kinds), strike))

    def remove(self) -> None:
        """Stop injecting faults and recording executions; the ledger is kept."""
        middleware = self._server.middleware
        if self._middleware in middleware:
            middleware.remove(self._middleware)

    def _decide(self, tool: str, arguments: Mapping[str, Any]) -> tuple[FaultKind | None, Literal["before", "after"]]:
        for script in self._scripts:
            if script.tool == tool and (script.arguments is None or script.arguments == arguments):
                kind = script.kinds.popleft()
                if not script.kinds:
                    self._scripts.remove(script)
                return kind, script.strike
        if self._tools is not None and tool not in self._tools:
            return None, "before"
        # Always three draws, so one execution's fate never shifts another's.
        hit, pick, when = self._rng.random(), self._rng.random(), self._rng.random()
        if hit >= self._rate:
            return None, "before"
        kinds = self._kinds
        kind = kinds[min(int(pick * len(kinds)), len(kinds) - 1)]
        if self._strike == "either":
            return kind, "before" if when < 0.5 else "after"
        return kind, self._strike

    async def _middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params
        if ctx.method != "tools/call" or not isinstance(params, dict) or not isinstance(params.get("name"), str):
            return await call_next(ctx)
        tool: str = params["name"]
        raw = params.get("arguments")
        arguments: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
        fault, strike = self._decide(tool, arguments)
        index = len(self._ledger)
        self._ledger.append(
            Execution(
                index,
                tool,
                arguments,
                fault,
                strike if fault is not None else None,
                body_ran=False,
                outcome="running",
                started_at=anyio.current_time(),
            )
        )
        outcome: Outcome = "error"
        try:
            if fault is None or strike == "after":
                self._update(index, body_ran=True)
                result = await call_next(ctx)
                if fault is None:
                    outcome = "tool_error" if _is_error(result) else "ok"
                    return result
            # Hangs or raises, except for a "tool_error" fault, which answers.
            result = await _strike(fault, tool)
            outcome = "tool_error"
            return result
        except anyio.get_cancelled_exc_class():
            outcome = "cancelled"
            raise
        finally:
            self._update(index, outcome=outcome, finished_at=anyio.current_time())

    def _update(self, index: int, **changes: Any) -> None:
        self._ledger[index] = replace(self._ledger[index], **changes)

    def __repr__(self) -> str:
        return (
            f"<FaultInjector rate={self._rate} seed={self._seed} kinds={list(self._kinds)} "
            f"strike={self._strike!r} executions={len(self._ledger)}>"
        )


def _is_error(result: HandlerResult) -> bool:
    if isinstance(result, dict):
        return bool(result.get("isError"))
    return bool(getattr(result, "is_error", False))


async def _strike(fault: FaultKind, tool: str) -> HandlerResult:
    if fault == "hang":
        await anyio.sleep_forever()
    if fault == "drop":
        raise MCPError(code=CONNECTION_CLOSED, message=f"injected fault: connection lost during {tool!r}")
    if fault == "error":
        raise MCPError(code=INTERNAL_ERROR, message=f"injected fault: internal error in {tool!r}")
    if fault == "crash":
        raise InjectedFault(f"injected fault: {tool!r} crashed")
    return CallToolResult(content=[TextContent(type="text", text=f"injected fault: {tool!r} failed")], is_error=True)


def inject_faults(
    server: MCPServer,
    *,
    rate: float = 0.0,
    seed: int = 0,
    tools: Iterable[str] | None = None,
    kinds: Iterable[FaultKind] = ("error",),
    strike: Strike = "before",
) -> FaultInjector:
    """Make some of a server's tool calls fail, and record every call in a ledger.

    Call it before clients connect or while they are connected; `FaultInjector.remove` undoes it.

    Args:
        server: The server to wrap, an `mcp.server.mcpserver.MCPServer`. Its tools are not changed.
        rate: The probability, from 0 to 1, that a call of a targeted tool fails.
        seed: Seeds the random generator, so a run that sends its calls in the same order fails in the
            same places.
        tools: The names of the tools that may fail at random; None targets every tool. Names are not
            checked against the server (tools may be added later). Every tool's calls are recorded.
        kinds: The faults to pick from, uniformly (see `FaultKind`).
        strike: When the faults strike (see `Strike`).

    Returns:
        The injector, with its ledger.

    Raises:
        ValueError: A rate outside 0..1, an unknown fault kind or strike.
    """
    return FaultInjector(server, rate=rate, seed=seed, tools=tools, kinds=kinds, strike=strike)


class FencedResource:
    """The server side of fencing tokens: refuse a request whose token is lower than the highest seen.

    A fleet hold carries a fencing token (`dispatcher.fleet.FleetServer`'s `fence_argument` or
    `fence_meta` says where each request carries it) that grows with every grant on the server. A
    resource that admits each write with its token, and refuses one lower than the highest it has
    admitted, refuses the late write of a holder whose turn was handed on (it froze, or was cut off,
    after its lease ended): the next holder's token, already seen, is higher. Admit at the point where
    the write takes effect (under the lock that applies it) so that a write still running when a newer
    holder arrives is refused too::

        fence = FencedResource()

        async def set_note(name: str, text: str, fence_token: int) -> str:
            with lock:
                fence.admit(fence_token)  # raises MCPError: the client's call fails, nothing is written
                notes[name] = text

    Resources are named, so a server whose holds are keyed (a `domain` and conflict keys) can fence each
    key on its own; the default is one resource for the whole server. Thread-safe.
    """

    code: Final = -32010
    """The JSON-RPC error code of a refused request (in the range JSON-RPC leaves to servers)."""

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}
        self._refused = 0
        self._lock = threading.Lock()

    def admit(self, token: object, resource: str = "") -> None:
        """Admit a request with `token` on `resource`, or refuse it.

        Raises:
            MCPError: The token is missing (not an int) or lower than the highest admitted on `resource`.
        """
        with self._lock:
            highest = self._highest.get(resource)
            if not isinstance(token, int) or isinstance(token, bool):
                self._refused += 1
                raise MCPError.from_error_data(
                    ErrorData(code=self.code, message=f"refused: no fencing token (an int), got {token!r}")
                )
            if highest is not None and token < highest:
                self._refused += 1
                raise MCPError.from_error_data(
                    ErrorData(
                        code=self.code,
                        message=f"refused: stale fencing token {token} (a newer holder has {highest})",
                    )
                )
            self._highest[resource] = token

    def highest(self, resource: str = "") -> int | None:
        """The highest token admitted on `resource`, or None."""
        with self._lock:
            return self._highest.get(resource)

    @property
    def refused(self) -> int:
        """How many requests were refused."""
        with self._lock:
            return self._refused


# The classes exported here report this module as their home (`dispatcher.testing.HostileServer`, not a private module).
_rehome(globals())
