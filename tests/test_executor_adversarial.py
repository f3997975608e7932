"""The executor under hostile tools: every call still gets exactly one result, in order, and nothing hangs."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, RetryPolicy, ToolCall

pytestmark = pytest.mark.anyio

READ_ONLY = ToolAnnotations(read_only_hint=True)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("read_only", [True, False])
async def test_a_tool_raising_the_cancellation_exception_strands_no_call_behind_it(read_only: bool) -> None:
    """A tool that raises asyncio's CancelledError (or cancels its own task) leaves every other call a result."""

    async def hostile(key: str) -> str:
        if key == "raise":
            raise asyncio.CancelledError
        if key == "self":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
        return key

    annotations = READ_ONLY if read_only else ToolAnnotations(read_only_hint=False, idempotent_hint=False)
    keys = ["a", "raise", "b", "self", "c"] * 3
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=1) as dispatcher:
            dispatcher.add_function(hostile, annotations=annotations)
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "hostile", {"key": k}) for i, k in enumerate(keys)])
            again = await dispatcher.dispatch([ToolCall("d", "hostile", {"key": "d"})])
    assert [result.call_id for result in results] == [f"c{i}" for i in range(len(keys))]
    for key, result in zip(keys, results, strict=True):
        if key in ("raise", "self"):
            assert result.status is CallStatus.CANCELLED
        else:
            assert result.status is CallStatus.OK, result
    assert again[0].status is CallStatus.OK


class Hostile(BaseException):
    """A BaseException subclass of a tool's own."""


@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize("retried", [False, True])
async def test_a_tool_raising_a_base_exception_fails_its_call_alone(read_only: bool, retried: bool) -> None:
    """GeneratorExit, a BaseException of the tool's own, or a group of them fail that call; the batch goes on."""

    async def hostile(key: str) -> str:
        if key == "genexit":
            raise GeneratorExit
        if key == "own":
            raise Hostile
        if key == "group":
            raise BaseExceptionGroup("inner", [Hostile(), ValueError()])
        await anyio.lowlevel.checkpoint()
        return key

    annotations = READ_ONLY if read_only else ToolAnnotations(read_only_hint=False, idempotent_hint=False)
    if retried:
        annotations = ToolAnnotations(read_only_hint=read_only, idempotent_hint=True)
    keys = ["a", "genexit", "b", "own", "c", "group", "d"] * 2
    retry = RetryPolicy(attempts=2, wait_initial=0.0, wait_max=0.0) if retried else None
    with anyio.fail_after(10):
        async with Dispatcher(max_concurrency=2, call_timeout=5, retry=retry) as dispatcher:
            dispatcher.add_function(hostile, annotations=annotations)
            results = await dispatcher.dispatch([ToolCall(f"c{i}", "hostile", {"key": k}) for i, k in enumerate(keys)])
    assert [result.call_id for result in results] == [f"c{i}" for i in range(len(keys))]
    for key, result in zip(keys, results, strict=True):
        if key in ("genexit", "own", "group"):
            assert result.status is CallStatus.FAILED, result
        else:
            assert result.status is CallStatus.OK, result
