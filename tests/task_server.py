"""A scripted MCP server that runs its one tool as a 2025-11-25 task and misbehaves as told, for fault injection.

The SDK's server side does not run tasks, so this answers the JSON-RPC messages itself, in process, over
memory streams: `initialize`, `tools/list` (one tool, `slow`, requiring tasks), a task-augmented
`tools/call`, `tasks/get` (the task stays `working` until `finish_after` polls), `tasks/result` and
`tasks/cancel` (answered or, with `confirm_cancel=False`, never). It records when each request came, and
the parameters of each `tools/call`; with `call_errors=n` it answers the first n with a JSON-RPC error.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from mcp import Client
from mcp.shared.message import SessionMessage
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@dataclass
class TaskScript:
    """How the scripted server behaves, and what it saw (`requests`: method and loop time of each)."""

    poll_interval: int | None = 1000
    finish_after: int | None = None  # polls until "completed"; None: working forever
    confirm_cancel: bool = True
    status_message: str = "working on it"
    # Whether each poll reports a new status message ("step 1", "step 2", ...): a task that is not idle.
    reports_steps: bool = False
    # Answer the first `call_errors` tools/call requests with -32603 (the server may have done the work).
    call_errors: int = 0
    tool_annotations: dict[str, Any] = field(default_factory=lambda: {"readOnlyHint": True, "openWorldHint": False})
    requests: list[tuple[str, float]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def times(self, method: str) -> list[float]:
        return [at for name, at in self.requests if name == method]

    def client(self) -> Client:
        """A new client for `Dispatcher.connect` (the 2025-11-25 handshake, as the script speaks)."""
        return Client(self._transport(), mode="legacy")

    def _task(self, status: str) -> dict[str, Any]:
        task: dict[str, Any] = {
            "taskId": "t-1",
            "status": status,
            "statusMessage": self.status_message,
            "createdAt": "2025-11-25T00:00:00Z",
            "lastUpdatedAt": "2025-11-25T00:00:00Z",
            "ttl": None,
        }
        if self.poll_interval is not None:
            task["pollInterval"] = self.poll_interval
        return task

    def _answer(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        polls = len(self.times("tasks/get"))
        if method == "initialize":
            return {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}, "tasks": {"requests": {"tools": {"call": {}}}, "cancel": {}}},
                "serverInfo": {"name": "scripted", "version": "1"},
            }
        if method == "tools/list":
            tool = {
                "name": "slow",
                "inputSchema": {"type": "object"},
                "annotations": self.tool_annotations,
                "execution": {"taskSupport": "required"},
            }
            return {"tools": [tool]}
        if method == "tools/call":
            return {"task": self._task("working")}
        if method == "tasks/get":
            done = self.finish_after is not None and polls >= self.finish_after
            task = self._task("completed" if done else "working")
            if self.reports_steps:
                task["statusMessage"] = f"step {polls}"
            return task
        if method == "tasks/result":
            return {"content": [{"type": "text", "text": f"done after {polls} polls"}], "isError": False}
        if method == "tasks/cancel":
            return self._task("cancelled") if self.confirm_cancel else None
        return {}  # ping and the rest

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        to_client, client_read = anyio.create_memory_object_stream[SessionMessage | Exception](100)
        client_write, from_client = anyio.create_memory_object_stream[SessionMessage](100)

        async def serve() -> None:
            async with to_client, from_client:
                async for item in from_client:
                    message = item.message
                    if not isinstance(message, JSONRPCRequest):
                        continue
                    self.requests.append((message.method, anyio.current_time()))
                    if message.method == "tools/call":
                        self.calls.append(dict(message.params or {}))
                        if len(self.calls) <= self.call_errors:
                            error = ErrorData(code=INTERNAL_ERROR, message="internal error, after the work was done")
                            await to_client.send(
                                SessionMessage(JSONRPCError(jsonrpc="2.0", id=message.id, error=error))
                            )
                            continue
                    try:
                        result = self._answer(message.method, message.params or {})
                    except LookupError as exc:  # a fault a test injects: answered as an error
                        error = ErrorData(code=INVALID_PARAMS, message=str(exc))
                        await to_client.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=message.id, error=error)))
                        continue
                    if result is not None:
                        reply = JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result)
                        await to_client.send(SessionMessage(reply))

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            try:
                yield client_read, client_write
            finally:
                tg.cancel_scope.cancel()
