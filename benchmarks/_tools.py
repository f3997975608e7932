"""The tools the workloads call, and the batches they call them with.

The dispatcher and every reference call the very same coroutine functions with the very same
arguments. "Zero latency" means the tool returns without awaiting anything: what is measured is the
cost of getting a call to its tool and its result back, nothing else.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import anyio
from mcp.types import CallToolResult, ToolAnnotations

from dispatcher import ToolCall
from dispatcher._functions import FunctionTool

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from dispatcher import Dispatcher

__all__ = [
    "READ_ONLY",
    "WRITE",
    "Adapter",
    "latency_calls",
    "lookup",
    "mixed_batch",
    "register_latency_tools",
    "sleep_read",
    "sleep_write",
    "zero_calls",
]

READ_ONLY = ToolAnnotations(read_only_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)


async def lookup(key: str) -> str:
    """A zero-latency read-only tool: returns its argument."""
    return key


async def sleep_read(key: str, seconds: float) -> str:
    """A read-only tool that takes `seconds` (a real `anyio.sleep`)."""
    await anyio.sleep(seconds)
    return key


async def sleep_write(key: str, seconds: float) -> str:
    """A mutating tool that takes `seconds`."""
    await anyio.sleep(seconds)
    return key


def zero_calls(n: int, prefix: str = "c") -> tuple[list[ToolCall], list[dict[str, Any]]]:
    """n calls of `lookup`, as ToolCalls for the dispatcher and as argument dicts for the references."""
    arguments = [{"key": f"k{i}"} for i in range(n)]
    return [ToolCall(f"{prefix}{i}", "lookup", args) for i, args in enumerate(arguments)], arguments


def mixed_batch(seed: int, size: int = 16, read_fraction: float = 0.7) -> list[bool]:
    """A seeded agent turn: for each call in order, whether it mutates (about 30% do)."""
    rng = random.Random(seed)
    return [rng.random() >= read_fraction for _ in range(size)]


def register_latency_tools(dispatcher: Dispatcher) -> None:
    """Register `lookup`, `sleep_read` (read-only) and `sleep_write` (mutating) on a dispatcher."""
    dispatcher.add_function(lookup, annotations=READ_ONLY)
    dispatcher.add_function(sleep_read, annotations=READ_ONLY)
    dispatcher.add_function(sleep_write, annotations=WRITE)


def latency_calls(exclusive: Sequence[bool], latency: float, prefix: str = "m") -> list[ToolCall]:
    """The ToolCalls of a batch of sleeping reads and writes."""
    return [
        ToolCall(f"{prefix}{i}", "sleep_write" if alone else "sleep_read", {"key": f"k{i}", "seconds": latency})
        for i, alone in enumerate(exclusive)
    ]


class Adapter:
    """The dispatcher's own function-tool adapter, for references that do the identical per-call work.

    A call through the dispatcher validates its arguments with pydantic when it is submitted
    (`FunctionTool.prepare`) and converts the return value into a `CallToolResult` when it ends
    (`FunctionTool.invoke`). A reference that calls the bare coroutine skips both; this one does both,
    so that comparing with it isolates what scheduling costs.
    """

    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.tool = FunctionTool(fn)

    async def call(self, arguments: dict[str, Any]) -> CallToolResult:
        """Validate, call and convert, as the dispatcher does for one call."""
        tool = self.tool
        return await tool.invoke(tool.prepare(arguments))
