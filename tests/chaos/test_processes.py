"""Real MCP servers in subprocesses, over stdio and HTTP, killed, stalled, cut off or slow mid-batch.

Each round starts the example workspace as a process that writes its ledger to a file (``--ledger``),
registers it twice (trusted, and untrusted), sends a batch of mixed calls and strikes while the batch
runs. The ledger files then say what each process really executed: no call may have run more often
than its tool allows, no exclusive call may have overlapped another, and after the fault a new batch
must run clean. Every child process is killed and reaped, even when a check fails.
"""

from __future__ import annotations

import os
import random
import signal
from typing import TYPE_CHECKING, Any, Literal

import anyio
import pytest

from dispatcher import CallStatus, Dispatcher, ReconnectPolicy, RetryPolicy, ToolCall
from tests.httpx_generators import HTTPX_GENERATORS
from tests.ledger import Ledger

from . import harness
from .harness import FIGURES, DroppingProxy, HttpWorkspace, call_key, scale
from .scenario import make_call

if TYPE_CHECKING:
    import pathlib
    from collections.abc import AsyncIterator

    from dispatcher import CallEvent, ToolResult

pytestmark = pytest.mark.anyio

Transport = Literal["stdio", "http"]
Fault = Literal["kill", "drop", "stall", "slow"]
_HERE = "tests/chaos/test_processes.py"

# (transport, fault): a stdio pipe cannot be dropped without killing the process, so "drop" is HTTP only.
CASES = [
    pytest.param(transport, fault, id=f"{transport}-{fault}", marks=[HTTPX_GENERATORS] if transport == "http" else [])
    for transport, fault in [
        ("stdio", "kill"),
        ("stdio", "stall"),
        ("stdio", "slow"),
        ("http", "kill"),
        ("http", "drop"),
        ("http", "stall"),
        ("http", "slow"),
    ]
]


# Reconnect backoff in tenths of a second, so a round does not wait out seconds of it; a quick ping.
# Stalls last 0.5 to 2 s: some outlast the ping after a timeout, which then drops the connection.
QUICK_RECONNECTS = ReconnectPolicy(wait_initial=0.05, wait_max=0.2, ping_timeout=1.0)


class Round:
    """One round: the servers, the dispatcher's view of them, and what the fault did."""

    def __init__(self, seed: int, transport: Transport, fault: Fault, tmp: pathlib.Path) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.transport = transport
        self.fault = fault
        self.tmp = tmp
        self.mode = self.rng.choice(("auto", "legacy"))
        self.ledgers = {"ws": Ledger(tmp / "ws.jsonl"), "raw": Ledger(tmp / "raw.jsonl")}
        if transport == "http":
            self.ledgers["raw"] = self.ledgers["ws"]  # one process serves both registrations
        self.options = ["--latency", "0.02"] if fault != "slow" else ["--latency", "0.15", "--saturation", "2"]
        self.call_timeout = 1.0 if fault in ("stall", "slow") else 10.0
        self.policy = RetryPolicy(attempts=3, wait_initial=0.01, wait_max=0.1, timeout=20.0, seed=seed)
        self.http: HttpWorkspace | None = None
        self.proxy: DroppingProxy | None = None
        self.events: list[CallEvent] = []
        self.calls: list[ToolCall] = []
        self.results: list[ToolResult] = []

    def where(self, test: str) -> str:
        """The failure context: the round's settings and how to replay its seed."""
        return (
            f"{self.transport}/{self.fault}/{self.mode}; "
            f"seed={self.seed}; replay: DISPATCHER_CHAOS_SEED={self.seed} pytest -q '{_HERE}::{test}'"
        )

    async def connect(self, d: Dispatcher) -> None:
        """Register the servers: trusted as "ws", untrusted as "raw"."""
        if self.transport == "stdio":
            for name in ("ws", "raw"):
                target = harness.workspace_stdio(self.ledgers[name].path, *self.options)
                await d.connect(
                    name,
                    target,
                    trusted=name == "ws",
                    mode=self.mode,  # type: ignore[arg-type]
                    reconnect=QUICK_RECONNECTS,
                )
        else:
            assert self.http is not None
            url = self.proxy.url() if self.proxy is not None else self.http.url
            for name in ("ws", "raw"):
                await d.connect(
                    name,
                    url,
                    trusted=name == "ws",
                    mode=self.mode,  # type: ignore[arg-type]
                    reconnect=QUICK_RECONNECTS,
                )

    async def strike(self) -> None:
        """The fault, at a random point of the batch (after a random number of calls reached a server)."""
        target = self.rng.choice(("ws", "raw"))
        on_target = sum(1 for call in self.calls if call.server == target)
        ledger = self.ledgers[target]
        reached = len(ledger.entries()) + self.rng.randint(1, max(1, on_target // 2))
        if self.fault == "drop":
            assert self.proxy is not None
            while True:
                await anyio.sleep(self.rng.uniform(0.01, 0.3))
                FIGURES.fault("http-connection-drop", self.proxy.drop())
        entry = await ledger.wait_for(reached)
        pid = entry.pid if self.http is None else self.http.pid
        if self.fault == "kill":
            FIGURES.fault(f"{self.transport}-sigkill")
            if self.http is not None:
                await self.http.kill()
            else:
                os.kill(pid, signal.SIGKILL)
        elif self.fault == "stall":
            FIGURES.fault(f"{self.transport}-sigstop")
            os.kill(pid, signal.SIGSTOP)
            try:
                await anyio.sleep(self.rng.uniform(0.5, 2.0))
            finally:
                os.kill(pid, signal.SIGCONT)

    async def reachable(self, d: Dispatcher) -> None:
        """Wait until each server answers a read again (at most a minute, however loaded the machine).

        A fixed pause is not enough: a loaded machine can take seconds to start a process or reconnect, and a
        batch sent before then fails without the dispatcher being at fault. The probes read a note no call
        of the round writes, so the ledger checks ignore them.
        """
        with anyio.fail_after(60):
            for name in ("ws", "raw"):
                for attempt in range(1_000_000):
                    probe = ToolCall(f"probe-{name}-{attempt}", "read_note", {"name": f"probe-{name}"}, server=name)
                    [result] = await d.dispatch([probe])
                    if result.status in (CallStatus.OK, CallStatus.TOOL_ERROR):
                        break
                    await anyio.sleep(QUICK_RECONNECTS.wait_max)

    async def batch(self, d: Dispatcher, prefix: str, size: int, *, strike: bool) -> list[ToolResult]:
        """Send a batch of mixed calls (striking meanwhile) and check its results; returns them."""
        calls = [make_call(self.rng, f"{prefix}-c{i}", "ws" if self.rng.random() < 0.6 else "raw") for i in range(size)]
        return await self.send(d, calls, strike=strike)

    async def clean_batch(self, d: Dispatcher, prefix: str, size: int) -> list[ToolResult]:
        """The batch after the fault; a call that ended TIMEOUT is sent again as a new call, up to 10 times.

        A slow server keeps its latency, close to ``call_timeout`` when calls pile up, and a loaded
        machine slows it further: a timeout alone says nothing about recovery. A dispatcher that did
        not recover times out (or fails) every time. Each call sent again gets its own id and
        arguments, so the ledger checks hold it to its own allowance. Returns each call's last result.
        """
        first = await self.batch(d, prefix, size, strike=False)
        final = list(first)
        for again in range(1, 10):
            late = [i for i, result in enumerate(final) if result.status is CallStatus.TIMEOUT]
            if not late:
                break
            calls = [_renamed(final[i].call, f"{first[i].call_id}-again{again}") for i in late]
            for i, result in zip(late, await self.send(d, calls, strike=False), strict=True):
                final[i] = result
        return final

    async def send(self, d: Dispatcher, calls: list[ToolCall], *, strike: bool) -> list[ToolResult]:
        """Dispatch `calls` (striking meanwhile) and check their results; returns them."""
        self.calls += calls
        # Every call alone, through every attempt and wait, plus reconnects: far more than any round needs.
        bound = 30 + len(calls) * (self.call_timeout * self.policy.attempts + 2)
        async with anyio.create_task_group() as tg:
            if strike:
                tg.start_soon(self.strike)
            try:
                with anyio.fail_after(bound):
                    results = await d.dispatch(calls)
            except TimeoutError:
                FIGURES.hangs += 1
                raise AssertionError(f"dispatch() did not return within {bound}s") from None
            finally:
                # A stall must end (SIGCONT) before the round goes on: let it finish, cancel the rest.
                if self.fault != "stall":
                    tg.cancel_scope.cancel()
        FIGURES.batches += 1
        FIGURES.calls += len(calls)
        assert not harness.check_results(calls, results)
        self.results += results
        return results

    def check_ledgers(self) -> list[str]:
        """What the processes executed against what each call allowed, and overlaps on each server."""
        tool_of = {call.id: call.name for call in self.calls}
        allowed = {call.id: harness.may_run(call, self.policy.attempts) for call in self.calls}
        ledgers = {id(ledger): ledger for ledger in self.ledgers.values()}.values()
        entries = [entry for ledger in ledgers for entry in ledger.entries()]
        problems = harness.count_executions(
            [call_key(e.tool, e.arguments) for e in entries], self.calls, allowed, tool_of=tool_of
        )
        for call, result in zip(self.calls, self.results, strict=True):
            if result.attempts > allowed[call.id]:
                problems.append(f"{call.id} made {result.attempts} attempts; at most {allowed[call.id]}")
        exclusive_ids = {call.id for call in self.calls if harness.must_run_alone(call)}
        exclusive = {call_key(call.name, call.arguments) for call in self.calls if call.id in exclusive_ids}
        for ledger in ledgers:
            problems += harness.check_server_overlaps(
                ledger.entries(),
                exclusive,
                harness.abandoned(self.results),
                retried=harness.retried(self.results),
                events=self.events,
            )
        problems += harness.check_exclusive_events(self.events, exclusive_ids)
        return problems


def _renamed(call: ToolCall, new_id: str) -> ToolCall:
    """`call` under a new id, its arguments (which name its id) naming the new one."""
    arguments = {key: str(value).replace(call.id, new_id) for key, value in (call.arguments or {}).items()}
    return ToolCall(new_id, call.name, arguments, server=call.server)


async def _servers(r: Round) -> AsyncIterator[None]:
    """Start what the round needs beyond the dispatcher (an HTTP server, a proxy); stop and reap it after."""
    if r.transport == "stdio":
        yield
        return
    async with HttpWorkspace(r.tmp / "ws.jsonl", *r.options) as http:
        r.http = http
        if r.fault == "drop":
            async with DroppingProxy(http.port) as proxy:
                r.proxy = proxy
                yield
        else:
            yield


async def play(seed: int, transport: Transport, fault: Fault, tmp: pathlib.Path) -> Round:
    """One round: connect, strike mid-batch, check, bring the server back, check the next batch runs clean."""
    from contextlib import asynccontextmanager

    r = Round(seed, transport, fault, tmp)
    before = [pid for pid, _, _ in harness.live_children()]
    try:
        async with asynccontextmanager(_servers)(r):
            d = Dispatcher(call_timeout=r.call_timeout, retry=r.policy, on_event=r.events.append)
            async with d:
                await r.connect(d)
                await r.batch(d, "b0", r.rng.randint(8, 20), strike=True)
                if fault == "kill" and r.http is not None:
                    await r.http.start()  # the server comes back, on the same port
                if fault == "drop":
                    assert r.proxy is not None
                    r.proxy.drop()
                await r.reachable(d)
                after = await r.clean_batch(d, "after", 6)
                problems = harness.check_idle(d)
            assert not problems, problems
        bad = [(res.call_id, res.status.value, res.error) for res in after if res.status is not CallStatus.OK]
        # Reads of notes nobody wrote answer with a tool error; everything else must have run.
        assert all(error and "there is no note" in error for _, _, error in bad), bad
        assert not r.check_ledgers()
    finally:
        leftovers = await harness.reaped(before)
    assert not leftovers, leftovers
    return r


@pytest.mark.parametrize(("transport", "fault"), CASES)
@pytest.mark.subprocess
async def test_servers_failing_mid_batch(
    anyio_backend: Any, transport: Transport, fault: Fault, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """Killed, stalled, cut-off or slow servers: one result per call, nothing unsafe twice, the next batch runs."""
    base = sum(map(ord, f"{transport}{fault}{anyio_backend}"))
    for seed in harness.seeds(scale(1, 8), base=base):
        folder = tmp_path / f"seed{seed}"
        folder.mkdir()
        r = Round(seed, transport, fault, folder)
        try:
            await play(seed, transport, fault, folder)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{r.where(request.node.name)}") from exc


@pytest.mark.subprocess
async def test_the_leftover_check_sees_forked_children(anyio_backend: Any) -> None:
    """A process forked from the zygote (as every server of this suite is) counts as left behind until it is reaped."""
    import subprocess
    import sys

    from tests import forkserver

    before = [pid for pid, _, _ in harness.live_children()]
    child = forkserver.spawn([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL)
    saved = FIGURES.snapshot()
    try:
        assert child.pid in [pid for pid, _, _ in harness.live_children()]
        assert any(str(child.pid) in problem for problem in harness.check_children(before))
    finally:
        FIGURES.restore(saved)  # a leak on purpose: not the suite's figures
        child.kill()
        assert await child.exited() == -9
    assert await harness.reaped(before) == []
