"""What the chaos suite shares: its scale, its figures, the invariant checks and the servers it breaks.

The suite runs in two forms. `make test` runs the quick form; `make stress` sets ``DISPATCHER_STRESS=1``,
which makes every test run more seeds, more batches and more examples, and also runs the tests
marked ``stress``. Both forms add what they did to `FIGURES`; the session prints the totals and, in
the stress form, writes them to ``tests/chaos/results/stress.json`` (see RELIABILITY.md).

The invariants, checked after every batch:

- every call gets exactly one result, in call order (`check_results`);
- no call runs more often than it may: at most once unless its tool is idempotent by a trusted
  source, and never more often than the attempts the retry policy allows (`count_executions`);
- no exclusive call overlaps another call in the dispatcher (`check_exclusive_events`), nor on the
  server (`check_server_overlaps`, from the server's own ledger);
- nothing is left behind: the gate is idle with nothing running, no batch is live, workers are
  bounded, no worker thread token is held (`check_idle`), child processes are reaped (`live_children`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
from mcp import Client

import dispatcher
from dispatcher import CallStatus, Dispatcher, ToolCall, ToolResult
from tests import forkserver
from tests.cuttable import CuttableTransport

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from mcp import StdioServerParameters
    from mcp.server.mcpserver import MCPServer

    from dispatcher import CallEvent
    from tests.ledger import Entry

STRESS = os.environ.get("DISPATCHER_STRESS", "") not in ("", "0")
"""Whether this is the long form (`make stress`)."""

SOURCE_ROOT = pathlib.Path(dispatcher.__file__).resolve().parents[1]
RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def scale(quick: int, stress: int) -> int:
    """The quick figure, or the stress one under `make stress`."""
    return stress if STRESS else quick


# Figures -----------------------------------------------------------------------------------------


@dataclass
class Figures:
    """What the suite did and what it found, summed over the session."""

    batches: int = 0
    calls: int = 0
    faults_injected: int = 0
    fault_kinds: Counter[str] = field(default_factory=Counter)
    executed_twice: int = 0
    results_lost: int = 0
    hangs: int = 0
    exclusive_overlaps: int = 0
    leaks: int = 0
    cancellations: int = 0
    retried_after_cancel: int = 0
    server_overlaps_after_abandoned_calls: int = 0

    def fault(self, kind: str, count: int = 1) -> None:
        """Count injected faults of one kind."""
        if count:
            self.faults_injected += count
            self.fault_kinds[kind] += count

    def snapshot(self) -> dict[str, Any]:
        """A copy of the figures so far, for `restore`."""
        return copy.deepcopy(vars(self))

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Go back to a `snapshot` (for tests whose runs must not count, such as checks of the checks)."""
        vars(self).update(copy.deepcopy(snapshot))

    def as_json(self) -> dict[str, Any]:
        """The figures as plain JSON data."""
        data = dataclasses.asdict(self)
        data["fault_kinds"] = dict(sorted(self.fault_kinds.items()))
        return data

    def add(self, data: dict[str, Any]) -> None:
        """Add the figures of another process (an `as_json` from a pytest-xdist worker)."""
        for name, value in data.items():
            if name == "fault_kinds":
                self.fault_kinds.update(value)
            else:
                setattr(self, name, getattr(self, name) + value)


FIGURES = Figures()


# Invariants --------------------------------------------------------------------------------------


def check_results(calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> list[str]:
    """Every call has exactly one result, in call order; returns the violations (and counts them as lost)."""
    problems: list[str] = []
    if len(results) != len(calls):
        problems.append(f"{len(calls)} calls but {len(results)} results")
    for position, (call, result) in enumerate(zip(calls, results, strict=False)):
        if result.call is not call:
            problems.append(f"result {position} answers {result.call_id!r}, not {call.id!r}")
    FIGURES.results_lost += len(problems)
    return problems


# The oracle: what the example workspace's tools really are (its annotations are honest), written out
# here rather than read from the dispatcher, so the checks do not share the logic they check.
READ_ONLY_TOOLS = frozenset({"search_notes", "read_note", "fetch_url"})
IDEMPOTENT_TOOLS = frozenset({"set_note", "delete_note"})
TRUSTED_SERVERS = frozenset({"ws"})


def must_run_alone(call: ToolCall) -> bool:
    """Whether a workspace call must run alone: anything but a read of a trusted registration."""
    return not (call.server in TRUSTED_SERVERS and call.name in READ_ONLY_TOOLS)


def may_run(call: ToolCall, attempts: int, *, retry_read_only: bool = False) -> int:
    """How often a workspace call may reach the server: `attempts` if it is safe to repeat, else once."""
    trusted = call.server in TRUSTED_SERVERS
    safe = call.name in IDEMPOTENT_TOOLS or (retry_read_only and call.name in READ_ONLY_TOOLS)
    return attempts if trusted and safe else 1


def call_key(tool: str, arguments: Mapping[str, Any] | None) -> str:
    """A call's identity on the server: its tool and its arguments (the suite makes them unique)."""
    return f"{tool} {json.dumps(arguments or {}, sort_keys=True)}"


def count_executions(
    executed: Iterable[str], calls: Sequence[ToolCall], allowed: Mapping[str, int], *, tool_of: Mapping[str, str]
) -> list[str]:
    """Check how often each call reached its server against how often it may.

    Args:
        executed: The `call_key` of every execution the server's ledger recorded.
        calls: The calls sent.
        allowed: The most executions each call id may have (1 for a call that must not be repeated).
        tool_of: The server's own tool name of each call id.

    Returns:
        The violations; each call executed more often than allowed is counted in `FIGURES`.
    """
    seen = Counter(executed)
    problems = []
    for call in calls:
        runs = seen[call_key(tool_of[call.id], call.arguments)]
        if runs > allowed[call.id]:
            problems.append(f"call {call.id!r} ({tool_of[call.id]}) executed {runs} times; at most {allowed[call.id]}")
            FIGURES.executed_twice += 1
    return problems


def check_exclusive_events(events: Sequence[CallEvent], exclusive: set[str]) -> list[str]:
    """In the dispatcher, an exclusive call never runs while another call runs.

    Reads the order of the ``started`` and ``finished`` events (not their times, which a virtual clock
    may make equal): when an exclusive call starts nothing may be running, and nothing may start
    before it has finished.
    """
    running: set[str] = set()
    problems = []
    for event in events:
        call_id = event.call.id
        if event.kind == "started":
            if running and (call_id in exclusive or running & exclusive):
                problems.append(f"{call_id!r} started while {sorted(running)} were running")
            running.add(call_id)
        elif event.kind == "finished":
            running.discard(call_id)
    FIGURES.exclusive_overlaps += len(problems)
    return problems


def check_idle(d: Dispatcher) -> list[str]:
    """Nothing is queued or running, no batch waits for a result and no thread token is held."""
    problems = []
    if not d.idle or d.running:
        problems.append(f"the dispatcher is not idle: {d.running} running, idle={d.idle}")
    borrowed = anyio.to_thread.current_default_thread_limiter().borrowed_tokens
    if borrowed:
        problems.append(f"{borrowed} worker thread tokens are still borrowed")
    FIGURES.leaks += len(problems)
    return problems


async def dispatch_until_answered(
    d: Dispatcher, calls: Sequence[ToolCall], *, rounds: int, trace: list[str] | None = None
) -> tuple[list[ToolResult], list[str]]:
    """Dispatch `calls`, then again those that ended TIMEOUT, up to `rounds` dispatches in all.

    For checks that a dispatcher serves calls again after faults, on a real clock: a loaded machine can
    stall the event loop past a short ``call_timeout``, while a dispatcher that does not recover times
    out (or fails) in every round. With ``rounds=1`` (a virtual clock) this is one plain `dispatch`.

    Returns:
        Each call's last result, in call order, and the `check_results` violations of every round.
        Each round after the first is noted in `trace`, when given.
    """
    last: dict[str, ToolResult] = {}
    problems: list[str] = []
    pending = list(calls)
    for round_ in range(1, rounds + 1):
        if round_ > 1 and trace is not None:
            trace.append(f"round {round_}: {' '.join(call.id for call in pending)} again after a timeout")
        results = await d.dispatch(pending)
        problems += check_results(pending, results)
        last.update((result.call_id, result) for result in results)
        pending = [result.call for result in results if result.status is CallStatus.TIMEOUT]
        if not pending:
            break
    return [last[call.id] for call in calls if call.id in last], problems


def replay_hint(test: str, seed: int) -> str:
    """How to run one seed of a test again, for failure messages."""
    return (
        f"seed={seed}; replay it with: DISPATCHER_CHAOS_SEED={seed} {sys.executable} -m pytest -q '{test}' "
        f"(or print its trace: {sys.executable} -m tests.chaos.replay {seed})"
    )


def seeds(count: int, base: int = 0) -> list[int]:
    """The seeds a test runs: `count` of them, or only ``DISPATCHER_CHAOS_SEED`` when it is set."""
    chosen = os.environ.get("DISPATCHER_CHAOS_SEED")
    if chosen:
        return [int(chosen)]
    return list(range(base, base + count))


# An in-process connection that can be cut ---------------------------------------------------------


class Cuttable:
    """An in-process server reached through connections that a test can cut, the way a crash cuts a pipe.

    Pass `client` to `Dispatcher.connect` as the client factory. `cut()` ends every open connection:
    the client sees its connection closed; the server side is left to notice by itself, as it would
    after a network failure.
    """

    def __init__(self, server: MCPServer[Any], mode: str = "auto") -> None:
        self.server = server
        self.mode = mode
        self.connections = 0
        self.cuts = 0
        self.live: set[anyio.CancelScope] = set()

    def client(self) -> Client:
        """A new client over a new connection."""
        self.connections += 1
        return Client(CuttableTransport(self.server, self.live), mode=self.mode)

    def cut(self) -> int:
        """Cut every open connection; returns how many were cut."""
        live = list(self.live)
        for scope in live:
            scope.cancel()
        self.cuts += len(live)
        return len(live)


# Processes ---------------------------------------------------------------------------------------


def python_env() -> dict[str, str]:
    """The environment a server subprocess needs to import this checkout."""
    pythonpath = os.pathsep.join(p for p in (str(SOURCE_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": pythonpath}


def workspace_stdio(ledger: pathlib.Path, *options: str) -> StdioServerParameters:
    """The example workspace as a stdio server of this checkout, writing its ledger to a file.

    A child forked from tests/forkserver.py's zygote, which imported the SDK once: a fresh process for a
    tenth of a new interpreter's CPU. The pid in its ledger is its own, so a signal sent to it reaches it.
    """
    return forkserver.params(["-m", "dispatcher.examples.workspace", "--ledger", str(ledger), *options], python_env())


def badserver_stdio() -> StdioServerParameters:
    """The malformed-answer server (`tests/chaos/badserver.py`) as a stdio server, forked from the zygote."""
    return forkserver.params([str(pathlib.Path(__file__).with_name("badserver.py"))])


def live_children() -> list[tuple[int, str, str]]:
    """This process's child processes, as ``(pid, state, command line)``: zombies count (not reaped).

    The children of tests/forkserver.py's zygote count as this process's own: each is a process a test
    of this process asked for (a stdio server behind its launcher, an HTTP server).
    """
    parents = {os.getpid(), forkserver.zygote_pid()} - {None}
    children = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # it ended while we looked
        # The command name is in parentheses and may hold spaces: the fields after it are fixed.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) in parents:
            children.append((int(entry.name), state, cmdline))
    return children


def check_children(before: Iterable[int]) -> list[str]:
    """Child processes started since `before` that are still alive or not reaped."""
    known = set(before)
    problems = [
        f"child process {pid} ({state}) still there: {cmdline}"
        for pid, state, cmdline in live_children()
        if pid not in known
    ]
    FIGURES.leaks += len(problems)
    return problems


async def reaped(before: Iterable[int], within: float = 10.0) -> list[str]:
    """`check_children`, after giving children that were just killed `within` seconds to be reaped."""
    with anyio.move_on_after(within):
        while check_children_quiet(before):  # noqa: ASYNC110  # processes end outside the loop: nothing to wait on
            await anyio.sleep(0.05)
    return check_children(before)


def check_children_quiet(before: Iterable[int]) -> bool:
    """Whether any child started since `before` is still there (without counting it)."""
    known = set(before)
    return any(pid not in known for pid, _, _ in live_children())


def check_server_overlaps(
    entries: Sequence[Entry],
    exclusive: set[str],
    abandoned: set[str],
    *,
    retried: set[str] | frozenset[str] = frozenset(),
    events: Sequence[CallEvent] = (),
) -> list[str]:
    """On the server, an exclusive call never ran while another call of the same process ran.

    `exclusive`, `abandoned` and `retried` hold `call_key`s (`abandoned(results)`, `retried(results)`). An overlap
    with a call the client had abandoned (it timed out, was cancelled or lost its connection while the
    server went on running it) is the documented exception (RELIABILITY.md, "What it cannot prove"):
    after a lost answer, the client cannot know when the server stops. It is counted in `FIGURES`, not
    reported, within its bound: the dispatcher gave the abandoned call up (an attempt retried, or its
    result) before it started the call that overlapped it, in the order of `events` (when given). An
    overlap the dispatcher started while it still waited for the other call is reported.

    A call retried and then answered counts as abandoned only when the server ran it more than once
    (the ledger cannot tell which execution was answered); one that ran once was answered there.
    A process killed mid-call ends all its calls at once.
    """
    runs = Counter(call_key(entry.tool, entry.arguments) for entry in entries)
    gave_up: dict[str, int] = {}  # a call's key -> the first event at which the dispatcher stopped waiting on it
    began: dict[str, int] = {}  # a call's key -> the event at which its last attempt started
    for index, event in enumerate(events):
        called = call_key(event.call.name, event.call.arguments)
        if event.kind in ("retried", "finished"):
            gave_up.setdefault(called, index)
        if event.kind in ("started", "retried"):
            began[called] = index
    never = len(events)
    problems = []
    timeline: list[tuple[int, int, str, Entry]] = []
    for entry in entries:
        timeline.append((entry.start, 1, "start", entry))
        if entry.end is not None:
            timeline.append((entry.end, 0, "end", entry))
    running: dict[tuple[int, int], Entry] = {}
    for _, _, kind, entry in sorted(timeline, key=lambda event: (event[0], event[1])):
        key = (entry.pid, entry.seq)
        if kind == "end":
            running.pop(key, None)
            continue
        # Calls of other (dead) processes ended with them.
        for other_key in [k for k, other in running.items() if other.pid != entry.pid]:
            del running[other_key]
        me = call_key(entry.tool, entry.arguments)
        others = [call_key(other.tool, other.arguments) for other in running.values()]
        # The calls this one must not overlap: all of them if it is exclusive, else the exclusive ones. Two
        # reads that overlap each other beside an abandoned write are the documented exception only.
        clashing = [other for other in others if me in exclusive or other in exclusive]
        if clashing:
            given_up = all(other in abandoned or (other in retried and runs[other] > 1) for other in clashing)
            in_order = all(gave_up.get(other, never) <= began.get(me, never) for other in clashing) if events else True
            if given_up and in_order:
                FIGURES.server_overlaps_after_abandoned_calls += 1
            else:
                why = "" if given_up else " (answered calls)"
                why = why or " before the dispatcher gave them up"
                problems.append(f"{me} started on the server while {clashing} ran{why}")
                FIGURES.exclusive_overlaps += 1
        running[key] = entry
    return problems


class HttpWorkspace:
    """The example workspace as an HTTP server process that a test can kill, stall and restart.

    A child forked from tests/forkserver.py's zygote (`forkserver.spawn`), which imported the SDK and
    uvicorn once; its pid is its own, and signals reach it through a pidfd. Always used with `async
    with`: on exit the process is killed (if it still runs) and reaped.
    """

    def __init__(self, ledger: pathlib.Path, *options: str) -> None:
        self.ledger = ledger
        self.options = options
        self.process: forkserver.Forked | None = None
        self.url = ""
        self.port = 0
        self.starts = 0

    async def start(self) -> str:
        """Start the server (on the port it had before, if it ran before); return its URL."""
        assert self.process is None
        args = [
            sys.executable,
            "-m",
            "dispatcher.examples.workspace",
            "--http",
            "--port",
            str(self.port),
            "--ledger",
            str(self.ledger),
            *self.options,
        ]
        process = forkserver.spawn(
            args, stdout=subprocess.PIPE, cwd=str(SOURCE_ROOT), env={**os.environ, **python_env()}
        )
        self.process = process
        self.starts += 1
        assert process.stdout is not None
        fd = process.stdout.fileno()
        # Bounds a hang only: the zygote imported the SDK, so the child serves within a second or so, but
        # a loaded machine can stall a process for many.
        with anyio.fail_after(120):
            buffer = b""
            while b"\n" not in buffer:
                await anyio.wait_readable(fd)
                chunk = os.read(fd, 4096)
                assert chunk, f"the workspace ended before it printed its URL: {buffer!r}"
                buffer += chunk
        line = buffer.split(b"\n", 1)[0].decode()
        assert line.startswith("MCP_URL="), line
        self.url = line.removeprefix("MCP_URL=")
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        return self.url

    @property
    def pid(self) -> int:
        """The server process's id."""
        assert self.process is not None
        return self.process.pid

    async def kill(self) -> None:
        """SIGKILL the server and reap it."""
        process, self.process = self.process, None
        if process is None:
            return
        with anyio.CancelScope(shield=True):
            process.send_signal(signal.SIGCONT)  # a stalled process dies as well, but say it anyway
            process.kill()
            await process.exited()
            assert process.stdout is not None
            process.stdout.close()

    def stall(self) -> None:
        """Stop the process (SIGSTOP): it keeps its connections but answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a stalled process go on (SIGCONT)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    async def __aenter__(self) -> HttpWorkspace:
        try:
            await self.start()
        except BaseException:
            await self.kill()  # a server that never printed its URL is not left behind
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.kill()


def abandoned(results: Sequence[ToolResult]) -> set[str]:
    """The `call_key`s of calls whose answer the client never got (the server may have run them on)."""
    return {
        call_key(result.call.name, result.call.arguments)
        for result in results
        if result.status in (CallStatus.TIMEOUT, CallStatus.CANCELLED)
        or (result.status is CallStatus.FAILED and result.attempts > 0)
    }


def retried(results: Sequence[ToolResult]) -> set[str]:
    """The `call_key`s of calls tried more than once: an attempt before the last was given up."""
    return {call_key(result.call.name, result.call.arguments) for result in results if result.attempts > 1}


class DroppingProxy:
    """A TCP proxy in front of a server whose connections a test can drop, as a flaky network does.

    Used with `async with`, inside which it forwards ``127.0.0.1:port`` to the upstream port. `drop()`
    closes every open connection at once, in both directions, without a word to either side.
    `lose_answers(marker, rate, seed, count)` cuts, instead, the connection of each request whose bytes
    hold `marker` (drawn with probability `rate`, seeded; at most `count` of them) once the server has
    answered it, before a byte of the answer reaches the client: the server did the work, and the client
    lost its connection with no answer. `answers_lost` counts them.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.drops = 0
        self.answers_lost = 0
        self._marker: bytes | None = None
        self._rate = 0.0
        self._left: int | None = None
        self._rng = random.Random(0)
        self._live: set[anyio.CancelScope] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self._listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None

    def url(self, path: str = "/mcp") -> str:
        """The URL that reaches the upstream server through the proxy."""
        return f"http://127.0.0.1:{self.port}{path}"

    def drop(self) -> int:
        """Close every open connection; returns how many there were."""
        live = list(self._live)
        for scope in live:
            scope.cancel()
        self.drops += len(live)
        return len(live)

    def lose_answers(self, marker: bytes, rate: float = 1.0, seed: int = 0, count: int | None = None) -> None:
        """From now on, lose the answer of each request holding `marker` with probability `rate` (see above)."""
        self._marker = marker
        self._rate = rate
        self._rng = random.Random(seed)
        self._left = count

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        with anyio.CancelScope() as scope:
            self._live.add(scope)
            try:
                async with client, await anyio.connect_tcp("127.0.0.1", self.upstream_port) as upstream:
                    async with anyio.create_task_group() as tg:
                        doomed = anyio.Event()
                        tg.start_soon(self._watch, client, upstream, doomed, tg.cancel_scope)
                        tg.start_soon(self._cut, upstream, client, doomed, tg.cancel_scope)
            except OSError:
                pass  # the upstream is down: the client sees its connection closed
            finally:
                self._live.discard(scope)

    @staticmethod
    async def _pump(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, done: anyio.CancelScope) -> None:
        try:
            async for chunk in source:
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        done.cancel()

    async def _watch(
        self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, doomed: anyio.Event, done: anyio.CancelScope
    ) -> None:
        """Forward a client's bytes; mark the connection doomed once a request holding the marker passed."""
        seen = b""
        try:
            async for chunk in source:
                if not doomed.is_set() and self._marker is not None:
                    # HTTP/1.1 without pipelining: one request at a time on a connection, so what the
                    # server sends next on it answers this request. Doomed before the bytes go on, so
                    # that no part of the answer can slip through first.
                    seen = (seen + chunk)[-65536:]
                    if self._marker in seen:
                        seen = b""
                        if self._rng.random() < self._rate and self._left != 0:
                            doomed.set()
                            if self._left is not None:
                                self._left -= 1
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        done.cancel()

    async def _cut(
        self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, doomed: anyio.Event, done: anyio.CancelScope
    ) -> None:
        """Forward the server's bytes, until a doomed request's answer is complete: then close both sides."""
        held = b""
        try:
            async for chunk in source:
                if not doomed.is_set():
                    await sink.send(chunk)
                    continue
                held += chunk
                # The answer holds the JSON-RPC result or error once the server is done with the call.
                if b'"result"' in held or b'"error"' in held:
                    self.answers_lost += 1
                    break
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        done.cancel()

    async def __aenter__(self) -> DroppingProxy:
        self._listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = self._listener.extra(anyio.abc.SocketAttribute.local_port)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._listener.serve, self._handle)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._tg is not None and self._listener is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        await self._listener.aclose()
