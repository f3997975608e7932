"""Progress notifications become `CallEvent`s and span events, through server-everything's long-running operation."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dispatcher import CallEvent, CallStatus, Dispatcher, ToolCall

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
