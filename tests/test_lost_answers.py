"""Chaos: answers dropped after the server applied the write (seeded 10% and 30%), over stdio and HTTP.

The answers are lost two ways: the server's fault injector replaces them with -32000 (the connection stays),
or a proxy cuts the TCP connection once the server has answered (the client reconnects).

The oracle is the server's own state: each call appends a distinct line to one note, so the note says how
many times each write was applied. On a key-honouring server every write is applied exactly once; on a
server without keys no write is repeated, and every write whose answer was lost reads UNKNOWN.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from dispatcher import CallStatus, Dispatcher, Effect, IdempotencyKeys, RetryPolicy, ToolCall, ToolResult
from dispatcher.examples import Workspace
from dispatcher.examples._http import serve_http

from . import forkserver
from .chaos.harness import DroppingProxy, scale

if TYPE_CHECKING:
    from mcp import StdioServerParameters

pytestmark = pytest.mark.anyio

_SOURCE_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
CALLS = 100
RETRY = RetryPolicy(attempts=3, wait_initial=0.005, wait_max=0.01, seed=1)


def options(rate: float, keyed: bool, seed: int) -> list[str]:
    """The workspace's command-line options: lost answers on append_note, keys if `keyed`."""
    found = [
        *("--fault-rate", str(rate), "--fault-seed", str(seed), "--fault-tools", "append_note"),
        *("--fault-kinds", "drop", "--fault-strike", "after"),
    ]
    return [*found, "--idempotency-key", "idempotency_key"] if keyed else found


def stdio(*args: str) -> StdioServerParameters:
    """The workspace over stdio, forked from tests/forkserver.py's zygote: a fresh process for each test."""
    pythonpath = os.pathsep.join(p for p in (_SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)
    return forkserver.params(["-m", "dispatcher.examples.workspace", *args], {"PYTHONPATH": pythonpath})


served = contextlib.contextmanager(forkserver.http_workspace)
"""The workspace over HTTP, forked from the zygote, for a `with` block."""


async def run(d: Dispatcher, target: Any, keyed: bool, calls: int = CALLS) -> tuple[list[ToolResult], list[str]]:
    """Send `calls` appends one batch at a time (as a model does), then read back the note."""
    await d.connect(
        "ws", target, trusted=True, idempotency=IdempotencyKeys(argument="idempotency_key") if keyed else None
    )
    results = []
    for i in range(calls):
        [result] = await d.dispatch([ToolCall(f"c{i}", "append_note", {"name": "log", "text": f"w{i}"})])
        results.append(result)
    [note] = await d.dispatch([ToolCall("read", "read_note", {"name": "log"})])
    assert note.ok, note.error
    assert note.result is not None
    lines = str(getattr(note.result.content[0], "text", "")).splitlines()
    return results, lines


def check(results: list[ToolResult], lines: list[str], keyed: bool, rate: float) -> None:
    """The oracle, from the note's lines: how often each write was applied, against what each result says."""
    calls = len(results)
    applied = {f"w{i}": lines.count(f"w{i}") for i in range(calls)}
    assert max(applied.values()) <= 1, "a write was applied twice"
    for i, result in enumerate(results):
        text = f"w{i}"
        if result.effect is Effect.NEVER_RAN:
            assert applied[text] == 0, f"{result.call.id} was applied but reads never_ran"
        if result.effect is Effect.RAN and result.ok:
            assert applied[text] == 1
        if applied[text] == 1 and not result.ok:
            assert result.effect is Effect.UNKNOWN, f"{result.call.id} was applied, its answer lost: {result.effect}"
    if keyed:
        # Every attempt runs (the answer is lost after): each write was applied, once, whatever its result.
        assert all(count == 1 for count in applied.values()), "every write applied exactly once"
        assert all(result.effect is Effect.UNKNOWN for result in results if not result.ok)
        # Each attempt is lost independently with probability `rate` (a replayed answer too): 1/(1-rate)
        # attempts per call expected (1.11 at 10%, 1.43 at 30%), with room for 100 calls' sampling (about
        # two standard errors for fewer calls).
        mean = sum(result.attempts for result in results) / calls
        room = 0.1 if calls >= CALLS else 2 * math.sqrt(rate) / (1 - rate) / math.sqrt(calls)
        assert mean <= 1 / (1 - rate) + room, mean
    else:
        assert all(result.attempts == 1 for result in results), "a non-idempotent write was repeated"
        lost = [result for result in results if not result.ok]
        assert lost, "the seeded faults struck nothing"
        assert all(result.effect is Effect.UNKNOWN for result in lost)


@pytest.mark.parametrize("keyed", [True, False], ids=["keys", "no-keys"])
@pytest.mark.parametrize("rate", [0.1, 0.3])
@pytest.mark.subprocess
async def test_lost_answers_over_stdio(rate: float, keyed: bool) -> None:
    """Over stdio: with keys, each write applied once; without, none repeated and every lost one UNKNOWN."""
    async with Dispatcher(retry=RETRY, call_timeout=30) as d:
        results, lines = await run(d, stdio(*options(rate, keyed, seed=3)), keyed)
    check(results, lines, keyed, rate)


@pytest.mark.parametrize("keyed", [True, False], ids=["keys", "no-keys"])
@pytest.mark.subprocess
async def test_lost_answers_over_http(tmp_path: pathlib.Path, keyed: bool) -> None:
    """Over streamable HTTP, at 30% lost answers: the same guarantees."""
    with served(tmp_path, *options(0.3, keyed, seed=5), latency=None) as (url, _):
        async with Dispatcher(retry=RETRY, call_timeout=30) as d:
            with anyio.fail_after(120):
                results, lines = await run(d, url, keyed)
    check(results, lines, keyed, 0.3)


async def test_the_oracle_catches_repeated_writes() -> None:
    """The check fails when a write is applied twice, or a lost one reads never_ran."""
    results = [ToolResult(ToolCall(f"c{i}", "append_note"), CallStatus.OK, effect=Effect.RAN) for i in range(CALLS)]
    lines = [f"w{i}" for i in range(CALLS)]
    with pytest.raises(AssertionError, match="applied twice"):
        check(results, [*lines, "w0"], keyed=True, rate=0.1)
    lost = [ToolResult(ToolCall("c0", "append_note"), CallStatus.FAILED, effect=Effect.NEVER_RAN), *results[1:]]
    with pytest.raises(AssertionError, match="reads never_ran"):
        check(lost, lines, keyed=False, rate=0.1)


@pytest.mark.parametrize("keyed", [True, False], ids=["keys", "no-keys"])
async def test_answers_lost_to_real_cuts_over_http(keyed: bool) -> None:
    """30% of the answers cut off on the wire (a TCP cut once the server answered): the same guarantees.

    Each cut costs a reconnection (about 0.2 s): 20 calls here, 100 under ``make stress``.
    """
    workspace = Workspace(idempotency_key="idempotency_key" if keyed else None)
    async with serve_http(workspace.server, shutdown_timeout=0.5) as url:
        async with DroppingProxy(int(url.rsplit(":", 1)[1].split("/")[0])) as proxy:
            proxy.lose_answers(b'"append_note"', rate=0.3, seed=7)
            async with Dispatcher(retry=RETRY, call_timeout=30) as d:
                with anyio.fail_after(120):
                    results, lines = await run(d, proxy.url(), keyed, scale(20, CALLS))
    assert proxy.answers_lost > 0
    check(results, lines, keyed, 0.3)
