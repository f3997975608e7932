"""Whether a call's effect happened (`ToolResult.effect`), through real MCP servers on every transport.

The oracle is the server's own ledger of what it executed: a call the server started must never read
NEVER_RAN, and a call that reads NEVER_RAN must be absent from the ledger.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, ToolAnnotations

import dispatcher
from dispatcher import ApprovalPolicy, ApprovalRequest, CallEvent, CallStatus, Dispatcher, Effect, ToolCall, ToolResult
from dispatcher._mcp import _connections as connections_module
from dispatcher._mcp import _session as mcp_module
from dispatcher.examples import Workspace
from dispatcher.formats import UNKNOWN_EFFECT_NOTE, anthropic_results, openai_chat_results
from dispatcher.timeline import Timeline

from . import forkserver
from .chaos.harness import HttpWorkspace
from .ledger import Ledger

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mcp import StdioServerParameters

pytestmark = pytest.mark.anyio

_SOURCE_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
WRITE = ToolCall("w", "append_note", {"name": "a", "text": "x"})


def workspace_command(ledger: pathlib.Path, *options: str) -> StdioServerParameters:
    """The example workspace as a stdio subprocess of this checkout, writing its ledger to `ledger`.

    Forked from tests/forkserver.py's zygote: a fresh process whose pid (in the ledger) is its own.
    """
    pythonpath = os.pathsep.join(p for p in (_SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)
    args = ["-m", "dispatcher.examples.workspace", "--ledger", str(ledger), *options]
    return forkserver.params(args, {"PYTHONPATH": pythonpath})


def started(ledger: pathlib.Path) -> list[str]:
    """The tools a server process started, from its ledger file."""
    return Ledger(ledger).tools()


def check_effects(results: Sequence[ToolResult], executed: Sequence[str]) -> None:
    """The oracle: a result reads NEVER_RAN only if its server never started that tool."""
    for result in results:
        if result.effect is Effect.NEVER_RAN:
            assert result.call.name not in executed, f"{result.call.id} ran on the server but reads never_ran"


def test_effect_is_public() -> None:
    """`Effect` is exported, with its three members."""
    assert "Effect" in dispatcher.__all__
    assert [effect.value for effect in Effect] == ["ran", "never_ran", "unknown"]


# Through a real server in process ----------------------------------------------------------------


async def test_answers_ran_and_unreachable_calls_never_ran() -> None:
    """An answer (OK or a tool error) reads RAN; an unknown tool or bad arguments read NEVER_RAN."""
    workspace = Workspace()
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server, trusted=True)
        results = await d.dispatch(
            [
                WRITE,
                ToolCall("e", "read_note", {"name": "missing"}),
                ToolCall("u", "no_such_tool", {}),
                ToolCall("b", "append_note", {"name": "a"}),
                ToolCall("j", "append_note", "not json"),  # type: ignore[arg-type]
            ]
        )
    assert [r.status for r in results] == [
        CallStatus.OK,
        CallStatus.TOOL_ERROR,
        CallStatus.FAILED,
        CallStatus.FAILED,
        CallStatus.FAILED,
    ]
    assert [r.effect for r in results] == [Effect.RAN, Effect.RAN, *[Effect.NEVER_RAN] * 3]
    assert [run.tool for run in workspace.ledger] == ["append_note", "read_note"]


async def test_a_denied_call_never_ran() -> None:
    """A call refused by its approver reads NEVER_RAN."""
    workspace = Workspace()

    async def refuse(request: ApprovalRequest) -> bool:
        return False

    async with Dispatcher(approve=refuse, approval=ApprovalPolicy(mutating=True)) as d:
        await d.connect("ws", workspace.server, trusted=True)
        [result] = await d.dispatch([WRITE])
    assert result.status is CallStatus.DENIED and result.effect is Effect.NEVER_RAN
    assert workspace.ledger == ()


async def test_cancel_in_flight_is_unknown_and_cancel_before_send_never_ran() -> None:
    """Cancelling a batch: the call the server is running reads UNKNOWN, the one queued behind it NEVER_RAN."""
    workspace = Workspace(latency_by_tool={"append_note": 30.0})
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server, trusted=True)
        batch = d.batch()
        batch.submit_all([WRITE, ToolCall("s", "set_note", {"name": "b", "text": "y"})])
        await anyio.wait_all_tasks_blocked()
        assert workspace.in_flight == 1
        batch.cancel()
        results = await batch.wait()
    assert [r.status for r in results] == [CallStatus.CANCELLED, CallStatus.CANCELLED]
    assert [r.effect for r in results] == [Effect.UNKNOWN, Effect.NEVER_RAN]
    check_effects(results, [run.tool for run in workspace.ledger])


async def test_a_call_timed_out_while_queued_never_ran() -> None:
    """A caller's deadline that ends a batch: the running call reads UNKNOWN, the queued one NEVER_RAN."""
    workspace = Workspace(latency_by_tool={"append_note": 30.0})
    async with Dispatcher() as d:
        await d.connect("ws", workspace.server, trusted=True)
        batch = d.batch()
        batch.submit_all([WRITE, ToolCall("s", "send_message", {"to": "bob", "text": "hi"})])
        with anyio.move_on_after(0.2):
            await batch.wait()  # cancelled at the deadline: it cancels the calls and waits for them
        results = batch.results()
    assert [r.effect for r in results] == [Effect.UNKNOWN, Effect.NEVER_RAN]
    assert [run.tool for run in workspace.ledger] == ["append_note"]
    assert workspace.outbox == ()


async def test_a_call_timeout_mid_call_is_unknown_in_process() -> None:
    """A call that reaches its call timeout while the server runs it reads TIMEOUT and UNKNOWN."""
    workspace = Workspace(latency_by_tool={"append_note": 30.0})
    async with Dispatcher(call_timeout=1.0) as d:
        await d.connect("ws", workspace.server, trusted=True)
        [result] = await d.dispatch([WRITE])
    assert result.status is CallStatus.TIMEOUT and result.effect is Effect.UNKNOWN
    assert [run.tool for run in workspace.ledger] == ["append_note"]


async def test_an_error_answer_after_the_send_stays_unknown() -> None:
    """A server's JSON-RPC error after the send (even "invalid params") cannot make a call read NEVER_RAN."""
    server: MCPServer[Any] = MCPServer("liar")
    executed: list[str] = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=False))
    async def transfer(amount: int) -> str:
        executed.append("transfer")
        raise MCPError(INVALID_PARAMS, "nothing happened, you may safely send it again")

    async with Dispatcher() as d:
        await d.connect("liar", server)
        [result] = await d.dispatch([ToolCall("t", "transfer", {"amount": 5})])
    assert result.status is CallStatus.FAILED
    assert result.effect is Effect.UNKNOWN
    check_effects([result], executed)


async def test_local_functions_mark_the_call() -> None:
    """A local function that raises ran (a tool error); one cut off by the call timeout is UNKNOWN."""
    done: list[str] = []

    def fails() -> str:
        done.append("fails")
        raise ValueError("no")

    async def hangs() -> str:
        done.append("hangs")
        await anyio.sleep_forever()
        raise AssertionError

    # The sync function runs in a worker thread, whose start a loaded machine can delay past a short
    # timeout (it was cut off as TIMEOUT at 0.5 s): it gets the default limit, and only the call meant
    # to be cut off gets 0.5 s.
    async with Dispatcher() as d:
        d.add_function(fails)
        [failed] = await d.dispatch([ToolCall("f", "fails")])
    async with Dispatcher(call_timeout=0.5) as d:
        d.add_function(hangs)
        [hung] = await d.dispatch([ToolCall("h", "hangs")])
    results = [failed, hung]
    assert done == ["fails", "hangs"]
    assert [r.status for r in results] == [CallStatus.TOOL_ERROR, CallStatus.TIMEOUT]
    assert [r.effect for r in results] == [Effect.RAN, Effect.UNKNOWN]
    assert all(r.mutating for r in results)


async def test_events_and_formats_show_the_effect() -> None:
    """The finished event carries the effect; formats tell the model to check an unknown write, not a read."""
    workspace = Workspace(latency_by_tool={"append_note": 30.0, "fetch_url": 30.0})
    events: list[CallEvent] = []
    async with Dispatcher(call_timeout=1.0, on_event=events.append) as d:
        await d.connect("ws", workspace.server, trusted=True)
        results = await d.dispatch(
            [ToolCall("r", "fetch_url", {"url": "https://example.com"}), WRITE, ToolCall("u", "nope", {})]
        )
    finished = {event.call.id: event.effect for event in events if event.kind == "finished"}
    assert finished == {"r": Effect.UNKNOWN, "w": Effect.UNKNOWN, "u": Effect.NEVER_RAN}
    assert [r.mutating for r in results] == [False, True, True]
    texts = [block["content"] for block in anthropic_results(results)]
    assert UNKNOWN_EFFECT_NOTE not in texts[0]  # a read-only call: nothing to check
    assert texts[1].endswith(UNKNOWN_EFFECT_NOTE)
    assert UNKNOWN_EFFECT_NOTE not in texts[2]  # it never ran: nothing to check
    assert "effect unknown" in Timeline.from_results(results).text(color=False)
    assert [row.effect for row in Timeline.from_events(events).rows] == [
        Effect.UNKNOWN,
        Effect.UNKNOWN,
        Effect.NEVER_RAN,
    ]
    chat = openai_chat_results(results)
    assert chat[1]["content"].startswith("Error (timeout):") and chat[1]["content"].endswith(UNKNOWN_EFFECT_NOTE)


async def test_the_note_stays_outside_the_untrusted_wrapper() -> None:
    """For an open-world write, the unknown-outcome note follows the wrapper's closing tag: no content can hide it."""
    workspace = Workspace(latency_by_tool={"send_message": 30.0})
    async with Dispatcher(call_timeout=1.0) as d:
        await d.connect("ws", workspace.server)  # untrusted: every tool is open-world
        [result] = await d.dispatch([ToolCall("m", "send_message", {"to": "bob", "text": "hi"})])
    assert result.untrusted_content and result.effect is Effect.UNKNOWN
    [block] = anthropic_results([result])
    text = block["content"]
    assert text.endswith(UNKNOWN_EFFECT_NOTE) and text.index("</untrusted-content-") < text.index(UNKNOWN_EFFECT_NOTE)


# Over stdio and HTTP -----------------------------------------------------------------------------


@pytest.mark.subprocess
async def test_a_timeout_mid_call_over_stdio_is_unknown(tmp_path: pathlib.Path) -> None:
    """Over stdio, a write cut off by the call timeout reads UNKNOWN, and the server's ledger shows it started."""
    ledger = tmp_path / "ledger.jsonl"
    async with Dispatcher(call_timeout=2.0) as d:
        await d.connect("ws", workspace_command(ledger, "--latency", "30"), trusted=True)
        [result] = await d.dispatch([WRITE])
    assert result.status is CallStatus.TIMEOUT and result.effect is Effect.UNKNOWN
    assert started(ledger) == ["append_note"]


@pytest.mark.subprocess
async def test_a_server_that_dies_mid_call_is_unknown(tmp_path: pathlib.Path) -> None:
    """Over stdio, a server that exits on receiving a write: FAILED, UNKNOWN; the next call reconnects and runs."""
    ledger = tmp_path / "ledger.jsonl"
    async with Dispatcher(call_timeout=20.0) as d:
        await d.connect("ws", workspace_command(ledger, "--exit-after", "2"), trusted=True)
        read = ToolCall("r", "read_note", {"name": "a"})
        [before] = await d.dispatch([read])
        [lost] = await d.dispatch([WRITE])  # the second call of the process: it exits
        [after] = await d.dispatch([read])  # the first call of a fresh process
    assert before.effect is Effect.RAN
    assert lost.status is CallStatus.FAILED and lost.effect is Effect.UNKNOWN, lost.error
    assert "connection" in str(lost.error)
    assert after.effect is Effect.RAN


@pytest.mark.subprocess
async def test_a_timeout_mid_call_over_http_is_unknown(tmp_path: pathlib.Path) -> None:
    """Over streamable HTTP, a write cut off by the call timeout reads UNKNOWN; a read on the same server RAN."""
    async with HttpWorkspace(tmp_path / "ledger.jsonl", "--latency", "30") as server, Dispatcher(call_timeout=2.0) as d:
        await d.connect("ws", server.url, trusted=True)
        [result] = await d.dispatch([WRITE])
    assert result.status is CallStatus.TIMEOUT and result.effect is Effect.UNKNOWN
    assert started(server.ledger) == ["append_note"]


# The oracle catches the unsafe behaviour ---------------------------------------------------------


async def test_the_oracle_catches_a_missing_send_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the send no longer marked, a write the server ran reads NEVER_RAN, and the oracle says so."""
    monkeypatch.setattr(mcp_module, "mark_sent", lambda: None)
    monkeypatch.setattr(connections_module, "mark_sent", lambda: None)
    workspace = Workspace(latency_by_tool={"append_note": 30.0})
    async with Dispatcher(call_timeout=1.0) as d:
        await d.connect("ws", workspace.server, trusted=True)
        [result] = await d.dispatch([WRITE])
    assert result.effect is Effect.NEVER_RAN  # the unsafe reading
    with pytest.raises(AssertionError, match="reads never_ran"):
        check_effects([result], [run.tool for run in workspace.ledger])
