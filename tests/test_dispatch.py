"""End-to-end behaviour of `Dispatcher` through a real in-process MCP server."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client
from mcp.types import ToolAnnotations

from dispatcher import (
    BatchError,
    CallStatus,
    Dispatcher,
    DispatcherClosedError,
    DispatcherError,
    NotFinishedError,
    ToolCall,
)

from .recording import READ, Recorder, recording_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def setup(
    *,
    trusted: bool = True,
    max_concurrency: int | None = 16,
    server_limit: int | None = None,
    call_timeout: float | None = 60.0,
    overrides: dict[str, ToolAnnotations] | None = None,
) -> AsyncIterator[tuple[Dispatcher, Recorder]]:
    recorder = Recorder()
    async with (
        Client(recording_server(recorder)) as client,
        Dispatcher(max_concurrency=max_concurrency, call_timeout=call_timeout) as dispatcher,
    ):
        await dispatcher.add_mcp_server(
            "rec", client, trusted=trusted, max_concurrency=server_limit, overrides=overrides
        )
        yield dispatcher, recorder


def call(call_id: str, tool: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id, tool, {"key": call_id, **arguments})


async def test_results_come_back_one_per_call_in_request_order() -> None:
    """Every call gets exactly one result, in the order the calls were given."""
    async with setup() as (dispatcher, recorder):
        calls = [call(f"c{i}", "write" if i % 3 == 0 else "read") for i in range(12)]
        results = await dispatcher.dispatch(calls)
    assert [result.call_id for result in results] == [c.id for c in calls]
    assert all(result.ok for result in results)
    assert [result.result.content[0].text for result in results if result.result] == [  # type: ignore[union-attr]
        f"{c.name}:{c.id}" for c in calls
    ]
    assert all(result.attempts == 1 for result in results)
    assert recorder.violations == []


async def test_consecutive_reads_run_together() -> None:
    """A run of read-only calls is in flight at the same time."""
    async with setup() as (dispatcher, recorder):
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.dispatch, [call(f"r{i}", "read", hold="go") for i in range(5)])
            with anyio.fail_after(10):
                for i in range(5):
                    await recorder.started_event(f"r{i}").wait()
            assert len(recorder.active) == 5
            recorder.gate("go").set()
    assert recorder.max_active == 5


async def test_write_waits_for_earlier_calls_and_blocks_later_ones() -> None:
    """A mutating call starts after everything before it ends, and nothing after it starts until it ends."""
    async with setup() as (dispatcher, recorder):
        calls = [
            call("r1", "read", hold="r1"),
            call("r2", "read", hold="r2"),
            call("w", "write", hold="w"),
            call("r3", "read"),
        ]
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.dispatch, calls)
            await recorder.started_event("r2").wait()
            await anyio.wait_all_tasks_blocked()
            assert recorder.by_key("w") == []
            recorder.gate("r1").set()
            await anyio.wait_all_tasks_blocked()
            assert recorder.by_key("w") == [], "the write started while r2 still ran"
            recorder.gate("r2").set()
            await recorder.started_event("w").wait()
            await anyio.wait_all_tasks_blocked()
            assert recorder.by_key("r3") == [], "a later read started while the write ran"
            recorder.gate("w").set()
    assert recorder.violations == []
    (w,) = recorder.by_key("w")
    (r3,) = recorder.by_key("r3")
    assert w.end is not None and r3.start > w.end


async def test_untrusted_server_hints_are_ignored() -> None:
    """Every tool of an untrusted server runs alone, whatever its annotations claim."""
    async with setup(trusted=False) as (dispatcher, recorder):
        entry = next(e for e in dispatcher.tools() if e.tool == "read")
        assert entry.exclusive and not entry.trusted
        assert entry.annotations.destructive_hint is True
        assert entry.annotations.open_world_hint is True
        assert entry.declared_annotations is not None and entry.declared_annotations.read_only_hint is True
        results = await dispatcher.dispatch([call(f"r{i}", "read", steps=3) for i in range(6)])
    assert all(result.ok for result in results)
    assert recorder.max_active == 1


async def test_overrides_are_trusted_even_for_an_untrusted_server() -> None:
    """A user's override makes an untrusted server's tool concurrent; hints it leaves unset stay worst-case."""
    async with setup(trusted=False, overrides={"read": ToolAnnotations(read_only_hint=True)}) as (dispatcher, recorder):
        entry = next(e for e in dispatcher.tools() if e.tool == "read")
        assert entry.concurrent
        assert entry.annotations.open_world_hint is True, "unset override hints fall back to spec defaults"
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.dispatch, [call(f"r{i}", "read", hold="go") for i in range(3)])
            with anyio.fail_after(10):
                for i in range(3):
                    await recorder.started_event(f"r{i}").wait()
            recorder.gate("go").set()
    assert recorder.max_active == 3


async def test_override_for_a_tool_the_server_lacks_is_rejected() -> None:
    """An override naming an unknown tool is a configuration error, not silently ignored."""
    recorder = Recorder()
    async with Client(recording_server(recorder)) as client, Dispatcher() as dispatcher:
        with pytest.raises(ValueError, match="does not have"):
            await dispatcher.add_mcp_server("rec", client, overrides={"raed": READ})


async def test_global_limit_is_never_exceeded() -> None:
    """max_concurrency caps calls in flight across the dispatcher."""
    async with setup(max_concurrency=3) as (dispatcher, recorder):
        results = await dispatcher.dispatch([call(f"r{i}", "read", steps=5) for i in range(20)])
    assert all(result.ok for result in results)
    assert recorder.max_active == 3


async def test_per_server_limit_is_never_exceeded() -> None:
    """A server's max_concurrency caps that server, while another server runs freely."""
    recorder = Recorder()
    async with (
        Client(recording_server(recorder, "a")) as a,
        Client(recording_server(recorder, "b")) as b,
        Dispatcher(max_concurrency=None) as dispatcher,
    ):
        await dispatcher.add_mcp_server("a", a, trusted=True, max_concurrency=2)
        await dispatcher.add_mcp_server("b", b, trusted=True)
        calls = [ToolCall(f"{s}{i}", "read", {"key": f"{s}{i}", "steps": 5}, server=s) for i in range(8) for s in "ab"]
        results = await dispatcher.dispatch(calls)
    assert all(result.ok for result in results)
    assert recorder.max_active_by_server["a"] == 2
    assert recorder.max_active_by_server["b"] == 8


async def test_failures_do_not_touch_siblings() -> None:
    """A tool error, an unknown tool and bad arguments each get their own result; the rest run normally."""
    async with setup() as (dispatcher, recorder):
        calls = [
            call("ok1", "read"),
            ToolCall("err", "fail", {"key": "err"}),
            ToolCall("unknown", "no_such_tool", {}),
            ToolCall("bad", "read", {"key": 5}),
            ToolCall("missing", "read", {}),
            ToolCall("notdict", "read", "key=x"),  # type: ignore[arg-type]
            call("ok2", "write"),
        ]
        results = await dispatcher.dispatch(calls)
    status = {result.call_id: result.status for result in results}
    assert status == {
        "ok1": CallStatus.OK,
        "err": CallStatus.TOOL_ERROR,
        "unknown": CallStatus.FAILED,
        # The server is the authority on types: it ran the call and its validation answered.
        "bad": CallStatus.TOOL_ERROR,
        "missing": CallStatus.FAILED,
        "notdict": CallStatus.FAILED,
        "ok2": CallStatus.OK,
    }
    by_id = {result.call_id: result for result in results}
    assert by_id["err"].result is not None and by_id["err"].result.is_error
    assert by_id["err"].attempts == 1
    assert "unknown tool 'no_such_tool'" in (by_id["unknown"].error or "")
    assert "valid string" in (by_id["bad"].error or "")
    assert "missing required 'key'" in (by_id["missing"].error or "")
    assert "expected a JSON object" in (by_id["notdict"].error or "")
    for failed in ("unknown", "missing", "notdict"):
        assert by_id[failed].attempts == 0 and by_id[failed].started_at is None
    assert by_id["bad"].attempts == 1  # sent, and refused by the server's own validation
    assert {e.key for e in recorder.executions} == {"ok1", "err", "ok2"}


async def test_a_raising_local_function_is_a_tool_error() -> None:
    """A local function that raises gives TOOL_ERROR with the exception text; siblings are unaffected."""

    async def explode(x: int) -> int:
        raise RuntimeError(f"no {x}")

    async def fine(x: int) -> int:
        return x

    async with Dispatcher() as dispatcher:
        dispatcher.add_function(explode, annotations=READ)
        dispatcher.add_function(fine, annotations=READ)
        results = await dispatcher.dispatch([ToolCall("1", "explode", {"x": 1}), ToolCall("2", "fine", {"x": 2})])
    assert results[0].status is CallStatus.TOOL_ERROR
    assert results[0].error == "RuntimeError: no 1"
    assert results[1].ok


async def test_duplicate_ids_and_non_calls_are_rejected_before_anything_runs() -> None:
    """A batch with duplicate ids or a non-ToolCall item raises ValueError and runs nothing."""
    async with setup() as (dispatcher, recorder):
        # The position counts from 0, and says so: the second of two calls is item 1.
        with pytest.raises(ValueError, match=r"duplicate call id 'x' \(item 1, counting from 0\)"):
            await dispatcher.dispatch([call("x", "write"), call("x", "read")])
        with pytest.raises(BatchError, match="item 1 is a dict"):
            await dispatcher.dispatch([call("a", "write"), {"id": "b"}])  # type: ignore[list-item]
        with pytest.raises(BatchError, match="empty or non-string id"):
            await dispatcher.dispatch([ToolCall("", "read", {"key": "k"})])
        assert recorder.executions == []
        assert await dispatcher.dispatch([]) == []


async def test_clashing_names_and_server_qualified_calls_resolve() -> None:
    """The same tool name on a second server is prefixed; each name and each ToolCall.server resolves to one tool."""
    recorder = Recorder()
    async with (
        Client(recording_server(recorder, "a")) as a,
        Client(recording_server(recorder, "b")) as b,
        Dispatcher() as dispatcher,
    ):
        await dispatcher.add_mcp_server("a", a, trusted=True)
        await dispatcher.add_mcp_server("b", b, trusted=True)
        names = {entry.name for entry in dispatcher.tools()}
        assert {"read", "b__read", "write", "b__write"} <= names
        results = await dispatcher.dispatch(
            [
                ToolCall("bare", "read", {"key": "bare"}),
                ToolCall("pref", "b__read", {"key": "pref"}),
                ToolCall("srv", "read", {"key": "srv"}, server="b"),
                ToolCall("srvpref", "b__write", {"key": "srvpref"}, server="b"),
                ToolCall("nosrv", "read", {"key": "nosrv"}, server="c"),
                ToolCall("never", "a__read", {"key": "never"}),
            ]
        )
    bare, pref, srv, srvpref, nosrv, never = results
    assert bare.ok and bare.server == "a"
    assert pref.ok and pref.server == "b" and pref.tool == "b__read"
    assert srv.ok and srv.server == "b"
    assert srvpref.ok and srvpref.server == "b"
    assert nosrv.status is CallStatus.FAILED and "unknown server 'c'" in (nosrv.error or "")
    assert never.status is CallStatus.FAILED and "unknown tool 'a__read'" in (never.error or "")
    assert {(e.server, e.key) for e in recorder.executions} == {
        ("a", "bare"),
        ("b", "pref"),
        ("b", "srv"),
        ("b", "srvpref"),
    }


async def test_cancelling_dispatch_cancels_its_calls_and_propagates() -> None:
    """Cancelling the awaiting task cancels in-flight calls on the server and the dispatcher stays usable."""
    async with setup(max_concurrency=2) as (dispatcher, recorder):
        calls = [call(f"r{i}", "read", hold="never") for i in range(2)] + [call("w", "write"), call("r9", "read")]
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    await dispatcher.dispatch(calls)
                    pytest.fail("dispatch returned although it was cancelled")

                tg.start_soon(run)
                await recorder.started_event("r1").wait()
                await recorder.started_event("r0").wait()
                scope.cancel()
        assert scope.cancelled_caught
        assert [e.cancelled for e in recorder.executions] == [True, True]
        assert recorder.by_key("w") == [] and recorder.by_key("r9") == []
        assert dispatcher.running == 0 and dispatcher.idle
        results = await dispatcher.dispatch([call("after", "write")])
        assert results[0].ok


async def test_reading_a_result_too_early_raises_an_error_of_the_package() -> None:
    """`result()` and `results()` before a call ends raise NotFinishedError; `idle`/`running` show the call."""
    async with setup() as (dispatcher, recorder):
        async with dispatcher.batch() as batch:
            pending = batch.submit(call("r0", "read", hold="never"))
            await recorder.started_event("r0").wait()
            with pytest.raises(NotFinishedError, match="'r0' has not finished"):
                pending.result()
            with pytest.raises(DispatcherError):
                batch.results()
            assert dispatcher.running == 1 and not dispatcher.idle
            pending.cancel()
        assert pending.result().status is CallStatus.CANCELLED
        assert dispatcher.running == 0 and dispatcher.idle


async def test_incremental_batch_starts_calls_as_they_are_submitted() -> None:
    """Calls submitted one by one start as soon as the rules allow, before the batch is complete."""
    async with setup() as (dispatcher, recorder):
        async with dispatcher.batch() as batch:
            first = batch.submit(call("r1", "read", hold="r1"))
            await recorder.started_event("r1").wait()
            second = batch.submit(call("r2", "read"))
            await recorder.started_event("r2").wait()  # runs together with r1
            third = batch.submit(call("w", "write"))
            await anyio.wait_all_tasks_blocked()
            assert recorder.by_key("w") == []
            assert (await second.wait()).ok
            recorder.gate("r1").set()
            assert (await third.wait()).ok
            with pytest.raises(BatchError, match="duplicate"):
                batch.submit(call("r1", "read"))
        results = batch.results()
    assert [r.call_id for r in results] == ["r1", "r2", "w"]
    assert first.done and all(r.ok for r in results)


async def test_incremental_batch_cancels_unfinished_calls_on_error() -> None:
    """Leaving a batch block with an exception cancels its unfinished calls and re-raises."""
    async with setup() as (dispatcher, recorder):
        with pytest.raises(KeyError):
            async with dispatcher.batch() as batch:
                pending = batch.submit(call("r1", "read", hold="never"))
                queued = batch.submit(call("w", "write"))
                await recorder.started_event("r1").wait()
                raise KeyError("model stream broke")
        assert pending.result().status is CallStatus.CANCELLED
        assert queued.result().status is CallStatus.CANCELLED and queued.result().started_at is None
        assert recorder.by_key("w") == []
        assert dispatcher.idle


async def test_writer_is_not_starved_by_a_stream_of_readers() -> None:
    """Across concurrent dispatches, a queued write goes before reads submitted after it."""
    async with setup() as (dispatcher, recorder):
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.dispatch, [call("r1", "read", hold="r1")])
            await recorder.started_event("r1").wait()
            tg.start_soon(dispatcher.dispatch, [call("w", "write")])
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(dispatcher.dispatch, [call("r2", "read")])
            await anyio.wait_all_tasks_blocked()
            assert recorder.by_key("w") == [] and recorder.by_key("r2") == [], "r2 overtook the queued write"
            recorder.gate("r1").set()
    (w,) = recorder.by_key("w")
    (r2,) = recorder.by_key("r2")
    assert w.end is not None and r2.start > w.end
    assert recorder.violations == []


async def test_writes_are_exclusive_across_concurrent_dispatches() -> None:
    """Several agents sharing a dispatcher never see a write overlap anything."""
    async with setup(max_concurrency=8) as (dispatcher, recorder):

        async def agent(n: int) -> None:
            calls = [call(f"a{n}-{i}", "write" if (i + n) % 3 == 0 else "read", steps=2) for i in range(10)]
            results = await dispatcher.dispatch(calls)
            assert all(result.ok for result in results)

        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(agent, n)
    assert len(recorder.executions) == 50
    assert recorder.violations == []


async def test_dispatcher_must_be_open() -> None:
    """Dispatching outside `async with` raises DispatcherClosedError; a dispatcher opens once."""
    dispatcher = Dispatcher()
    with pytest.raises(DispatcherClosedError):
        await dispatcher.dispatch([ToolCall("1", "x")])
    async with dispatcher:
        pass
    with pytest.raises(DispatcherClosedError):
        await dispatcher.dispatch([ToolCall("1", "x")])
    with pytest.raises(DispatcherClosedError):
        async with dispatcher:
            pass


async def test_closing_the_dispatcher_settles_outstanding_calls() -> None:
    """Calls still running when the dispatcher closes end as CANCELLED; no waiter hangs."""
    recorder = Recorder()
    results = []
    async with Client(recording_server(recorder)) as client, anyio.create_task_group() as tg:
        async with Dispatcher() as dispatcher:
            await dispatcher.add_mcp_server("rec", client, trusted=True)

            async def run() -> None:
                results.extend(await dispatcher.dispatch([call("r", "read", hold="never"), call("w", "write")]))

            tg.start_soon(run)
            await recorder.started_event("r").wait()
    assert [r.status for r in results] == [CallStatus.CANCELLED, CallStatus.CANCELLED]
    assert recorder.executions[0].cancelled


async def test_local_functions_sync_and_async() -> None:
    """Sync and async functions run as tools with schemas from their signatures and CallToolResults back."""

    def add(a: int, b: int = 2) -> int:
        """Add two numbers."""
        return a + b

    async def shout(text: str) -> str:
        return text.upper()

    async with Dispatcher() as dispatcher:
        entry = dispatcher.add_function(add, annotations=READ)
        dispatcher.add_function(shout, name="loud", annotations=ToolAnnotations(read_only_hint=True, title="Loud"))
        assert entry.name == "add" and entry.server is None and entry.trusted
        assert entry.description == "Add two numbers."
        assert entry.input_schema["required"] == ["a"]
        assert entry.output_schema is not None
        loud = next(e for e in dispatcher.tools() if e.name == "loud")
        assert loud.title == "Loud" and loud.concurrent
        results = await dispatcher.dispatch([ToolCall("1", "add", {"a": 1}), ToolCall("2", "loud", {"text": "hi"})])
    assert results[0].result is not None and results[0].result.structured_content == {"result": 3}
    assert results[1].result is not None and results[1].result.content[0].text == "HI"  # type: ignore[union-attr]


async def test_function_without_annotations_is_exclusive() -> None:
    """A local function registered without annotations gets the spec's worst case: it runs alone."""

    async def f() -> None:
        return None

    async with Dispatcher() as dispatcher:
        entry = dispatcher.add_function(f)
    assert entry.exclusive and entry.annotations.destructive_hint and not entry.idempotent


async def test_result_times_are_ordered() -> None:
    """queued_at <= started_at <= finished_at, and queue_time/run_time are non-negative."""
    async with setup() as (dispatcher, _):
        (result,) = await dispatcher.dispatch([call("r", "read", steps=3)])
    assert result.started_at is not None
    assert result.queued_at <= result.started_at <= result.finished_at
    assert result.queue_time >= 0 and result.run_time >= 0


async def test_an_exception_in_the_block_propagates_unwrapped() -> None:
    """An exception raised inside `async with Dispatcher()` comes out as itself, not in an ExceptionGroup."""
    with pytest.raises(KeyError, match="boom"):
        async with Dispatcher():
            raise KeyError("boom")
    recorder = Recorder()
    async with Client(recording_server(recorder)) as client:
        with pytest.raises(LookupError):
            async with Dispatcher() as dispatcher:
                await dispatcher.add_mcp_server("rec", client, trusted=True)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(dispatcher.dispatch, [call("r", "read", hold="never")])
                    await recorder.started_event("r").wait()
                    tg.cancel_scope.cancel()
                raise LookupError("after a cancelled batch")


async def test_a_single_pending_call_can_be_cancelled() -> None:
    """PendingCall.cancel() stops one queued or running call; the rest of its batch runs on."""
    async with setup() as (dispatcher, recorder):
        async with dispatcher.batch() as batch:
            running = batch.submit(call("r1", "read", hold="never"))
            queued = batch.submit(call("w", "write"))
            after = batch.submit(call("r2", "read"))
            await recorder.started_event("r1").wait()
            queued.cancel()
            running.cancel()
            assert (await after.wait()).ok
        assert running.result().status is CallStatus.CANCELLED
        assert queued.result().status is CallStatus.CANCELLED and queued.result().started_at is None
        assert recorder.by_key("r1")[0].cancelled and recorder.by_key("w") == []
        running.cancel()  # a finished call: nothing happens
        assert dispatcher.idle


async def test_a_huge_error_text_is_cut_in_error_but_kept_in_result() -> None:
    """ToolResult.error stays short whatever a tool reports; the full text stays in the CallToolResult."""

    async def shout(text: str) -> str:
        raise ValueError(text)

    async with Dispatcher() as dispatcher:
        dispatcher.add_function(shout, annotations=READ)
        (result,) = await dispatcher.dispatch([ToolCall("1", "shout", {"text": "a" * 1_000_000})])
    assert result.status is CallStatus.TOOL_ERROR
    assert result.error is not None and len(result.error) < 1100
    assert result.error.endswith("(1,000,012 characters in all)")
    assert result.result is not None and len(result.result.content[0].text) == 1_000_012  # type: ignore[union-attr]
