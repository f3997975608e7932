"""The tools the workloads call, and the batches they call them with.

The dispatcher and every reference call the very same coroutine functions with the very same
arguments. "Zero latency" means the tool returns without awaiting anything: what is measured is the
cost of getting a call to its tool and its result back, nothing else.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING, Any

import anyio
from mcp.types import CallToolResult, ToolAnnotations

from dispatcher import ToolCall
from dispatcher._functions import FunctionTool

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from dispatcher import Dispatcher

__all__ = [
    "ADAPTER_WORK",
    "READ_ONLY",
    "WRITE",
    "Adapter",
    "dispatch_once",
    "gather_per_call",
    "latency_calls",
    "lookup",
    "mixed_batch",
    "register_latency_tools",
    "sleep_read",
    "sleep_write",
    "task_group_per_batch",
    "task_per_call",
    "workers",
    "zero_calls",
]

WORKERS = 16
"""How many hand-written workers the `workers` reference runs (the dispatcher's default limit)."""

# The detail of a target against a bare reference.
ADAPTER_WORK = "includes the adapter's validation and result conversion, which the bare tasks skip"

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


def dispatch_once(dispatcher: Dispatcher, calls: list[ToolCall]) -> Callable[[], Awaitable[float]]:
    """A variant that dispatches `calls` as one batch and returns the seconds the dispatch took.

    Every result must be OK (checked after the clock stops).
    """

    async def run_dispatcher() -> float:
        start = time.perf_counter()
        results = await dispatcher.dispatch(calls)
        elapsed = time.perf_counter() - start
        assert len(results) == len(calls), f"{len(results)} results for {len(calls)} calls"
        assert all(r.ok for r in results), next(r for r in results if not r.ok)
        return elapsed

    return run_dispatcher


def task_per_call(
    tool: Callable[..., Awaitable[Any]] | Adapter, arguments: list[dict[str, Any]]
) -> Callable[[], Awaitable[float]]:
    """A reference that runs one batch as one anyio task per call in a task group.

    Each task awaits `tool(**args)` ("bare") or, given an `Adapter`, `adapter.call(args)` ("same
    adapter"), and stores its result at the call's index. The clock covers the task group only.
    """
    n = len(arguments)

    async def run_tasks() -> float:
        results: list[Any] = [None] * n
        if isinstance(tool, Adapter):
            adapter = tool

            async def one(i: int, args: dict[str, Any]) -> None:
                results[i] = await adapter.call(args)

        else:
            fn = tool

            async def one(i: int, args: dict[str, Any]) -> None:
                results[i] = await fn(**args)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i, args in enumerate(arguments):
                tg.start_soon(one, i, args)
        elapsed = time.perf_counter() - start
        assert not isinstance(tool, Adapter) or not results[-1].is_error, results[-1]
        return elapsed

    return run_tasks


def workers(adapter: Adapter, arguments: list[dict[str, Any]], count: int = WORKERS) -> Callable[[], Awaitable[float]]:
    """A reference: `count` worker tasks written by hand that pull the calls in order from one shared
    iterator and do the same SDK work as the dispatcher (`Adapter.call`: validate, call, convert).

    It is what a careful user writes without a scheduler for a batch of reads at a concurrency of
    `count`: no task per call, no cancel scope, no ordering rules. The clock covers the task group only.
    """
    n = len(arguments)

    async def run_workers() -> float:
        results: list[Any] = [None] * n
        pending = iter(enumerate(arguments))
        call = adapter.call

        async def worker() -> None:
            for i, args in pending:
                results[i] = await call(args)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(worker)
        elapsed = time.perf_counter() - start
        assert all(result is not None and not result.is_error for result in results)
        return elapsed

    return run_workers


def task_group_per_batch(
    tool: Callable[..., Awaitable[Any]] | Adapter, batches: list[tuple[list[ToolCall], list[dict[str, Any]]]]
) -> Callable[[], Awaitable[float]]:
    """A reference that runs `batches` (as built by `zero_calls`) one after the other, each in its own
    task group with one task per call, bare or through an `Adapter` as in `task_per_call`.
    """

    async def run_batches() -> float:
        if isinstance(tool, Adapter):
            adapter = tool

            async def one(results: list[Any], i: int, args: dict[str, Any]) -> None:
                results[i] = await adapter.call(args)

        else:
            fn = tool

            async def one(results: list[Any], i: int, args: dict[str, Any]) -> None:
                results[i] = await fn(**args)

        start = time.perf_counter()
        for _, arguments in batches:
            results: list[Any] = [None] * len(arguments)
            async with anyio.create_task_group() as tg:
                for i, args in enumerate(arguments):
                    tg.start_soon(one, results, i, args)
        return time.perf_counter() - start

    return run_batches


def gather_per_call(
    tool: Callable[..., Awaitable[Any]] | Adapter, arguments: list[dict[str, Any]]
) -> Callable[[], Awaitable[float]]:
    """A reference (asyncio only) that runs one batch as `asyncio.gather` over one coroutine per call,
    bare or through an `Adapter` as in `task_per_call`. The clock covers building the coroutines and
    the gather.
    """
    if isinstance(tool, Adapter):
        adapter = tool

        async def run_gather_adapter() -> float:
            start = time.perf_counter()
            await asyncio.gather(*[adapter.call(args) for args in arguments])
            return time.perf_counter() - start

        return run_gather_adapter
    fn = tool

    async def run_gather_bare() -> float:
        start = time.perf_counter()
        await asyncio.gather(*[fn(**args) for args in arguments])
        return time.perf_counter() - start

    return run_gather_bare
