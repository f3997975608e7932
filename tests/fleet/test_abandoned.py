"""Abandoned writes and lost state, against a real Redis: what a call is told, and how long its turn is kept.

Issue 24, point 4: a call whose fleet hold is lost before its request left failed and never ran; one whose
hold is lost after its request left may have run (TIMEOUT, effect unknown).

Several coordinators in one process stand for several processes (each has its own connections and
identity). Each test runs on asyncio and trio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client

from dispatcher import CallStatus, Dispatcher, Effect, ToolCall
from dispatcher.examples import Workspace
from dispatcher.fleet import FleetServer, RedisCoordinator
from tests.fleet.test_fencing import FENCED, TTL, Frozen, flushall

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer

pytestmark = pytest.mark.anyio


def fleet(server: RedisServer, namespace: str, **config: Any) -> RedisCoordinator:
    """A coordinator of one shared-state server without fencing, `config` its FleetServer settings."""
    servers = {"ws": FleetServer(shared_state=True, **config)}
    return RedisCoordinator(server.url, namespace=namespace, servers=servers, lease_ttl=TTL, recheck=0.1)


@pytest.mark.parametrize("connection", ["owned", "users"])
async def test_a_hold_lost_before_the_send_says_the_call_was_not_sent(
    redis_server: RedisServer, namespace: str, connection: str
) -> None:
    """Frozen past its lease before the send: FAILED, never ran, and the error says it was not sent."""
    workspace = Workspace()
    coordinator = Frozen(
        redis_server.url, namespace=namespace, servers=FENCED, lease_ttl=TTL, recheck=0.1, freeze=2 * TTL
    )
    async with coordinator, Dispatcher(coordinator=coordinator) as dispatcher:
        if connection == "owned":
            await dispatcher.connect("ws", workspace.server, trusted=True)
            [result] = await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "a", "text": "late"})])
        else:
            async with Client(workspace.server) as client:
                await dispatcher.add_mcp_server("ws", client, trusted=True)
                [result] = await dispatcher.dispatch([ToolCall("1", "set_note", {"name": "a", "text": "late"})])
    assert (result.status, result.effect) == (CallStatus.FAILED, Effect.NEVER_RAN), result
    assert result.error is not None and result.error.endswith("; the call was not sent"), result.error
    assert "running on the server" not in result.error, result.error
    assert workspace.ledger == ()


async def test_a_write_whose_hold_is_lost_on_the_wire_ends_timeout_with_an_unknown_outcome(
    redis_server: RedisServer, namespace: str
) -> None:
    """FLUSHALL under a write on the server: TIMEOUT of unknown effect, saying it may have run."""
    workspace = Workspace(latency=30.0)
    coordinator = fleet(redis_server, namespace)
    async with coordinator, Dispatcher(coordinator=coordinator, call_timeout=None) as dispatcher:
        await dispatcher.connect("ws", workspace.server, trusted=True)
        pending = dispatcher.batch().submit(ToolCall("1", "set_note", {"name": "a", "text": "t"}))
        with anyio.fail_after(20):
            while workspace.in_flight == 0:  # noqa: ASYNC110  # the workspace offers no event to wait on
                await anyio.sleep(0.01)
            await flushall(redis_server)
            result = await pending.wait()
    assert (result.status, result.effect, result.mutating) == (CallStatus.TIMEOUT, Effect.UNKNOWN, True), result
    assert result.error is not None and "lost its fleet hold on server 'ws'" in result.error
    assert "after its request was sent: it may have run, or still be running on the server" in result.error
