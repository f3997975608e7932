"""One process of a test fleet: `python -m tests.fleet.agent CONFIG_JSON`.

In "calls" mode it runs `agents` concurrent agents, each dispatching `rounds` batches of a read, a write and a
read to one MCP server over streamable HTTP, through a dispatcher coordinated by Redis (or not, when
``redis`` is null), and writes every result to ``out`` as JSON. In "hold" mode it takes one exclusive fleet
hold, prints ``HELD`` and waits to be killed. In "keyed" mode each agent writes its note (``k0`` or ``k1``,
by the parity of its number) `rounds` times, on a server whose writes are keyed by the note's name. In
"writes" mode each agent dispatches `rounds` writes, one at a time, and nothing else; in "reads" mode `rounds`
batches of two reads. With ``adaptive`` [floor, ceiling, initial] the server's limit is an `AdaptiveLimit`
that the fleet shares (``max_call_time`` keeps a given-up call's place under it).

With ``fence`` the server's requests carry their fencing token in that `_meta` entry. With
``freeze_after`` N the process stops itself (SIGSTOP) right after its N-th grant of a write, once, having printed
``FROZEN``: a process frozen between its grant and its send, which the test resumes (SIGCONT). With
``unchecked`` the process never learns that a hold ended (the check before the send, the watch and
the renewals are switched off): the unsafe behaviour the tests' oracles must catch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from dispatcher import AdaptiveLimit, Dispatcher, ToolCall
from dispatcher.fleet import FleetServer, RedisCoordinator

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

SERVER = "ws"


class _Faulty(RedisCoordinator):
    """The fleet's coordinator with the faults of `freeze_after` and `unchecked` (module docstring)."""

    def __init__(self, *args: Any, freeze_after: int | None, unchecked: bool, **options: Any) -> None:
        super().__init__(*args, **options)
        self.freeze_after = freeze_after
        self.unchecked = unchecked
        self.grants = 0

    @asynccontextmanager
    async def hold(self, **options: Any) -> AsyncIterator[Any]:
        async with super().hold(**options) as lease:
            self.grants += bool(options.get("exclusive"))
            if self.unchecked and lease is not None:
                lease.margin = -math.inf
            if options.get("exclusive") and self.grants == self.freeze_after:
                print("FROZEN", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            yield lease

    def _lose(self, lease: Any, why: str) -> None:
        if not self.unchecked:
            super()._lose(lease, why)


def _coordinator(config: dict[str, Any]) -> RedisCoordinator | None:
    if config.get("redis") is None:
        return None
    shared = config.get("shared_state", False)
    server = FleetServer(
        limit=config.get("limit"),
        shared_state=shared,
        fence_meta=config.get("fence"),
        # No write of these tests' outlives its lease unless a test says so: no turn kept beyond it.
        max_write_time=config.get("max_write_time", 0.0) if shared else None,
        max_call_time=config.get("max_call_time"),
    )
    return _Faulty(
        config["redis"],
        freeze_after=config.get("freeze_after"),
        unchecked=config.get("unchecked", False),
        namespace=config["namespace"],
        servers={SERVER: server},
        lease_ttl=config.get("ttl", 1.0),
        recheck=config.get("recheck", 0.2),
        timeout=config.get("timeout", 1.0),
    )


async def _agent(dispatcher: Dispatcher, config: dict[str, Any], agent: int, out: list[dict[str, Any]]) -> None:
    tag = f"{config['name']}-{agent}"
    for round_ in range(config["rounds"]):
        calls = [
            ToolCall(f"{tag}-{round_}-r1", "search_notes", {"query": tag}),
            ToolCall(f"{tag}-{round_}-w", "set_note", {"name": f"{tag}-{round_}", "text": tag}),
            ToolCall(f"{tag}-{round_}-r2", "search_notes", {"query": f"{tag}-{round_}"}),
        ]
        results = await dispatcher.dispatch(calls)
        out.extend({"id": result.call_id, "status": result.status.value, "error": result.error} for result in results)


async def _keyed(dispatcher: Dispatcher, config: dict[str, Any], agent: int, out: list[dict[str, Any]]) -> None:
    tag = f"{config['name']}-{agent}"
    for round_ in range(config["rounds"]):
        call = ToolCall(f"{tag}-{round_}-w", "set_note", {"name": f"k{agent % 2}", "text": tag})
        results = await dispatcher.dispatch([call])
        out.extend({"id": result.call_id, "status": result.status.value, "error": result.error} for result in results)


async def _writes(dispatcher: Dispatcher, config: dict[str, Any], agent: int, out: list[dict[str, Any]]) -> None:
    tag = f"{config['name']}-{agent}"
    for round_ in range(config["rounds"]):
        call = ToolCall(f"{tag}-{round_}-w", "set_note", {"name": f"{tag}-{round_}", "text": tag})
        results = await dispatcher.dispatch([call])
        out.extend(
            {"id": result.call_id, "status": result.status.value, "error": result.error, "effect": result.effect.value}
            for result in results
        )


async def _reads(dispatcher: Dispatcher, config: dict[str, Any], agent: int, out: list[dict[str, Any]]) -> None:
    tag = f"{config['name']}-{agent}"
    for round_ in range(config["rounds"]):
        calls = [ToolCall(f"{tag}-{round_}-r{i}", "search_notes", {"query": tag}) for i in (1, 2)]
        results = await dispatcher.dispatch(calls)
        out.extend({"id": result.call_id, "status": result.status.value, "error": result.error} for result in results)


async def _calls(config: dict[str, Any]) -> None:
    coordinator = _coordinator(config)
    results: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        if coordinator is not None:
            await stack.enter_async_context(coordinator)  # entered first, closed last
        dispatcher = await stack.enter_async_context(
            Dispatcher(max_concurrency=config.get("local_limit", 16), coordinator=coordinator)
        )
        keyed = config.get("mode") == "keyed"
        adaptive = config.get("adaptive")
        limit: int | AdaptiveLimit | None = config.get("limit")
        if adaptive is not None:
            floor, ceiling, initial = adaptive
            limit = AdaptiveLimit(floor=floor, ceiling=ceiling, initial=initial, tolerance=3.0)
        await dispatcher.connect(
            SERVER,
            config["mcp"],
            trusted=True,
            max_concurrency=limit,
            domain=SERVER if keyed else None,
            keys={"set_note": lambda arguments: arguments["name"]} if keyed else None,
        )
        print("READY", flush=True)
        agent_of = {"keyed": _keyed, "writes": _writes, "reads": _reads}.get(config.get("mode", ""), _agent)
        async with anyio.create_task_group() as tg:
            for agent in range(config["agents"]):
                tg.start_soon(agent_of, dispatcher, config, agent, results)
    await anyio.Path(config["out"]).write_text(json.dumps(results))


async def _hold(config: dict[str, Any]) -> None:
    coordinator = _coordinator(config)
    assert coordinator is not None
    async with coordinator, coordinator.hold(server=SERVER, exclusive=True, on_lost=print):
        print("HELD", flush=True)
        await anyio.sleep_forever()


def main(argv: list[str]) -> None:
    config = json.loads(argv[0])
    run = _hold if config.get("mode") == "hold" else _calls
    anyio.run(run, config, backend=config.get("backend", "asyncio"))
    os._exit(0)  # skip interpreter teardown: the test waits on this process


if __name__ == "__main__":
    main(sys.argv[1:])
