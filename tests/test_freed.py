"""A finished batch is freed by reference counting alone: no call leaves a cycle for the garbage collector.

A batch of 100,000 calls holds its results until the caller drops them; if a finished call kept a
reference cycle, every one of them would wait for a full collection of the cyclic garbage collector,
which traverses every live object and stalls the event loop for as long. These tests run batches with
the collector off, drop the results, and check that a collection then finds nothing of the package's
(nor any result) among the garbage (`gc.DEBUG_SAVEALL` keeps what it finds), and that once the
dispatcher has closed every result is gone without the collector having run.

The in-process MCP server of the SDK makes cycles of its own for each request (its per-request
`ServerRunner` and `Connection`): those are the SDK's, made just the same by direct `call_tool`, and are
left out of the check.
"""

from __future__ import annotations

import asyncio
import gc
import types
import weakref
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from trio.testing import MockClock

import dispatcher as package
from dispatcher import CallStatus, Dispatcher, RetryPolicy, ToolCall, ToolResult

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)
IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
PACKAGE_DIR = str(Path(package.__file__).parent)


def _ours(obj: object) -> bool:
    """Whether an object was made by the package or is part of a call's result."""
    if isinstance(obj, ToolCall | ToolResult | CallToolResult | TextContent):
        return True
    if type(obj).__module__.split(".")[0] == "dispatcher":
        return True
    if isinstance(obj, types.FrameType):
        return obj.f_code.co_filename.startswith(PACKAGE_DIR)
    if isinstance(obj, types.CoroutineType):
        return obj.cr_code.co_filename.startswith(PACKAGE_DIR)
    return False


def _count_ours() -> int:
    return sum(1 for obj in gc.get_objects() if isinstance(obj, ToolResult | CallToolResult))


@contextmanager
def collector_off() -> Iterator[None]:
    """Turn the cyclic garbage collector off (explicit collections still run)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _cyclic_garbage() -> list[object]:
    """Collect now, and return the package's objects (and results) among what only the collector could free."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [obj for obj in gc.garbage if _ours(obj)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def _dispatch(dispatcher: Dispatcher, calls: list[ToolCall]) -> tuple[list[CallStatus], list[weakref.ref[Any]]]:
    """Dispatch `calls` and drop the results; return the statuses and weak references to the tool results."""
    results = await dispatcher.dispatch(calls)
    statuses = [result.status for result in results]
    answers = [weakref.ref(result.result) for result in results if result.result is not None]
    del results
    return statuses, answers


def _alive(answers: list[weakref.ref[Any]]) -> int:
    return sum(1 for ref in answers if ref() is not None)


def _local_tools(dispatcher: Dispatcher) -> None:
    async def lookup(key: str) -> str:
        return key

    def lookup_sync(key: str) -> str:
        return key

    async def fails(key: str) -> str:
        raise ValueError(f"no {key}")

    async def slow(key: str) -> str:
        await anyio.sleep(10)
        return key

    dispatcher.add_function(lookup, annotations=READ_ONLY)
    dispatcher.add_function(lookup_sync, annotations=READ_ONLY)
    dispatcher.add_function(fails, annotations=READ_ONLY)
    dispatcher.add_function(slow, annotations=IDEMPOTENT)


def _server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("freed")

    async def search(query: str) -> str:
        return query

    async def broken(query: str) -> str:
        raise ValueError(f"broken {query}")

    async def stuck(query: str) -> str:
        await anyio.sleep(10)
        return query

    server.add_tool(search, annotations=READ_ONLY, structured_output=False)
    server.add_tool(broken, annotations=READ_ONLY, structured_output=False)
    server.add_tool(stuck, annotations=IDEMPOTENT, structured_output=False)
    return server


@pytest.mark.slow
async def test_a_finished_batch_of_local_calls_is_freed_by_reference_counting() -> None:
    """OK, tool-error, failed, timed-out and retried local calls leave nothing for the cyclic collector."""
    retry = RetryPolicy(attempts=2, wait_initial=0.0, wait_max=0.0, jitter=False)
    calls = [
        *(ToolCall(f"a{i}", "lookup", {"key": f"k{i}"}) for i in range(200)),
        *(ToolCall(f"s{i}", "lookup_sync", {"key": f"k{i}"}) for i in range(5)),
        *(ToolCall(f"f{i}", "fails", {"key": f"k{i}"}) for i in range(5)),
        ToolCall("unknown", "nope", {}),
        ToolCall("bad", "lookup", {"key": 1}),
        ToolCall("missing", "lookup", {}),
        ToolCall("slow", "slow", {"key": "k"}),
    ]
    with ExitStack() as stack:
        async with Dispatcher(call_timeout=0.5, retry=retry) as dispatcher:
            _local_tools(dispatcher)
            await _dispatch(dispatcher, calls)  # builds what the first call of each tool builds once
            stack.enter_context(collector_off())
            before = _count_ours()
            statuses, answers = await _dispatch(dispatcher, calls)
            garbage = _cyclic_garbage()
        # The dispatcher has closed (its parked runners with it); the collector is still off.
        alive, answered = _count_ours() - before, _alive(answers)
    assert statuses.count(CallStatus.OK) == 205
    assert statuses.count(CallStatus.TOOL_ERROR) == 5
    assert statuses.count(CallStatus.FAILED) == 3
    assert statuses[-1] is CallStatus.TIMEOUT
    assert alive <= 0 and answered == 0
    assert garbage == []


@pytest.mark.parametrize("owned", [False, True], ids=["user-client", "owned-connection"])
async def test_a_finished_batch_of_mcp_calls_is_freed_by_reference_counting(owned: bool) -> None:
    """OK, tool-error, rejected and timed-out MCP calls leave nothing of the dispatcher's for the collector."""
    calls = [
        *(ToolCall(f"q{i}", "search", {"query": f"q{i}"}) for i in range(200)),
        *(ToolCall(f"b{i}", "broken", {"query": f"q{i}"}) for i in range(5)),
        ToolCall("missing", "search", {}),
        ToolCall("nan", "search", {"query": float("nan")}),
        ToolCall("stuck", "stuck", {"query": "q"}),
    ]
    async with Client(_server()) as client:
        with ExitStack() as stack:
            async with Dispatcher(call_timeout=0.5) as dispatcher:
                if owned:
                    await dispatcher.connect("s", _server(), trusted=True)
                else:
                    await dispatcher.add_mcp_server("s", client, trusted=True)
                await _dispatch(dispatcher, calls)
                stack.enter_context(collector_off())
                before = _count_ours()
                statuses, answers = await _dispatch(dispatcher, calls)
                garbage = _cyclic_garbage()
            alive, answered = _count_ours() - before, _alive(answers)
    assert statuses.count(CallStatus.OK) == 200
    assert statuses.count(CallStatus.TOOL_ERROR) == 5
    assert statuses.count(CallStatus.FAILED) == 2
    assert statuses[-1] is CallStatus.TIMEOUT
    assert alive <= 0 and answered == 0
    assert garbage == []


async def test_results_dropped_while_the_dispatcher_stays_open_are_freed_at_once() -> None:
    """No runner of an open dispatcher keeps a finished call (and its result) alive."""

    async def lookup(key: str) -> str:
        return key

    async with Dispatcher() as dispatcher:
        dispatcher.add_function(lookup, annotations=READ_ONLY)
        calls = [ToolCall(f"a{i}", "lookup", {"key": f"k{i}"}) for i in range(100)]
        with collector_off():
            _, answers = await _dispatch(dispatcher, calls)
            assert _alive(answers) == 0


@pytest.mark.backends("trio-mockclock")
@pytest.mark.parametrize("calls", [20, 100, 1000])
async def test_a_runner_letting_the_loop_run_holds_no_finished_call(anyio_backend: Any, calls: int) -> None:
    """Calls that compute (a jump of the virtual clock) span several time slices, so runners let the loop
    run between them while the others finish the batch: none of them keeps a finished call alive."""
    import trio

    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)

    async def compute(key: str) -> str:
        clock.jump(0.0003)
        return key

    async with Dispatcher() as dispatcher:
        dispatcher.add_function(compute, annotations=READ_ONLY)
        batch = [ToolCall(f"a{i}", "compute", {"key": f"k{i}"}) for i in range(calls)]
        for _ in range(5):
            with collector_off():
                _, answers = await _dispatch(dispatcher, batch)
                assert _alive(answers) == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_runner_withdrawing_a_tools_own_cancellation_holds_no_finished_call() -> None:
    """A tool cancels its own task and returns: the runner withdraws that after letting go of the call, so
    the result is freed as soon as the caller drops it."""

    async def hostile(key: str) -> str:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return key * 1000

    async with Dispatcher() as dispatcher:
        dispatcher.add_function(hostile, annotations=READ_ONLY)
        with collector_off():
            _, answers = await _dispatch(dispatcher, [ToolCall("a", "hostile", {"key": "k"})])
            assert _alive(answers) == 0
