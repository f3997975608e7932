"""Conflict domains and keys through real MCP servers: what waits for what, where keys come from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.types import ToolAnnotations

from benchmarks import keys as bench
from benchmarks.reference import KeyedCall, ideal_keyed_makespan
from dispatcher import ApprovalPolicy, CallEvent, CallStatus, ConfigurationError, Dispatcher, RetryPolicy, ToolCall
from dispatcher._core._gate import conflicts
from dispatcher._core._lifecycle import FailFast
from dispatcher.examples import Workspace
from dispatcher.testing import inject_faults

from . import flip_server, forkserver
from .recording import Recorder, recording_server
from .test_connections import SOURCE_ROOT

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Mapping

    from dispatcher import ApprovalRequest

pytestmark = pytest.mark.anyio


def note(args: Mapping[str, Any]) -> str:
    """The key of a workspace call: the note it names."""
    return f"note:{args['name']}"


NOTE_KEYS = {"read_note": note, "set_note": note, "create_note": note, "append_note": note, "delete_note": note}


def set_note(call_id: str, name: str, server: str | None = None) -> ToolCall:
    return ToolCall(call_id, "set_note", {"name": name, "text": call_id}, server=server)


def read_note(call_id: str, name: str, server: str | None = None) -> ToolCall:
    return ToolCall(call_id, "read_note", {"name": name}, server=server)


# Domains ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("domains", "overlap"), [((None, None), False), (("a", "b"), True), (("shared", "shared"), False)]
)
async def test_writes_to_two_servers_overlap_only_in_separate_domains(
    domains: tuple[str | None, str | None], overlap: bool
) -> None:
    """Writes on two servers run together only when the user gave them separate domains."""
    a, b = Workspace(latency=0.2), Workspace(latency=0.2)
    async with Dispatcher() as d:
        await d.connect("a", a.server, trusted=True, domain=domains[0])
        await d.connect("b", b.server, trusted=True, domain=domains[1])
        results = await d.dispatch([set_note("1", "x", "a"), set_note("2", "x", "b")])
    assert all(result.ok for result in results)
    # The two workspaces number their executions separately: compare times (one event loop clock).
    [wa], [wb] = a.ledger, b.ledger
    assert wa.ended is not None and wb.ended is not None
    ran_together = wa.started < wb.ended and wb.started < wa.ended
    assert ran_together is overlap


async def test_a_write_without_a_domain_still_waits_for_every_domain() -> None:
    """A call on the root key (a server the user said nothing about) waits for and blocks every call."""
    a, b = Workspace(latency=0.05), Workspace(latency=0.05)
    async with Dispatcher() as d:
        await d.connect("a", a.server, trusted=True, domain="a")
        await d.connect("b", b.server, trusted=True)
        results = await d.dispatch([set_note("1", "x", "a"), set_note("2", "x", "b"), read_note("3", "x", "a")])
    assert all(result.ok for result in results)
    first, read = a.ledger
    [root] = b.ledger
    assert first.ended is not None and root.ended is not None
    assert first.ended <= root.started and root.ended <= read.started


# Key functions ---------------------------------------------------------------------------------------


async def test_writes_to_distinct_notes_overlap_and_same_note_calls_keep_their_order() -> None:
    """With a key per note, writes to different notes run together; calls on one note stay in order."""
    workspace = Workspace(latency=0.2)
    events: list[CallEvent] = []
    async with Dispatcher(on_event=events.append) as d:
        await d.connect("ws", workspace.server, trusted=True, domain="notes", keys=NOTE_KEYS)
        results = await d.dispatch(
            [set_note("w1", "a"), set_note("w2", "b"), read_note("r1", "a"), set_note("w3", "a")]
        )
    assert [result.status for result in results] == [CallStatus.OK] * 4
    w1, w2, r1, w3 = _by_call(workspace)
    assert w1.overlaps(w2)
    assert not r1.overlaps(w1) and w1.ended is not None and r1.started >= w1.ended
    assert r1.ended is not None and w3.started >= r1.ended
    started = {event.call.id: event.keys for event in events if event.kind == "started"}
    assert started == {
        "w1": ("notes/note:a",),
        "w2": ("notes/note:b",),
        "r1": ("notes/note:a",),
        "w3": ("notes/note:a",),
    }


def _by_call(workspace: Workspace) -> list[Any]:
    """The executions of w1, w2, r1, w3 (set_note records its text, the call id; r1 is the read)."""
    by_id = {e.arguments.get("text", "r1"): e for e in workspace.ledger}
    return [by_id["w1"], by_id["w2"], by_id["r1"], by_id["w3"]]


async def test_a_tool_without_a_key_function_takes_its_whole_domain() -> None:
    """search_notes has no key function: keyed by the domain, it waits for every earlier write in it."""
    workspace = Workspace(latency=0.05)
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server, trusted=True, domain="notes", keys=NOTE_KEYS)
        results = await d.dispatch(
            [set_note("w1", "a"), ToolCall("s", "search_notes", {"query": "w"}), set_note("w2", "b")]
        )
    assert all(result.ok for result in results)
    write_a, search, write_b = workspace.ledger
    assert write_a.ended is not None and search.started >= write_a.ended
    assert search.ended is not None and write_b.started >= search.ended


@pytest.mark.parametrize(
    ("function", "error"),
    [
        (lambda args: args["missing"], "raised KeyError"),
        (lambda args: 42, "returned int"),
        (lambda args: [], "returned no keys"),
        (lambda args: ["a/../b"], "'..' segment"),
        (lambda args: [b"x"], "returned a bytes"),
        (lambda args: ["k"] * 101, "more than 100 keys"),
        (lambda args: "x" * 1001, "1001 characters"),
        (lambda args: (1 / 0 for _ in range(1)), "could not be read (ZeroDivisionError"),
        (lambda args: {"a": 1}, "returned dict"),
    ],
)
async def test_a_bad_key_function_fails_its_call_and_never_runs_it(function: Any, error: str) -> None:
    """A key function that raises or returns no valid keys fails that call alone; it is never run unkeyed."""
    workspace = Workspace()
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server, trusted=True, domain="notes", keys={"set_note": function})
        bad, good = await d.dispatch([set_note("bad", "a"), read_note("good", "a")])
    assert bad.status is CallStatus.FAILED
    assert bad.error is not None and "invalid conflict keys" in bad.error and error in bad.error, bad.error
    assert "the call was not run" in bad.error
    assert good.status is CallStatus.TOOL_ERROR  # it ran (the note does not exist)
    assert [e.tool for e in workspace.ledger] == ["read_note"]


async def test_key_functions_get_a_read_only_view_of_the_arguments() -> None:
    """A key function cannot change the arguments the tool receives."""

    def meddling(args: Mapping[str, Any]) -> str:
        args["name"] = "other"  # type: ignore[index]
        return "x"

    workspace = Workspace()
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server, trusted=True, domain="notes", keys={"set_note": meddling})
        [result] = await d.dispatch([set_note("w", "a")])
    assert result.status is CallStatus.FAILED and "TypeError" in str(result.error)
    assert workspace.notes == {}


async def test_registration_mistakes_are_configuration_errors() -> None:
    """Keys need a domain, must name tools the server has, and a domain must name something."""
    workspace = Workspace()
    async with Dispatcher() as d:
        with pytest.raises(ConfigurationError, match="need a domain"):
            await d.connect("ws", workspace.server, keys={"set_note": note})
        with pytest.raises(ConfigurationError, match=r"keys name tools server 'ws' does not have: \['nope'\]"):
            await d.connect("ws", workspace.server, domain="notes", keys={"nope": note})
        with pytest.raises(ConfigurationError, match="must name something"):
            await d.connect("ws", workspace.server, domain="/")
        with pytest.raises(ConfigurationError, match="'\\.\\.' segment"):
            await d.connect("ws", workspace.server, domain="a/..")
        with pytest.raises(ConfigurationError, match="must be a string"):
            await d.connect("ws", workspace.server, domain=3)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="callables"):
            await d.connect("ws", workspace.server, domain="n", keys={"set_note": "path"})  # type: ignore[dict-item]
        with pytest.raises(ConfigurationError, match="need a domain"):
            d.add_function(lambda: None, name="f", keys=lambda args: "x")
        # Nothing was left registered by the failures.
        entries = await d.connect("ws", workspace.server, trusted=True, domain="notes", keys=NOTE_KEYS)
    by_tool = {entry.tool: entry for entry in entries}
    assert by_tool["set_note"].domain == "notes" and by_tool["set_note"].key_function is note
    assert by_tool["search_notes"].key_function is None


async def test_a_server_cannot_choose_its_own_domain_or_keys() -> None:
    """Whatever a server declares (annotations, _meta), its calls stay on the keys the user gave it."""
    workspace = Workspace()
    workspace.server.remove_tool("set_note")

    async def set_note_tool(name: str, text: str) -> str:
        """Set a note."""
        return text

    workspace.server.add_tool(
        set_note_tool,
        name="set_note",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
        meta={"domain": "elsewhere", "keys": ["elsewhere/x"], "dispatcher.domain": "elsewhere"},
        structured_output=False,
    )
    events: list[CallEvent] = []
    async with Dispatcher(on_event=events.append) as d:
        [entry] = [e for e in await d.connect("ws", workspace.server, trusted=True) if e.tool == "set_note"]
        await d.dispatch([set_note("w", "a")])
    assert entry.domain is None and entry.key_function is None
    assert {event.keys for event in events if event.kind == "finished"} == {("",)}


async def test_local_functions_take_a_domain_and_a_key_function() -> None:
    """add_function(domain=..., keys=...) keys a local function's calls; writes to distinct ids overlap."""
    running: list[str] = []
    seen: list[tuple[str, ...]] = []
    together = anyio.Event()

    async def update(ticket: str) -> str:
        running.append(ticket)
        seen.append(tuple(sorted(running)))
        if {"A", "B"} <= set(running):
            together.set()
        # Wait for the other write to start (not for a time a loaded machine might overrun); a dispatcher
        # that serialised them would leave this to time out, and `seen` would show it.
        with anyio.move_on_after(10):
            await together.wait()
        running.remove(ticket)
        return ticket

    async with Dispatcher() as d:
        entry = d.add_function(update, domain="tracker", keys=lambda args: f"ticket:{args['ticket']}")
        results = await d.dispatch([ToolCall(str(i), "update", {"ticket": ticket}) for i, ticket in enumerate("ABA")])
    assert all(result.ok for result in results)
    assert entry.domain == "tracker"
    assert ("A", "B") in seen  # A and B ran together
    assert not any(snapshot.count("A") > 1 for snapshot in seen)  # the two writes to A never did


# What follows the key --------------------------------------------------------------------------------


async def test_an_approval_held_for_a_write_blocks_only_what_conflicts_with_it() -> None:
    """While a destructive write in domain a awaits approval, reads of domain b run; reads of a wait."""
    a, b = Workspace(), Workspace()
    asked = anyio.Event()
    decide = anyio.Event()

    async def approve(request: ApprovalRequest) -> bool:
        asked.set()
        await decide.wait()
        return True

    async with Dispatcher(approve=approve) as d:
        await d.connect("a", a.server, trusted=True, domain="a")
        await d.connect("b", b.server, trusted=True, domain="b")
        async with d.batch() as batch:
            write = batch.submit(set_note("w", "x", "a"))
            other = batch.submit(read_note("rb", "x", "b"))
            same = batch.submit(read_note("ra", "x", "a"))
            await asked.wait()
            other_result = await other.wait()
            assert not same.done and not write.done
            decide.set()
    assert other_result.status is CallStatus.TOOL_ERROR  # it ran: no such note on b
    assert write.result().ok and same.result().ok
    assert [e.tool for e in a.ledger] == ["set_note", "read_note"]


async def test_a_retried_write_holds_its_own_keys_only() -> None:
    """Between the attempts of a retried write, calls of other domains run; calls of its domain wait."""
    a, b = Workspace(), Workspace()
    faults = inject_faults(a.server)
    faults.fail_next("set_note", "error")
    retry = RetryPolicy(wait_initial=0.5, wait_max=0.5, jitter=False)
    async with Dispatcher(retry=retry) as d:
        await d.connect("a", a.server, trusted=True, domain="a")
        await d.connect("b", b.server, trusted=True, domain="b")
        write, other, same = await d.dispatch(
            [set_note("w", "x", "a"), read_note("rb", "x", "b"), read_note("ra", "x", "a")]
        )
    assert write.ok and write.attempts == 2
    assert other.status is CallStatus.TOOL_ERROR and same.ok
    [read_b] = b.ledger
    first, second, read_a = faults.ledger
    assert first.tool == second.tool == "set_note" and read_a.tool == "read_note"
    assert read_b.ended is not None and read_b.ended <= second.started_at  # b ran before the write ended
    assert second.finished_at is not None and read_a.started_at >= second.finished_at


@pytest.mark.backends("trio-mockclock")
async def test_the_keyed_benchmark_workload_takes_exactly_the_ideal_keyed_time() -> None:
    """On a virtual clock, each turn of the multi-server benchmark takes exactly its ideal keyed makespan."""
    config = bench.FULL
    async with Dispatcher() as d:
        bench.register(d, keyed=True)
        for t, turn in enumerate(bench.turns_of(config)):
            start = anyio.current_time()
            results = await d.dispatch(bench.tool_calls(turn, config.latency, f"t{t}-"))
            took = anyio.current_time() - start
            ideal = ideal_keyed_makespan(
                [KeyedCall(bench.keys_of(call), call.write, config.latency) for call in turn], bench.LIMIT
            )
            assert all(result.ok for result in results)
            assert took == pytest.approx(ideal), t


@pytest.mark.backends("trio-mockclock")
async def test_fail_fast_costs_the_independent_calls_nothing() -> None:
    """On a virtual clock, the benchmark's failing turns: with fail-fast or without, the independent calls end
    exactly when the conflict rule says; fail-fast runs no dependent and skips no independent call."""
    config = bench.FULL
    turns = bench.failing_turns(config)
    assert all(turn.dependents for turn in turns[:2]) and sum(len(turn.independent) for turn in turns) > 40
    ideal = sum(bench.independent_ideal(turn, config.latency) for turn in turns)
    async with Dispatcher() as d:
        bench.register_failing(d)
        for fail_fast in (True, False):
            found = await bench.run_failing_turns(d, config, fail_fast=fail_fast)
            assert found.seconds == pytest.approx(ideal), fail_fast
            assert found.dependents_run == 0 and found.independents_skipped == 0


@pytest.mark.backends("trio-mockclock")
async def test_the_fail_fast_count_catches_dependents_that_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """With fail-fast noting no failure (the safety off), the benchmark counts the dependents that ran."""
    monkeypatch.setattr(FailFast, "failed", lambda self, record, result: False)
    async with Dispatcher() as d:
        bench.register_failing(d)
        found = await bench.run_failing_turns(d, bench.FULL, fail_fast=True)
    assert found.dependents_run == sum(len(turn.dependents) for turn in bench.failing_turns(bench.FULL)) > 0


# Accepted changes apply to calls not yet started (issue 10, point 6) ----------------------------------


@pytest.mark.parametrize("transport", ["in-process", "stdio"])
@pytest.mark.parametrize("how", ["accept_changes", "on_definition_change"])
@pytest.mark.subprocess
async def test_a_queued_read_whose_tool_turns_destructive_waits_its_exclusive_turn_and_is_approved(
    transport: str, how: str, tmp_path: pathlib.Path
) -> None:
    """A call queued as a read, whose tool turns destructive and is accepted, runs alone and is asked about."""
    asked: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(request.call.id)
        return True

    target: Any
    if transport == "in-process":
        target = flip_server.build(tmp_path)
    else:
        target = forkserver.params(["-m", "tests.flip_server", str(tmp_path)], {"PYTHONPATH": SOURCE_ROOT})
    on_change = (lambda change: True) if how == "on_definition_change" else None
    async with Dispatcher(approve=approve) as d:
        await d.connect("flip", target, trusted=True, follow_changes=False, on_definition_change=on_change)
        async with d.batch() as batch:
            batch.submit(ToolCall("h", "hold", {}))
            lookup = batch.submit(ToolCall("l", "lookup", {"name": "x"}))
            batch.submit(ToolCall("p", "peek", {"name": "y"}))
            with anyio.fail_after(30):
                while not (tmp_path / "flipped").exists():  # noqa: ASYNC110  # the server may be another process
                    await anyio.sleep(0.01)
            await d.refresh("flip")
            if how == "accept_changes":
                assert [change.tool for change in d.accept_changes("flip", "lookup")] == ["lookup"]
            assert d.pending_changes() == []
            assert not lookup.done
            (tmp_path / "release").touch()
        results = batch.results()
    assert [result.status for result in results] == [CallStatus.OK] * 3, results
    assert asked == ["l"]
    assert flip_server.log(tmp_path) == [
        "start hold",
        "end hold",
        "start lookup",
        "end lookup",
        "start peek",
        "end peek",
    ]


async def test_a_reclassified_call_that_is_denied_never_runs(tmp_path: pathlib.Path) -> None:
    """The approver's denial of a reclassified call gives it a DENIED result; the later read then runs."""

    async def deny(request: ApprovalRequest) -> bool:
        return False

    async with Dispatcher(approve=deny) as d:
        await d.connect("flip", flip_server.build(tmp_path), trusted=True, follow_changes=False)
        async with d.batch() as batch:
            batch.submit(ToolCall("h", "hold", {}))
            batch.submit(ToolCall("l", "lookup", {"name": "x"}))
            batch.submit(ToolCall("p", "peek", {"name": "y"}))
            with anyio.fail_after(30):
                while not (tmp_path / "flipped").exists():  # noqa: ASYNC110  # set by the server
                    await anyio.sleep(0.01)
            await d.refresh("flip")
            d.accept_changes("flip")
            (tmp_path / "release").touch()
        hold, lookup, peek = batch.results()
    assert hold.ok and peek.ok
    assert lookup.status is CallStatus.DENIED
    assert "start lookup" not in flip_server.log(tmp_path)


def test_inspect_reports_each_tools_key_rule() -> None:
    """The inspect analysis names how each tool's calls are keyed: root, its domain, or its key function."""
    from dispatcher._core._catalog import ToolEntry
    from dispatcher.cli._inspect import analyze

    hints = ToolAnnotations(read_only_hint=True)
    entries = [
        ToolEntry("a", "s", "a", hints),
        ToolEntry("b", "s", "b", hints, domain="github"),
        ToolEntry("c", "s", "c", hints, domain="fs", key_function=note),
    ]
    tools, _ = analyze(entries)
    assert [tool.keys for tool in tools] == ["root", "github", "fs/<note(arguments)>"]


async def test_a_change_approved_by_imported_pins_reclassifies_queued_calls(tmp_path: pathlib.Path) -> None:
    """Pins imported while a changed tool is blocked approve it: its queued calls are reclassified too."""
    asked: list[str] = []

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(request.call.id)
        return True

    async with Dispatcher(approve=approve) as d:
        await d.connect("flip", flip_server.build(tmp_path), trusted=True, follow_changes=False)
        async with d.batch() as batch:
            batch.submit(ToolCall("h", "hold", {}))
            batch.submit(ToolCall("l", "lookup", {"name": "x"}))
            batch.submit(ToolCall("p", "peek", {"name": "y"}))
            with anyio.fail_after(30):
                while not (tmp_path / "flipped").exists():  # noqa: ASYNC110  # set by the server
                    await anyio.sleep(0.01)
            await d.refresh("flip")
            [change] = d.pending_changes()
            pins = d.export_pins()
            pins["flip"]["lookup"] = change.current
            d.import_pins(pins)
            assert d.pending_changes() == []
            (tmp_path / "release").touch()
        results = batch.results()
    assert all(result.ok for result in results)
    assert asked == ["l"]
    log = flip_server.log(tmp_path)
    assert log.index("start peek") > log.index("end lookup")


async def test_keys_order_calls_across_concurrent_dispatches() -> None:
    """Across concurrent dispatch() calls, a read of a key waits for an earlier write of it; other keys do not."""
    log: list[str] = []
    writing, read_b, release = anyio.Event(), anyio.Event(), anyio.Event()

    async def write(item: str) -> str:
        log.append(f"start write {item}")
        writing.set()
        await release.wait()
        log.append(f"end write {item}")
        return item

    async def read(item: str) -> str:
        log.append(f"read {item}")
        if item == "b":
            read_b.set()
        return item

    def item_key(args: Mapping[str, Any]) -> str:
        return f"item:{args['item']}"

    read_only = ToolAnnotations(read_only_hint=True)
    async with Dispatcher() as d:
        d.add_function(write, domain="store", keys=item_key)
        d.add_function(read, annotations=read_only, domain="store", keys=item_key)
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.dispatch, [ToolCall("w", "write", {"item": "a"})])
            await writing.wait()
            tg.start_soon(d.dispatch, [ToolCall("ra", "read", {"item": "a"})])
            tg.start_soon(d.dispatch, [ToolCall("rb", "read", {"item": "b"})])
            with anyio.fail_after(5):
                await read_b.wait()  # the read of b runs while the write of a is still running
            await anyio.wait_all_tasks_blocked()
            assert "read a" not in log
            release.set()
    assert log == ["start write a", "read b", "end write a", "read a"]


keyed_specs = st.lists(
    st.tuples(
        st.sampled_from(["read", "write"]), st.sampled_from(["a", "b", "local"]), st.integers(0, 2), st.integers(0, 3)
    ),
    max_size=20,
)


def item_of(args: Mapping[str, Any]) -> str:
    """Server a's key function: the item named in the call's key ("c3-1" is item 1)."""
    return f"item:{str(args['key']).rsplit('-', 1)[1]}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=keyed_specs, limit=st.one_of(st.none(), st.integers(1, 4)))
async def test_random_keyed_batches_through_mcp_servers_obey_the_rule(
    anyio_backend: Any, specs: list[tuple[str, str, int, int]], limit: int | None
) -> None:
    """Random keyed batches over two MCP servers and local tools: conflicting calls never overlap, in order."""
    recorder = Recorder()

    async def local_read(key: str, steps: int = 1) -> str:
        return await recorder.run("local", "read", key, False, "", steps)

    async def local_write(key: str, steps: int = 1) -> str:
        return await recorder.run("local", "write", key, True, "", steps)

    async with (
        Client(recording_server(recorder, "a")) as a,
        Client(recording_server(recorder, "b")) as b,
        Dispatcher(max_concurrency=limit) as d,
    ):
        await d.add_mcp_server("a", a, trusted=True, domain="a", keys={"read": item_of, "write": item_of})
        await d.add_mcp_server("b", b, trusted=True, domain="b")
        d.add_function(local_read, name="read", annotations=ToolAnnotations(read_only_hint=True))
        d.add_function(local_write, name="write")
        calls = []
        for index, (tool, server, item, steps) in enumerate(specs):
            key = f"c{index}-{item}"
            if server == "local":
                calls.append(ToolCall(key, f"local__{tool}", {"key": key, "steps": steps}))
            else:
                calls.append(ToolCall(key, tool, {"key": key, "steps": steps}, server=server))
        with anyio.fail_after(30):
            results = await d.dispatch(calls)
    assert all(result.ok for result in results), results
    executions = {execution.key: execution for execution in recorder.executions}
    assert len(executions) == len(calls) == len(recorder.executions)

    def keys(server: str, item: int) -> tuple[str, ...]:
        return {"a": (f"a/item:{item}",), "b": ("b",), "local": ("",)}[server]

    for j, (tool_j, server_j, item_j, _) in enumerate(specs):
        later = executions[calls[j].id]
        for i, (tool_i, server_i, item_i, _) in enumerate(specs[:j]):
            if "write" not in (tool_i, tool_j) or not conflicts(keys(server_i, item_i), keys(server_j, item_j)):
                continue
            earlier = executions[calls[i].id]
            assert earlier.end is not None and earlier.end < later.start, (calls[i].id, calls[j].id)


async def test_spans_carry_declared_keys_only() -> None:
    """A call's span has dispatcher.keys when keys were declared, and no such attribute on the root key."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def keyed(item: str) -> str:
        return item

    async def plain(item: str) -> str:
        return item

    async with Dispatcher(tracer_provider=provider) as d:
        d.add_function(keyed, domain="store", keys=lambda args: f"item:{args['item']}")
        d.add_function(plain)
        results = await d.dispatch([ToolCall("k", "keyed", {"item": "a"}), ToolCall("p", "plain", {"item": "a"})])
    assert all(result.ok for result in results)
    spans = {span.name: dict(span.attributes or {}) for span in exporter.get_finished_spans()}
    assert spans["execute_tool keyed"]["dispatcher.keys"] == ("store/item:a",)
    assert "dispatcher.keys" not in spans["execute_tool plain"]


async def test_a_held_call_whose_keys_fail_at_reclassification_stops_its_approval(tmp_path: pathlib.Path) -> None:
    """A call awaiting approval whose key function raises once its tool changed: FAILED, the approver stops."""
    seen: list[str] = []
    stopped = anyio.Event()

    def flaky(args: Mapping[str, Any]) -> str:
        seen.append(args["name"])
        if len(seen) > 1:
            raise LookupError("no key any more")
        return str(args["name"])

    async def approve(request: ApprovalRequest) -> bool:
        try:
            await anyio.sleep_forever()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    async with Dispatcher(approve=approve, approval=ApprovalPolicy(always={"flip:lookup"})) as d:
        await d.connect(
            "flip",
            flip_server.build(tmp_path),
            trusted=True,
            follow_changes=False,
            domain="flip",
            keys={"lookup": flaky},
        )
        async with d.batch() as batch:
            batch.submit(ToolCall("h", "hold", {}))
            lookup = batch.submit(ToolCall("l", "lookup", {"name": "x"}))
            with anyio.fail_after(30):
                while not (tmp_path / "flipped").exists():  # noqa: ASYNC110  # set by the server
                    await anyio.sleep(0.01)
                await d.refresh("flip")
                d.accept_changes("flip")
                result = await lookup.wait()
                await stopped.wait()
            (tmp_path / "release").touch()
    assert result.status is CallStatus.FAILED
    assert result.error is not None and "LookupError: no key any more" in result.error
    assert "start lookup" not in flip_server.log(tmp_path)
