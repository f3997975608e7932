"""Servers that answer badly: malformed JSON-RPC, schema-violating or enormous results, a crash mid-call.

`badserver.py` is a raw stdio server that breaks the protocol in the way each tool's name says. Each
bad answer must end its own call with a clear error (or, when the SDK cannot tell which call a garbled
line belonged to, a timeout), the calls beside it must succeed, and the next batch must run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import anyio
import pytest

from dispatcher import CallStatus, Dispatcher, ReconnectPolicy, ToolCall

from . import harness
from .harness import FIGURES, scale

if TYPE_CHECKING:
    from dispatcher import ToolResult

pytestmark = pytest.mark.anyio

Mode = Literal["auto", "legacy"]
MODES = pytest.mark.parametrize("mode", ["auto", "legacy"])

# What each bad answer gives its call: a status, and words its error must contain.
EXPECTED: dict[str, tuple[CallStatus, str]] = {
    "garbage_then_echo": (CallStatus.OK, ""),
    "twice": (CallStatus.OK, ""),
    "error_flag_text": (CallStatus.TOOL_ERROR, ""),
    "bad_content": (CallStatus.FAILED, "the server's answer is malformed"),
    "bad_block": (CallStatus.FAILED, "the server's answer is malformed"),
    "unknown_block": (CallStatus.FAILED, "the server's answer is malformed"),
    "structured": (CallStatus.FAILED, "Invalid structured content returned by tool structured"),
    # A line the SDK cannot parse cannot be matched to its call: the call times out.
    "garbage": (CallStatus.TIMEOUT, "no result within call_timeout"),
    "not_jsonrpc": (CallStatus.TIMEOUT, "no result within call_timeout"),
    "null_result": (CallStatus.TIMEOUT, "no result within call_timeout"),
    "empty_response": (CallStatus.TIMEOUT, "no result within call_timeout"),
    "bad_error": (CallStatus.TIMEOUT, "no result within call_timeout"),
    "wrong_id": (CallStatus.TIMEOUT, "no result within call_timeout"),
}


def check(calls: list[ToolCall], results: list[ToolResult]) -> None:
    """One result per call in order, counted in the figures."""
    FIGURES.batches += 1
    FIGURES.calls += len(calls)
    assert not harness.check_results(calls, results)


@MODES
@pytest.mark.subprocess
async def test_bad_answers_fail_their_own_call(anyio_backend: Any, mode: Mode) -> None:
    """Every kind of malformed answer ends its own call clearly; the good calls beside them succeed."""
    before = [pid for pid, _, _ in harness.live_children()]
    try:
        # 3 s: the answers that cannot be matched wait it out together; every other call, a subprocess
        # round trip of a few milliseconds, has room for a loaded machine to stall it.
        async with Dispatcher(call_timeout=3.0) as d:
            await d.connect("bad", harness.badserver_stdio(), trusted=True, mode=mode)
            for round_ in range(scale(1, 5)):
                calls = []
                for name in EXPECTED:
                    calls.append(ToolCall(f"{name}", name, {"key": name}))
                    calls.append(ToolCall(f"{name}-sibling", "echo", {"key": f"{name}-sibling"}))
                with anyio.fail_after(30):
                    results = await d.dispatch(calls)
                check(calls, results)
                FIGURES.fault("malformed-answer", len(EXPECTED))
                after = await d.dispatch([ToolCall("after", "echo", {"key": "after"})])
                assert not harness.check_idle(d)
                by_id = {result.call_id: result for result in results}
                for name, (status, words) in EXPECTED.items():
                    result = by_id[name]
                    assert result.status is status, (round_, name, result.status, result.error)
                    assert words in (result.error or ""), (name, result.error)
                    assert by_id[f"{name}-sibling"].ok, (name, by_id[f"{name}-sibling"].error)
                assert after[0].ok
    finally:
        leftovers = await harness.reaped(before)
    assert not leftovers


@MODES
@pytest.mark.subprocess
async def test_an_enormous_answer_over_stdio(anyio_backend: Any, mode: Mode) -> None:
    """A 20 MB result over a stdio pipe arrives whole under a cap set above it, and the calls beside it succeed.

    The default cap (16 MiB) fails such an answer alone: tests/test_limits.py.
    """
    size = 20_000_000
    async with Dispatcher(call_timeout=60) as d:
        await d.connect("bad", harness.badserver_stdio(), trusted=True, mode=mode, max_answer_bytes=64 * 2**20)
        calls = [
            ToolCall("huge", "huge", {"key": "x", "size": size}),
            ToolCall("small", "echo", {"key": "small"}),
        ]
        with anyio.fail_after(120):
            results = await d.dispatch(calls)
    check(calls, results)
    FIGURES.fault("enormous-answer")
    assert all(result.ok for result in results), [result.error for result in results]
    assert results[0].result is not None
    assert len(results[0].result.content[0].text) == size  # type: ignore[union-attr]


@MODES
@pytest.mark.subprocess
async def test_a_server_that_exits_mid_call(anyio_backend: Any, mode: Mode) -> None:
    """A server process that exits while answering: its calls fail as lost, and the next batch starts a new one."""
    before = [pid for pid, _, _ in harness.live_children()]
    try:
        async with Dispatcher(call_timeout=30) as d:
            await d.connect("bad", harness.badserver_stdio(), trusted=True, mode=mode)
            calls = [ToolCall("exit", "exit", {"key": "x"})]
            with anyio.fail_after(30):
                results = await d.dispatch(calls)
            check(calls, results)
            FIGURES.fault("server-exit")
            after = await d.dispatch([ToolCall("after", "echo", {"key": "after"})])
    finally:
        leftovers = await harness.reaped(before)
    assert not leftovers
    assert results[0].status is CallStatus.FAILED
    assert "connection to the server lost" in str(results[0].error)
    assert after[0].ok, after[0].error


@MODES
@pytest.mark.subprocess
async def test_a_line_that_is_not_utf8_does_not_wedge_the_connection(anyio_backend: Any, mode: Mode) -> None:
    """After bytes that are not UTF-8 stop the SDK reading a stdio server, the dispatcher replaces the connection.

    The wedged call times out after 0.5 s; then the ping (2 s: room for a loaded machine to answer one on a
    healthy connection) finds the connection dead. Calls after it are retried until one runs on the new
    process: under load one may time out or meet the connection while it is replaced, and only a minute
    without any success fails the test.
    """
    before = [pid for pid, _, _ in harness.live_children()]
    try:
        async with Dispatcher(call_timeout=0.5) as d:
            await d.connect(
                "bad", harness.badserver_stdio(), trusted=True, mode=mode, reconnect=ReconnectPolicy(ping_timeout=2.0)
            )
            with anyio.fail_after(90):
                [wedged] = await d.dispatch([ToolCall("utf8", "bad_utf8", {"key": "x"})])
                FIGURES.fault("invalid-utf8")
                # The connection was found dead and replaced: calls after it run on a new process.
                with anyio.fail_after(60):
                    while True:
                        [after] = await d.dispatch([ToolCall("after", "echo", {"key": "after"})])
                        if after.ok:
                            break
                        await anyio.sleep(0.1)
            FIGURES.batches += 2
            FIGURES.calls += 2
    finally:
        leftovers = await harness.reaped(before)
    assert not leftovers
    assert wedged.status is CallStatus.TIMEOUT
    assert after.ok, after.error
