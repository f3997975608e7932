"""Fail fast by dependency: after a write fails, the later calls of its batch that conflict with it do not run."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.types import ToolAnnotations
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dispatcher import (
    ApprovalPolicy,
    CallEvent,
    CallStatus,
    ConfigurationError,
    Dispatcher,
    Effect,
    ToolCall,
    ToolResult,
)
from dispatcher.examples import Workspace
from dispatcher.formats import anthropic_results, openai_chat_results, result_note
from dispatcher.integrations._common import model_text

pytestmark = pytest.mark.anyio

WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)


class Files:
    """Local tools keyed by path (domain "files"), with a ledger of what ran; a path starting "bad" fails."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, str]] = []
        self.hang = anyio.Event()  # never set: a write to a path starting "slow" waits until cut off

    def register(self, d: Dispatcher, *, keyed: bool = True) -> None:
        key = (lambda arguments: str(arguments["path"])) if keyed else None
        domain = "files" if keyed else None

        async def write(path: str) -> str:
            self.ran.append(("write", path))
            if path.startswith("bad"):
                raise RuntimeError(f"cannot write {path}")
            if path.startswith("slow"):
                await self.hang.wait()
            return "written"

        async def read(path: str) -> str:
            self.ran.append(("read", path))
            return "content"

        d.add_function(write, annotations=WRITE, domain=domain, keys=key)
        d.add_function(read, annotations=READ, domain=domain, keys=key)


def calls(*specs: tuple[str, str]) -> list[ToolCall]:
    """Calls c0, c1, ... of (tool, path)."""
    return [ToolCall(f"c{i}", tool, {"path": path}) for i, (tool, path) in enumerate(specs)]


def skipped(results: list[ToolResult]) -> list[str]:
    """The ids of the calls fail-fast did not run."""
    return [r.call.id for r in results if r.error is not None and r.error.startswith("not run: it depends on")]


async def test_by_default_every_call_runs() -> None:
    """Without fail_fast, the calls after a failed write run as today."""
    files = Files()
    async with Dispatcher() as d:
        files.register(d, keyed=False)
        results = await d.dispatch(calls(("write", "bad"), ("read", "a"), ("write", "a")))
    assert [r.status for r in results] == [CallStatus.TOOL_ERROR, CallStatus.OK, CallStatus.OK]
    assert skipped(results) == []


async def test_without_keys_every_later_call_is_skipped() -> None:
    """Without keys every call conflicts: the calls after a failed write are not run, and name it; earlier ones ran."""
    files = Files()
    async with Dispatcher(fail_fast=True) as d:
        files.register(d, keyed=False)
        results = await d.dispatch(calls(("read", "a"), ("write", "bad"), ("read", "a"), ("write", "b")))
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.TOOL_ERROR, CallStatus.FAILED, CallStatus.FAILED]
    assert skipped(results) == ["c2", "c3"]
    assert [r.effect for r in results] == [Effect.RAN, Effect.RAN, Effect.NEVER_RAN, Effect.NEVER_RAN]
    assert results[2].error == "not run: it depends on call 'c1' (write), which failed (tool_error)"
    assert files.ran == [("read", "a"), ("write", "bad")]


async def test_only_conflicting_calls_are_skipped() -> None:
    """With keys, calls on the failed path (or under it) are skipped; calls on other paths run."""
    files = Files()
    async with Dispatcher(fail_fast=True) as d:
        files.register(d)
        results = await d.dispatch(
            calls(("write", "bad"), ("read", "bad"), ("write", "bad/child"), ("write", "b"), ("read", "c"))
        )
    assert skipped(results) == ["c1", "c2"]
    assert [r.ok for r in results[3:]] == [True, True]
    assert sorted(files.ran) == [("read", "c"), ("write", "b"), ("write", "bad")]  # independent: in any order


async def test_an_unknown_outcome_stops_its_dependents() -> None:
    """A write cut off by the call timeout (UNKNOWN) stops the calls on its path, which say it may have happened."""
    files = Files()
    async with Dispatcher(fail_fast=True, call_timeout=0.5) as d:
        files.register(d)
        results = await d.dispatch(calls(("write", "slow"), ("read", "slow"), ("read", "other")))
    assert results[0].status is CallStatus.TIMEOUT and results[0].effect is Effect.UNKNOWN
    assert skipped(results) == ["c1"]
    assert "unknown outcome" in str(results[1].error)
    assert results[2].ok


async def test_a_skipped_write_stops_what_depends_on_it() -> None:
    """A skipped call that may mutate is a failure in turn: a call conflicting only with it is skipped, naming it."""
    files = Files()

    async def move(source: str, target: str) -> str:
        files.ran.append(("move", f"{source}->{target}"))
        return "moved"

    async with Dispatcher(fail_fast=True) as d:
        files.register(d)
        d.add_function(move, annotations=WRITE, domain="files", keys=lambda a: [str(a["source"]), str(a["target"])])
        results = await d.dispatch(
            [
                ToolCall("c0", "write", {"path": "bad"}),
                ToolCall("c1", "move", {"source": "bad", "target": "b"}),
                ToolCall("c2", "read", {"path": "b"}),
                ToolCall("c3", "read", {"path": "c"}),
            ]
        )
    assert skipped(results) == ["c1", "c2"]
    assert "call 'c1' (move), which was not run" in str(results[2].error)
    assert results[3].ok
    assert sorted(files.ran) == [("read", "c"), ("write", "bad")]


async def test_a_skipped_result_names_what_it_depended_on() -> None:
    """`ToolResult.depends_on` names the call each skipped call waited on (a skipped write in turn), in events,
    spans and what the model reads (formats and the integrations); the other calls have none."""
    files = Files()
    events: list[CallEvent] = []
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def move(source: str, target: str) -> str:
        return "moved"

    async with Dispatcher(fail_fast=True, on_event=events.append, tracer_provider=provider) as d:
        files.register(d)
        d.add_function(move, annotations=WRITE, domain="files", keys=lambda a: [str(a["source"]), str(a["target"])])
        results = await d.dispatch(
            [
                ToolCall("c0", "write", {"path": "bad"}),
                ToolCall("c1", "move", {"source": "bad", "target": "b"}),
                ToolCall("c2", "read", {"path": "b"}),
                ToolCall("c3", "read", {"path": "c"}),
            ]
        )
    assert [r.depends_on for r in results] == [None, "c0", "c1", None]
    finished = {e.call.id: e.result.depends_on for e in events if e.kind == "finished" and e.result is not None}
    assert finished == {"c0": None, "c1": "c0", "c2": "c1", "c3": None}
    spans = {
        span.attributes.get("gen_ai.tool.call.id"): span.attributes.get("dispatcher.depends_on")
        for span in exporter.get_finished_spans()
        if span.attributes is not None and "dispatcher.status" in span.attributes
    }
    assert spans == {"c0": None, "c1": "c0", "c2": "c1", "c3": None}
    note = result_note(results[2])
    assert note is not None and "'c1'" in note and "nothing of it happened" in note
    assert [result_note(r) for r in (results[0], results[3])] == [None, None]
    assert anthropic_results(results)[2]["content"].endswith(note)
    assert openai_chat_results(results)[2]["content"].endswith(note)
    assert model_text(results[2]).endswith(note)


async def test_the_integrations_tell_the_model_of_an_unknown_write() -> None:
    """The framework integrations' text ends with the unknown-outcome note, as the formats' does.

    Before the fix it did not: a LangGraph, Agents SDK, pydantic-ai or Claude agent read a timed-out
    write as a plain error, free to send it again.
    """
    from dispatcher.formats import UNKNOWN_EFFECT_NOTE

    files = Files()
    async with Dispatcher(call_timeout=0.2) as d:
        files.register(d)
        [result] = await d.dispatch([ToolCall("w", "write", {"path": "slow"})])
    assert result.effect is Effect.UNKNOWN
    assert model_text(result).endswith(UNKNOWN_EFFECT_NOTE)


async def test_a_failed_read_stops_nothing() -> None:
    """Only a call that may mutate is depended on: a failed read leaves the calls after it alone."""
    async with Dispatcher(fail_fast=True) as d:
        await d.connect("ws", Workspace().server, trusted=True)
        results = await d.dispatch(
            [ToolCall("r", "read_note", {"name": "missing"}), ToolCall("w", "set_note", {"name": "a", "text": "x"})]
        )
    assert [r.status for r in results] == [CallStatus.TOOL_ERROR, CallStatus.OK]


async def test_an_unknown_tool_stops_nothing_and_the_calls_after_it_run() -> None:
    """A made-up tool never ran and has no keys: it is not depended on, in a whole batch or a streamed one.

    It fails (NEVER_RAN), and it would otherwise hold the root key and stop every later call, the
    independent ones too. A write that did fail after it still stops what depends on it.
    """
    files = Files()
    async with Dispatcher(fail_fast=True) as d:
        files.register(d)
        results = await d.dispatch(
            [
                ToolCall("u", "delete_everything", {"path": "a"}),
                ToolCall("c1", "write", {"path": "a"}),
                ToolCall("c2", "write", {"path": "bad"}),
                ToolCall("c3", "read", {"path": "bad"}),
                ToolCall("c4", "read", {"path": "a"}),
            ]
        )
        async with d.batch() as batch:
            unknown = batch.submit(ToolCall("u2", "delete_everything", {}))
            await unknown.wait()
            late = batch.submit(ToolCall("c5", "write", {"path": "b"}))
        streamed = batch.results()
    assert (results[0].status, results[0].effect, results[0].tool) == (CallStatus.FAILED, Effect.NEVER_RAN, None)
    assert results[0].error == "unknown tool 'delete_everything'"
    assert [r.depends_on for r in results] == [None, None, None, "c2", None]
    assert [r.ok for r in results] == [False, True, False, False, True]
    assert [r.status for r in streamed] == [CallStatus.FAILED, CallStatus.OK] and late.done


async def test_the_batch_setting_wins_and_late_calls_are_skipped_too() -> None:
    """`batch(fail_fast=True)` on a default dispatcher: a call submitted after the failure is skipped at once."""
    files = Files()
    async with Dispatcher() as d:
        files.register(d, keyed=False)
        async with d.batch(fail_fast=True) as batch:
            failed = batch.submit(ToolCall("c0", "write", {"path": "bad"}))
            await failed.wait()
            late = batch.submit(ToolCall("c1", "read", {"path": "a"}))
            assert late.done
        results = batch.results()
        off = await d.dispatch(calls(("write", "bad"), ("read", "a")), fail_fast=False)
    assert skipped(results) == ["c1"]
    assert skipped(off) == []
    assert files.ran == [("write", "bad"), ("write", "bad"), ("read", "a")]


async def test_skipped_calls_waiting_for_approval_are_not_asked_further() -> None:
    """A dependent call held for approval is skipped when the write it waits behind fails; its approver stops."""
    files = Files()
    asked: list[str] = []
    answer = anyio.Event()

    async def approve(request: Any) -> bool:
        asked.append(request.call.id)
        if request.call.id == "c0":
            return True
        await answer.wait()
        return True

    async with Dispatcher(fail_fast=True, approve=approve, approval=ApprovalPolicy(mutating=True)) as d:
        files.register(d, keyed=False)
        results = await d.dispatch(calls(("write", "bad"), ("write", "b")))
    # One person: c0 is asked first (the batch's order), c1 is held, waiting for or shown its prompt, when c0 fails.
    assert asked in (["c0"], ["c0", "c1"])
    assert skipped(results) == ["c1"]
    assert files.ran == [("write", "bad")]


def test_fail_fast_is_checked() -> None:
    """A fail_fast that is not a bool is refused with a message saying what to pass."""
    with pytest.raises(ConfigurationError, match="fail_fast must be True or False"):
        Dispatcher(fail_fast="yes")  # type: ignore[arg-type]


async def test_a_long_cascade_settles_without_recursion() -> None:
    """Thousands of writes behind one failed write are all skipped in one pass (no recursion limit)."""
    files = Files()
    async with Dispatcher(fail_fast=True) as d:
        files.register(d, keyed=False)
        results = await d.dispatch(calls(("write", "bad"), *[("write", str(i)) for i in range(3000)]))
    assert len(skipped(results)) == 3000
    assert files.ran == [("write", "bad")]


def _related(first: str, second: str) -> bool:
    return first == second or first.startswith(f"{second}/") or second.startswith(f"{first}/")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(["read", "write", "bad"]), st.sampled_from(["a", "a/x", "b", "c"])), max_size=20
    )
)
async def test_random_batches_skip_exactly_the_dependents(anyio_backend: Any, specs: list[tuple[str, str]]) -> None:
    """Against a model: a call is skipped iff an earlier failed (or skipped) write touches its path, naming the
    earliest; the rest run."""
    files = Files()
    calls = [
        ToolCall(f"c{i}", "read" if kind == "read" else "write", {"path": path if kind != "bad" else f"bad{path}"})
        for i, (kind, path) in enumerate(specs)
    ]
    # "bad<path>" fails, and is keyed by that path: model it on the path it names.
    paths = [f"bad{path}" if kind == "bad" else path for kind, path in specs]
    async with Dispatcher(fail_fast=True) as d:
        files.register(d)
        results = await d.dispatch(calls)
    failed: list[int] = []
    expected = []
    depends: list[str | None] = []
    for i, (kind, _) in enumerate(specs):
        earlier = [j for j in failed if _related(paths[j], paths[i])]
        depends.append(f"c{min(earlier)}" if earlier else None)
        if earlier:
            expected.append(f"c{i}")
            if kind != "read":
                failed.append(i)  # a skipped write is a failure in turn
        elif kind == "bad":
            failed.append(i)
    assert skipped(results) == expected
    assert [r.depends_on for r in results] == depends  # the earliest call each depended on
    ran = sorted(str(call.arguments["path"]) for call in calls if call.id not in expected)  # type: ignore[index]
    assert sorted(path for _, path in files.ran) == ran  # 0 conflicting calls ran, 0 independent ones skipped


async def test_a_huge_call_id_is_quoted_cut_in_every_dependent_calls_error_and_note() -> None:
    """A failed write whose id (the model's) is 100 000 characters: each call that depended on it is told of
    it in a few hundred characters, not a copy of the id each, and depends_on still holds the id whole."""
    files = Files()
    huge = "\x1b" + "x" * 100_000
    async with Dispatcher(fail_fast=True) as d:
        files.register(d, keyed=False)
        batch = calls(("write", "bad"), ("read", "a"), ("write", "b"), ("read", "c"))
        results = await d.dispatch([ToolCall(huge, batch[0].name, batch[0].arguments), *batch[1:]])
    assert skipped(results) == ["c1", "c2", "c3"]
    for result in results[1:]:
        assert result.depends_on in (huge, "c2") and result.error is not None
        assert len(result.error) < 400 and "(100001 characters)" in result.error, result.error[:500]
        text = anthropic_results([result])[0]["content"]
        assert len(text) < 1200 and "\x1b" not in text, text[:1500]
