"""Progress notifications become `CallEvent`s and span events, through server-everything's long-running operation."""

from __future__ import annotations

import math

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dispatcher import CallEvent, CallStatus, ConfigurationError, Dispatcher, ToolCall

from .everything import WireLog, everything, logged_everything

pytestmark = [pytest.mark.reference_servers, pytest.mark.anyio]

OPERATION = "trigger-long-running-operation"


async def test_progress_reaches_the_event_hook() -> None:
    """Each progress notification of a call becomes a "progress" CallEvent of that call, in order, before it ends."""
    events: list[CallEvent] = []
    async with Dispatcher(on_event=events.append) as dispatcher:
        await dispatcher.connect("everything", everything(), trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", OPERATION, {"duration": 1, "steps": 4})])
    assert result.status is CallStatus.OK, result.error
    kinds = [event.kind for event in events]
    progress = [event for event in events if event.kind == "progress"]
    assert [event.progress for event in progress] == [1, 2, 3, 4]
    assert all(event.total == 4 and event.call.id == "1" and event.attempt == 1 for event in progress)
    assert kinds.index("started") < kinds.index("progress") and kinds[-1] == "finished"


async def test_an_unobserved_call_asks_for_no_progress() -> None:
    """Without a hook or a tracer, the request carries no progress token (the SDK adds one only for a callback)."""
    log = WireLog()
    async with Dispatcher() as dispatcher:
        await dispatcher.connect("everything", logged_everything(log), trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", OPERATION, {"duration": 0.2, "steps": 2})])
    assert result.ok, result.error
    call = log.first("tools/call")
    assert call.params is not None and "progressToken" not in call.params.get("_meta", {})


async def test_progress_becomes_span_events_of_the_attempt() -> None:
    """With tracing on, each progress notification is a `dispatcher.progress` event of the attempt's span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Dispatcher(tracer_provider=provider) as dispatcher:
        await dispatcher.connect("everything", everything(), trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", OPERATION, {"duration": 0.6, "steps": 3})])
    assert result.ok, result.error
    [attempt] = [span for span in exporter.get_finished_spans() if span.name == f"attempt {OPERATION}"]
    events = [event for event in attempt.events if event.name == "dispatcher.progress"]
    assert [dict(event.attributes or {})["dispatcher.progress"] for event in events] == [1, 2, 3]
    assert all(dict(event.attributes or {})["dispatcher.progress.total"] == 3 for event in events)


async def test_a_call_that_keeps_reporting_outlives_its_idle_timeout() -> None:
    """Progress every 0.2 s keeps a 2 s call alive under idle_timeout=1: each report starts the wait again."""
    async with Dispatcher(call_timeout=30) as dispatcher:
        await dispatcher.connect("everything", everything(), trusted=True, idle_timeout=1.0)
        [result] = await dispatcher.dispatch([ToolCall("1", OPERATION, {"duration": 2, "steps": 10})])
    assert result.status is CallStatus.OK, result.error
    assert result.run_time is not None and result.run_time >= 2


async def test_a_silent_call_ends_at_its_idle_timeout() -> None:
    """A call whose first progress comes after 3 s ends TIMEOUT at idle_timeout=0.5, long before call_timeout."""
    async with Dispatcher(call_timeout=30) as dispatcher:
        await dispatcher.connect("everything", everything(), trusted=True, idle_timeout=0.5)
        [result] = await dispatcher.dispatch([ToolCall("1", OPERATION, {"duration": 3, "steps": 1})])
        # The connection goes on: the server answered the ping that followed the abandoned call.
        [echo] = await dispatcher.dispatch([ToolCall("2", "echo", {"message": "still here"})])
    assert result.status is CallStatus.TIMEOUT, result.error
    assert result.error is not None and "no progress from the server within idle_timeout=0.5s" in result.error
    assert result.run_time is not None and result.run_time < 2.5
    assert echo.ok, echo.error


async def test_idle_timeout_is_checked() -> None:
    """`idle_timeout` must be a positive number of seconds."""
    async with Dispatcher() as dispatcher:
        for bad in (0, -1, math.nan, True):
            with pytest.raises(ConfigurationError, match="idle_timeout must be a positive number"):
                await dispatcher.connect("everything", everything(), idle_timeout=bad)
