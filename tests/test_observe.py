"""Observability: the event hook and OpenTelemetry spans per call and per attempt."""

from __future__ import annotations

import logging
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp.shared._otel
import pytest
from mcp import Client
from mcp.types import ToolAnnotations
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from dispatcher import (
    ApprovalRequest,
    CallEvent,
    CallStatus,
    Dispatcher,
    RetryPolicy,
    ToolCall,
)
from dispatcher._driver._observe import resolve_tracer
from dispatcher.examples import FaultConfig, Workspace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

NO_WAIT = RetryPolicy(attempts=3, wait_initial=0.0, wait_max=0.0, jitter=False)


@asynccontextmanager
async def workspace(
    ws: Workspace | None = None, *, trusted: bool = True, **options: Any
) -> AsyncIterator[tuple[Dispatcher, Workspace]]:
    ws = ws if ws is not None else Workspace()
    async with Client(ws.server) as client, Dispatcher(**options) as dispatcher:
        await dispatcher.add_mcp_server("workspace", client, trusted=trusted)
        yield dispatcher, ws


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


# The event hook ----------------------------------------------------------------------------------


async def test_events_follow_each_call_from_queued_to_finished() -> None:
    """Each call is queued, started and finished, in that order, with the result's own times."""
    events: list[CallEvent] = []
    calls = [
        ToolCall("w", "set_note", {"name": "a", "text": "1"}),
        ToolCall("r", "read_note", {"name": "a"}),
        ToolCall("x", "no_such_tool", {}),
    ]
    async with workspace(on_event=events.append) as (dispatcher, _):
        results = await dispatcher.dispatch(calls)
    kinds = {call.id: [event.kind for event in events if event.call.id == call.id] for call in calls}
    assert kinds == {
        "w": ["queued", "started", "finished"],
        "r": ["queued", "started", "finished"],
        "x": ["queued", "finished"],
    }
    assert [event.call.id for event in events if event.kind == "queued"] == ["w", "r", "x"]
    for result in results:
        mine = {event.kind: event for event in events if event.call.id == result.call_id}
        assert mine["queued"].time == result.queued_at
        assert mine["finished"].time == result.finished_at
        assert mine["finished"].result is result
        if result.started_at is not None:
            assert mine["started"].time == result.started_at
            assert mine["started"].attempt == 1
    queued = next(event for event in events if event.call.id == "w")
    assert queued.tool is not None and queued.tool.name == "set_note"
    [unknown] = [event for event in events if event.call.id == "x" and event.kind == "finished"]
    assert unknown.tool is None and unknown.error == "unknown tool 'no_such_tool'"
    # Every result carries its queue time and run time separately.
    write, read, _ = results
    assert read.queue_time >= write.run_time > 0
    assert read.run_time > 0


async def test_retried_events_come_with_the_previous_attempts_error() -> None:
    """A call retried after transient failures reports each new attempt with why the last one failed."""
    events: list[CallEvent] = []
    ws = Workspace(faults=FaultConfig(rate=1.0, tools=frozenset({"set_note"}), kinds=("error",)))
    async with workspace(ws, on_event=events.append, retry=NO_WAIT) as (dispatcher, _):
        [result] = await dispatcher.dispatch([ToolCall("w", "set_note", {"name": "a", "text": "1"})])
    assert result.status is CallStatus.FAILED and result.attempts == 3
    assert [(event.kind, event.attempt) for event in events] == [
        ("queued", 0),
        ("started", 1),
        ("retried", 2),
        ("retried", 3),
        ("finished", 3),
    ]
    assert events[2].error == result.attempt_errors[0]
    assert events[2].error is not None and "injected fault: internal error in 'set_note'" in events[2].error


async def test_a_hook_that_raises_is_logged_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """An exception in the user's hook is logged; the call still runs and gets its result."""

    def hook(event: CallEvent) -> None:
        raise ValueError("oops")

    async with workspace(on_event=hook) as (dispatcher, _):
        with caplog.at_level(logging.ERROR, logger="dispatcher"):
            [result] = await dispatcher.dispatch([ToolCall("r", "search_notes", {"query": "x"})])
    assert result.ok
    assert [record.getMessage() for record in caplog.records][:1] == [
        "the on_event hook raised on a 'queued' event for call 'r'"
    ]


async def test_nothing_configured_means_no_hooks() -> None:
    """Without an approver, a guard, a hook or a configured tracer, a batch carries no hooks at all."""
    async with workspace() as (dispatcher, _):
        assert dispatcher.batch()._hooks is None
        [result] = await dispatcher.dispatch([ToolCall("r", "search_notes", {"query": "x"})])
    assert result.ok


# OpenTelemetry -----------------------------------------------------------------------------------


async def test_a_span_per_call_and_per_attempt(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    """Each call has a span under the caller's span, and each attempt a child span, with their attributes."""
    tracer = provider.get_tracer("test")
    async with workspace(tracer_provider=provider) as (dispatcher, _):
        with tracer.start_as_current_span("agent turn"):
            await dispatcher.dispatch(
                [ToolCall("w", "set_note", {"name": "a", "text": "1"}), ToolCall("r", "read_note", {"name": "a"})]
            )
    spans = exporter.get_finished_spans()
    [turn] = by_name(spans, "agent turn")
    [write] = by_name(spans, "execute_tool set_note")
    [read] = by_name(spans, "execute_tool read_note")
    assert parent_id(write) == parent_id(read) == span_id(turn)
    assert write.attributes is not None and dict(write.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "set_note",
        "gen_ai.tool.call.id": "w",
        "dispatcher.server": "workspace",
        "dispatcher.tool": "set_note",
        "dispatcher.trusted": True,
        "dispatcher.scheduling": "exclusive",
        "dispatcher.read_only": False,
        "dispatcher.destructive": True,
        "dispatcher.idempotent": True,
        "dispatcher.open_world": False,
        "dispatcher.status": "ok",
        "dispatcher.effect": "ran",
        "dispatcher.attempts": 1,
        "dispatcher.queue_time_s": pytest.approx(write.attributes["dispatcher.queue_time_s"]),
        "dispatcher.run_time_s": pytest.approx(write.attributes["dispatcher.run_time_s"]),
        "dispatcher.untrusted_content": False,
    }
    assert read.attributes is not None and read.attributes["dispatcher.scheduling"] == "concurrent"
    [write_attempt] = by_name(spans, "attempt set_note")
    assert parent_id(write_attempt) == span_id(write)
    assert write_attempt.attributes is not None
    assert write_attempt.attributes["dispatcher.attempt"] == 1
    assert write_attempt.attributes["dispatcher.outcome"] == "ok"
    assert write.status.status_code is StatusCode.UNSET


async def test_the_attempt_span_is_current_while_the_tool_runs(
    provider: TracerProvider, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MCP SDK's spans for the request nest under the attempt span; a local tool sees it as current."""
    monkeypatch.setattr(mcp.shared._otel, "_tracer", provider.get_tracer("mcp-python-sdk"))
    seen: list[int] = []

    async def probe() -> str:
        """Report the current span."""
        seen.append(trace.get_current_span().get_span_context().span_id)
        return "ok"

    async with workspace(tracer_provider=provider) as (dispatcher, _):
        dispatcher.add_function(probe, annotations=ToolAnnotations(read_only_hint=True))
        await dispatcher.dispatch([ToolCall("p", "probe", {}), ToolCall("r", "search_notes", {"query": "x"})])
    spans = exporter.get_finished_spans()
    [probe_attempt] = by_name(spans, "attempt probe")
    assert seen == [span_id(probe_attempt)]
    [search_attempt] = by_name(spans, "attempt search_notes")
    children = [span for span in spans if parent_id(span) == span_id(search_attempt)]
    # The SDK sends the attempt's trace context in _meta, so the server's span nests under it.
    assert [span.name for span in children] == ["tools/call search_notes"]


async def test_retried_calls_get_an_attempt_span_each(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    """Every attempt of a retried call has its own span, numbered, with its outcome; the call span errs."""
    ws = Workspace(faults=FaultConfig(rate=1.0, tools=frozenset({"set_note"}), kinds=("error",)))
    async with workspace(ws, tracer_provider=provider, retry=NO_WAIT) as (dispatcher, _):
        [result] = await dispatcher.dispatch([ToolCall("w", "set_note", {"name": "a", "text": "1"})])
    spans = exporter.get_finished_spans()
    [call_span] = by_name(spans, "execute_tool set_note")
    attempts = by_name(spans, "attempt set_note")
    assert [span.attributes["dispatcher.attempt"] for span in attempts if span.attributes] == [1, 2, 3]
    assert all(parent_id(span) == span_id(call_span) for span in attempts)
    assert all(span.status.status_code is StatusCode.ERROR for span in attempts)
    assert call_span.attributes is not None and call_span.attributes["dispatcher.attempts"] == 3
    assert call_span.attributes["error.type"] == "failed"
    assert call_span.status.status_code is StatusCode.ERROR
    assert call_span.status.description == result.error


async def test_denied_calls_are_traced_with_the_approval(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A denied call's span records the approval decision and ends in error, with no attempt span."""

    async def deny(request: ApprovalRequest) -> bool:
        return False

    async with workspace(tracer_provider=provider, approve=deny) as (dispatcher, _):
        await dispatcher.dispatch([ToolCall("d", "delete_note", {"name": "a"})])
    spans = exporter.get_finished_spans()
    [call_span] = by_name(spans, "execute_tool delete_note")
    assert [event.name for event in call_span.events] == ["dispatcher.approval.denied"]
    assert call_span.attributes is not None and call_span.attributes["dispatcher.status"] == "denied"
    assert by_name(spans, "attempt delete_note") == []


def test_tracing_is_off_without_an_sdk_or_without_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's default proxy and no-op providers, or no API at all, mean no tracer."""
    assert resolve_tracer(trace.NoOpTracerProvider()) is None
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    assert resolve_tracer(None) is None
    configured = TracerProvider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: configured)
    assert resolve_tracer(None) is not None
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    assert resolve_tracer(configured) is None


async def test_the_global_provider_is_used_when_one_is_configured(
    provider: TracerProvider, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an SDK configured globally, a dispatcher traces without being told."""
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    async with workspace() as (dispatcher, _):
        await dispatcher.dispatch([ToolCall("r", "search_notes", {"query": "x"})])
        await anyio.lowlevel.checkpoint()
    assert [span.name for span in exporter.get_finished_spans()] == [
        "attempt search_notes",
        "execute_tool search_notes",
    ]
