"""A real in-process MCP server whose tools record when they run, for checking scheduling invariants.

Every tool execution records a start and an end on a shared sequence counter, the number of executions
in flight, and whether an exclusive tool ever overlapped anything. Tools can be told to wait on a named
gate (an `anyio.Event`) so that tests control progress with events instead of sleeps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)


@dataclass
class Execution:
    """One execution of a tool, as the server saw it."""

    tool: str
    key: str
    exclusive: bool
    start: int
    end: int | None = None
    cancelled: bool = False
    server: str = ""


@dataclass
class Recorder:
    """What ran, in which order, and with how much overlap; shared by several servers."""

    counter: itertools.count[int] = field(default_factory=itertools.count)
    executions: list[Execution] = field(default_factory=list)
    active: dict[str, Execution] = field(default_factory=dict)
    max_active: int = 0
    max_active_by_server: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    gates: dict[str, anyio.Event] = field(default_factory=dict)
    started: dict[str, anyio.Event] = field(default_factory=dict)

    def gate(self, name: str) -> anyio.Event:
        """The event a tool called with ``hold=name`` waits for."""
        return self.gates.setdefault(name, anyio.Event())

    def started_event(self, key: str) -> anyio.Event:
        """Set when the execution with this key starts."""
        return self.started.setdefault(key, anyio.Event())

    def by_key(self, key: str) -> list[Execution]:
        return [execution for execution in self.executions if execution.key == key]

    def running_on(self, server: str) -> int:
        return sum(1 for execution in self.active.values() if execution.server == server)

    async def run(self, server: str, tool: str, key: str, exclusive: bool, hold: str, steps: int) -> str:
        token = f"{key}#{len(self.executions)}"
        execution = Execution(tool, key, exclusive, next(self.counter), server=server)
        if exclusive and self.active:
            self.violations.append(f"{key} started while {sorted(self.active)} were running")
        if any(other.exclusive for other in self.active.values()):
            self.violations.append(f"{key} started while an exclusive call was running")
        self.executions.append(execution)
        self.active[token] = execution
        self.max_active = max(self.max_active, len(self.active))
        self.max_active_by_server[server] = max(self.max_active_by_server.get(server, 0), self.running_on(server))
        self.started_event(key).set()
        try:
            if hold:
                await self.gate(hold).wait()
            for _ in range(steps):
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            execution.cancelled = True
            raise
        finally:
            del self.active[token]
            execution.end = next(self.counter)
        return f"{tool}:{key}"


def recording_server(recorder: Recorder, name: str = "rec") -> MCPServer:
    """An MCP server with a read-only tool `read`, a mutating `write`, and `fail` (isError) tools."""
    server = MCPServer(name)

    @server.tool(annotations=READ)
    async def read(key: str, hold: str = "", steps: int = 1) -> str:
        """Read something (records its execution)."""
        return await recorder.run(name, "read", key, False, hold, steps)

    @server.tool(annotations=WRITE)
    async def write(key: str, hold: str = "", steps: int = 1) -> str:
        """Write something (records its execution)."""
        return await recorder.run(name, "write", key, True, hold, steps)

    @server.tool(annotations=READ)
    async def fail(key: str) -> str:
        """Always reports an error."""
        await recorder.run(name, "fail", key, False, "", 0)
        raise ValueError(f"fail {key}")

    @server.tool(annotations=READ)
    async def sleep(key: str, seconds: float) -> str:
        """Sleep, then answer (for timeouts)."""
        await recorder.run(name, "sleep", key, False, "", 0)
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            recorder.by_key(key)[-1].cancelled = True
            raise
        return "slept"

    return server
