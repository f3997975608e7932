"""Fencing tokens, the lease checked before each send, and lost state noticed: against a real Redis.

Several coordinators in one process stand for several processes (each has its own connections and
identity). A blocking `time.sleep` on the event loop stands for a frozen process: nothing of it runs,
while Redis and the other coordinators' threads go on. Each test runs on asyncio and trio.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest
import redis
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

from dispatcher import CallStatus, ConfigurationError, Dispatcher, IdempotencyKeys, ToolCall
from dispatcher.examples import Workspace
from dispatcher.fleet import CoordinationError, FleetServer, RedisCoordinator
from dispatcher.testing import FencedResource
from tests.task_server import TaskScript

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from mcp.types import RequestParamsMeta

    from benchmarks._redis import RedisServer

pytestmark = pytest.mark.anyio

TTL = 0.6
META = "example.com/fence"
FENCED = {"ws": FleetServer(shared_state=True, fence_meta=META)}


def fleet(server: RedisServer, namespace: str, **options: Any) -> RedisCoordinator:
    options.setdefault("servers", FENCED)
    return RedisCoordinator(server.url, namespace=namespace, lease_ttl=TTL, recheck=0.1, **options)


def never_lost(reason: str) -> None:
    raise AssertionError(f"a hold was lost: {reason}")


async def flushall(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url)
    try:
        await anyio.to_thread.run_sync(client.flushall)
    finally:
        client.close()


class Frozen(RedisCoordinator):
    """A coordinator whose process freezes (blocks its event loop) once, right after a grant.

    With `unchecked`, the holder never learns that its hold ended (neither its check before the send, nor
    its watch, nor a refused renewal tells it): its write goes out late, the case of a request that
    passed the check and was then held up before it reached the server (a freeze inside the send, a
    slow network). Only the server can then refuse it.
    """

    def __init__(self, *args: Any, freeze: float, unchecked: bool = False, **options: Any) -> None:
        super().__init__(*args, **options)
        self.freeze = freeze
        self.unchecked = unchecked
        self.tokens: list[int] = []
        self.frozen = threading.Event()

    @asynccontextmanager
    async def hold(self, **options: Any) -> AsyncIterator[Any]:
        async with super().hold(**options) as lease:
            if lease is not None and lease.token is not None:
                self.tokens.append(lease.token)
                if self.unchecked:
                    lease.margin = -math.inf
            if self.freeze:
                freeze, self.freeze = self.freeze, 0.0
                self.frozen.set()
                time.sleep(freeze)  # noqa: ASYNC251  # the whole process stops: no renewal, no watch, no other task
            yield lease

    def _lose(self, lease: Any, why: str) -> None:
        if not self.unchecked:
            super()._lose(lease, why)


def frozen(server: RedisServer, namespace: str, *, freeze: float, unchecked: bool = False) -> Frozen:
    return Frozen(
        server.url, namespace=namespace, servers=FENCED, lease_ttl=TTL, recheck=0.1, freeze=freeze, unchecked=unchecked
    )


async def test_every_grant_carries_a_token_larger_than_all_before_it_also_after_a_flushall(
    redis_server: RedisServer, namespace: str
) -> None:
    """Grants across two coordinators get growing tokens; after FLUSHALL the next one is larger still."""
    first, second = fleet(redis_server, namespace), fleet(redis_server, namespace)
    tokens: list[int] = []
    async with first, second:
        for round_ in range(6):
            coordinator = (first, second)[round_ % 2]
            async with coordinator.hold(server="ws", exclusive=round_ % 3 == 0, on_lost=never_lost) as lease:
                assert lease is not None and lease.token is not None
                tokens.append(lease.token)
        await flushall(redis_server)
        with anyio.fail_after(20):
            async with first.hold(server="ws", exclusive=True, on_lost=never_lost) as lease:
                assert lease is not None and lease.token is not None
                tokens.append(lease.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens


async def test_the_token_reaches_the_server_in_the_declared_meta_entry_and_a_stale_one_is_refused(
    redis_server: RedisServer, namespace: str
) -> None:
    """fence_meta: each write carries its hold's token in _meta; the fenced workspace refuses an older one."""
    workspace = Workspace(fence=META)
    coordinator = Frozen(redis_server.url, namespace=namespace, servers=FENCED, lease_ttl=TTL, recheck=0.1, freeze=0)
    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        results = await dispatcher.dispatch(
            [
                ToolCall("1", "set_note", {"name": "a", "text": "one"}),
                ToolCall("2", "set_note", {"name": "a", "text": "two"}),
            ]
        )
    assert [result.status for result in results] == [CallStatus.OK, CallStatus.OK]
    assert workspace.fenced is not None
    assert workspace.fenced.highest() == coordinator.tokens[-1] and coordinator.tokens[0] < coordinator.tokens[1]
    # A request of the first holder arriving now, late: refused, nothing written.
    async with Client(workspace.server) as client:
        with pytest.raises(MCPError, match="stale fencing token"):
            stale = cast("RequestParamsMeta", {META: coordinator.tokens[0]})  # an open map
            await client.call_tool("set_note", {"name": "a", "text": "late"}, meta=stale)
        with pytest.raises(MCPError, match="no fencing token"):
            await client.call_tool("set_note", {"name": "a", "text": "unfenced"})
    assert workspace.notes == {"a": "two"}
    assert workspace.fenced.refused == 2


async def test_the_token_replaces_a_model_supplied_argument_of_the_declared_name(
    redis_server: RedisServer, namespace: str
) -> None:
    """fence_argument: the tool gets the hold's token in that argument, whatever the model put there."""
    server: MCPServer[Any] = MCPServer("fenced")
    seen: list[object] = []

    @server.tool()
    async def write(text: str, fence_token: int | None = None) -> str:
        seen.append(fence_token)
        return "ok"

    servers = {"ws": FleetServer(limit=2, shared_state=True, fence_argument="fence_token")}
    coordinator = fleet(redis_server, namespace, servers=servers)
    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", server, trusted=True)
        results = await dispatcher.dispatch(
            [ToolCall("1", "write", {"text": "a"}), ToolCall("2", "write", {"text": "b", "fence_token": 10**18})]
        )
    assert [result.status for result in results] == [CallStatus.OK, CallStatus.OK]
    assert len(seen) == 2 and all(isinstance(token, int) and 0 < token < 10**18 for token in seen), seen


async def test_a_task_call_carries_the_token_in_the_declared_meta_entry_beside_its_idempotency_key(
    redis_server: RedisServer, namespace: str
) -> None:
    """fence_meta on a task-augmented call: the request creating the task carries the token and the call's key."""
    script = TaskScript(poll_interval=10, finish_after=1, tool_annotations={"readOnlyHint": False})
    coordinator = Frozen(
        redis_server.url, namespace=namespace, servers={"tasks": FENCED["ws"]}, lease_ttl=TTL, recheck=0.1, freeze=0
    )
    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect(
            "tasks", script.client, trusted=True, idempotency=IdempotencyKeys(meta="io.example/idempotency-key")
        )
        results = await dispatcher.dispatch([ToolCall("1", "slow", {}), ToolCall("2", "slow", {})])
    assert [result.status for result in results] == [CallStatus.OK, CallStatus.OK], [r.error for r in results]
    metas = [call.get("_meta", {}) for call in script.calls]
    assert [meta.get(META) for meta in metas] == coordinator.tokens and len(set(coordinator.tokens)) == 2, metas
    assert all(meta.get("io.example/idempotency-key") for meta in metas), metas


async def test_a_holder_frozen_past_its_lease_before_sending_never_sends(
    redis_server: RedisServer, namespace: str
) -> None:
    """Frozen for 2 ttl between its grant and its send: the write is not sent and ends with the hold lost."""
    workspace = Workspace()
    coordinator = Frozen(
        redis_server.url, namespace=namespace, servers=FENCED, lease_ttl=TTL, recheck=0.1, freeze=2 * TTL
    )
    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "a", "text": "late"})])
    assert result.status is CallStatus.FAILED
    assert result.error is not None and "could have ended before the request was sent" in result.error, result.error
    assert workspace.ledger == (), "the frozen holder's write reached the server after its lease"


async def test_the_oracle_without_the_check_the_frozen_holders_write_is_sent(
    redis_server: RedisServer, namespace: str
) -> None:
    """The check switched off: the same frozen write reaches the server (so the test above can fail)."""
    workspace = Workspace()
    coordinator = Frozen(
        redis_server.url,
        namespace=namespace,
        servers=FENCED,
        lease_ttl=TTL,
        recheck=0.1,
        freeze=2 * TTL,
        unchecked=True,
    )
    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "a", "text": "late"})])
    assert len(workspace.ledger) == 1


async def test_a_late_write_that_passed_the_check_is_refused_by_a_fenced_server(
    redis_server: RedisServer, namespace: str
) -> None:
    """Frozen after the check (unchecked) while another process wrote: the fenced server refuses the late write."""
    workspace = Workspace(fence=META, latency=0.05)
    late_holder = frozen(redis_server, namespace, freeze=3 * TTL, unchecked=True)
    other = fleet(redis_server, namespace)

    async def write_meanwhile() -> None:
        # Another process, running while the first is frozen: it gets the hold once the lease expired.
        def run() -> list[Any]:
            async def inner() -> list[Any]:
                async with other, Dispatcher(coordinator=other) as dispatcher:
                    await dispatcher.connect("ws", workspace.server, trusted=True)
                    return await dispatcher.dispatch([ToolCall("o", "set_note", {"name": "a", "text": "other"})])

            assert late_holder.frozen.wait(30), "the first holder never got its hold"
            return anyio.run(inner)

        results.extend(await anyio.to_thread.run_sync(run))

    results: list[Any] = []
    async with late_holder, Dispatcher(coordinator=late_holder) as dispatcher, anyio.create_task_group() as tg:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        # The other process runs in a thread of its own (an event loop of its own), which the freeze does not stop.
        tg.start_soon(write_meanwhile)
        await anyio.sleep(0.05)
        [late] = await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "a", "text": "late"})])
    assert [result.status for result in results] == [CallStatus.OK]
    assert late.status is CallStatus.FAILED and late.error is not None and "stale fencing token" in late.error, late
    assert workspace.notes == {"a": "other"}, "the late write of a holder whose turn was handed on took effect"


async def test_a_grant_whose_reply_comes_after_the_lease_could_have_ended_is_not_granted(
    redis_server: RedisServer, namespace: str
) -> None:
    """The grant's reply delayed past ttl - recheck: CoordinationError, the hold given back, nothing runs."""
    coordinator = fleet(redis_server, namespace)
    async with coordinator:
        link = coordinator._link
        assert link is not None
        run = link.run

        async def slow(script: str, keys: list[str], args: list[Any]) -> Any:
            reply = await run(script, keys, args)
            if script == "acquire":
                await anyio.sleep(TTL)
            return reply

        link.run = slow  # type: ignore[method-assign]  # a stalled network, for this test
        with pytest.raises(CoordinationError, match="too late to trust"):
            async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
                raise AssertionError("ran on a grant that came too late")
        link.run = run  # type: ignore[method-assign]
        with anyio.fail_after(10):
            async with coordinator.hold(server="ws", exclusive=True, on_lost=never_lost):
                pass  # the late grant was given back


async def test_after_a_flushall_the_namespace_waits_a_ttl_and_the_holder_loses_its_hold(
    redis_server: RedisServer, namespace: str
) -> None:
    """FLUSHALL under a holder: the holder loses its hold (epoch gone) before anyone else is granted."""
    holder, other = fleet(redis_server, namespace), fleet(redis_server, namespace)
    lost_at: list[float] = []
    async with holder, other:
        with anyio.fail_after(20):
            async with holder.hold(
                server="ws", exclusive=True, on_lost=lambda reason: lost_at.append(time.monotonic())
            ):
                await flushall(redis_server)
                flushed = time.monotonic()
                async with other.hold(server="ws", exclusive=True, on_lost=never_lost):
                    granted = time.monotonic()
    assert lost_at, "the holder never noticed that Redis lost its hold"
    assert lost_at[0] < granted, "another holder was granted while the first still held"
    assert granted - flushed >= TTL * 0.9, f"granted {granted - flushed:.2f}s after the flush, before one ttl"


def test_fleet_server_validates_where_the_token_goes() -> None:
    """fence_argument / fence_meta: a non-empty name, not both, and only on a shared-state server."""
    with pytest.raises(ConfigurationError, match="not both"):
        FleetServer(shared_state=True, fence_argument="a", fence_meta="b")
    for limit in (None, 4):
        # Holds that share only a limit run together: their tokens order nothing a server could check.
        with pytest.raises(ConfigurationError, match="shared_state=True"):
            FleetServer(limit=limit, fence_meta="b")
    with pytest.raises(ConfigurationError, match="non-empty"):
        FleetServer(limit=1, fence_argument="")


def test_fenced_resource_refuses_lower_tokens_per_resource() -> None:
    """FencedResource: equal or higher tokens pass, lower ones and non-ints are refused, per resource."""
    fence = FencedResource()
    fence.admit(5)
    fence.admit(5)
    fence.admit(7)
    fence.admit(3, "other")
    for token in (6, None, True, "9"):
        with pytest.raises(MCPError) as info:
            fence.admit(token)
        assert info.value.error.code == FencedResource.code
    assert (fence.highest(), fence.highest("other"), fence.refused) == (7, 3, 4)


async def test_a_write_still_running_when_a_newer_holder_writes_is_refused_where_it_takes_effect() -> None:
    """Fenced workspace: a slow write (token 5) overtaken by a newer holder's (token 6) changes nothing."""
    workspace = Workspace(fence=META, latency_by_tool={"append_note": 0.5, "set_note": 0.0})
    outcomes: dict[str, str] = {}

    async def write(tool: str, text: str, token: int) -> None:
        async with Client(workspace.server) as client:
            try:
                await client.call_tool(tool, {"name": "a", "text": text}, meta=cast("RequestParamsMeta", {META: token}))
            except MCPError as exc:
                outcomes[text] = exc.error.message
            else:
                outcomes[text] = "ok"

    async with anyio.create_task_group() as tg:
        tg.start_soon(write, "append_note", "old", 5)
        with anyio.fail_after(10):
            while not workspace.in_flight:  # noqa: ASYNC110  # the old write is on the server
                await anyio.sleep(0.01)
        tg.start_soon(write, "set_note", "new", 6)
    assert outcomes["new"] == "ok"
    assert "stale fencing token 5" in outcomes["old"], outcomes
    assert workspace.notes == {"a": "new"}


def interleavings(writers: list[list[tuple[int, str]]]) -> list[list[tuple[int, str]]]:
    """Every merge of the writers' event lists that keeps each writer's own order."""
    if all(not events for events in writers):
        return [[]]
    merged: list[list[tuple[int, str]]] = []
    for index, events in enumerate(writers):
        if events:
            rest = [*writers[:index], events[1:], *writers[index + 1 :]]
            merged.extend([events[0], *tail] for tail in interleavings(rest))
    return merged


class ArrivalOnly(FencedResource):
    """The oracle: a resource that checks a write's token as it arrives and never again where it takes effect."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: set[int] = set()

    def admit(self, token: object, resource: str = "") -> None:
        if token in self.arrived:
            return  # the write's effect: not checked again
        super().admit(token, resource)
        assert isinstance(token, int)
        self.arrived.add(token)


def stale_effects(resource: type[FencedResource], writers: list[list[tuple[int, str]]]) -> list[str]:
    """The interleavings in which the resource let a write take effect after a newer holder's write had arrived,
    or refused one that no newer holder's write preceded."""
    wrong: list[str] = []
    for order in interleavings(writers):
        fence = resource()
        refused: set[int] = set()
        for step, (token, event) in enumerate(order):
            if token in refused:
                continue  # a refused write stops there: its effect never comes
            try:
                fence.admit(token)
            except MCPError:
                refused.add(token)
            if event != "effect":
                continue
            # Right when nothing of a newer holder came before this effect (tokens grow with the grants).
            newer_first = any(other > token for other, _ in order[:step])
            if newer_first != (token in refused):
                wrong.append(" ".join(f"{e}{t}" for t, e in order[: step + 1]))
    return wrong


def test_a_fenced_resource_refuses_the_stale_writer_in_every_interleaving() -> None:
    """Three holders' writes (one retried) in every order: a write takes effect iff no newer one came first."""
    writers = [
        [(1, "arrive"), (1, "effect"), (1, "arrive"), (1, "effect")],  # a retried attempt keeps its hold's token
        [(2, "arrive"), (2, "effect")],
        [(3, "arrive"), (3, "effect")],
    ]
    assert len(interleavings(writers)) == 420
    assert stale_effects(FencedResource, writers) == []
    # The oracle: checked only on arrival, a write still running when a newer one arrives takes effect after it.
    assert "arrive1 arrive2 effect1" in stale_effects(ArrivalOnly, writers)


@pytest.mark.parametrize("place", ["argument", "meta"])
async def test_a_key_and_a_fencing_token_in_the_same_place_are_refused(place: str) -> None:
    """The token would overwrite the key, and the server could not deduplicate retries: connect refuses.

    Different names for the two are accepted.
    """
    name = "io.example/fence" if place == "meta" else "fence"
    fenced = (
        FleetServer(shared_state=True, fence_meta=name)
        if place == "meta"
        else FleetServer(shared_state=True, fence_argument=name)
    )
    coordinator = RedisCoordinator("redis://127.0.0.1:1", servers={"ws": fenced}, lease_ttl=TTL, recheck=0.1)
    async with Dispatcher(coordinator=coordinator) as dispatcher:
        with pytest.raises(ConfigurationError, match="the token would overwrite the key"):
            await dispatcher.connect("ws", Workspace().server, idempotency=IdempotencyKeys(**{place: name}))
        other = "io.example/key" if place == "meta" else "key"
        await dispatcher.connect("ws", Workspace().server, idempotency=IdempotencyKeys(**{place: other}))
