"""Second round of attacks on unknown outcomes, idempotency keys and fail-fast (issue 23).

Each test is an adversary's move that the first round's tests did not make: a cancellation that lands
after the answer came, a server that requires the key argument, a batch cancelled or streamed under
fail-fast, a write denied or timed out that later calls depend on. The oracle is the same as the first
round's: NEVER_RAN only when the request provably never left, RAN only when the server answered, UNKNOWN
otherwise; every call one result; `depends_on` an earlier call that conflicts; no write repeated unless a
key makes the repeat harmless. A test that found a hole fails on the code before its fix (its docstring
says so).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, Effect, IdempotencyKeys, RetryPolicy, ToolCall
from dispatcher.examples import Workspace
from dispatcher.testing import inject_faults

pytestmark = pytest.mark.anyio

KEYED = IdempotencyKeys(argument="idempotency_key")
RETRY = RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.002, jitter=False)
PAY = ToolCall("w", "append_note", {"name": "log", "text": "paid"})
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)


# Cancellation after the answer -------------------------------------------------------------------


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed-retryable", "one-attempt"])
async def test_a_cancellation_that_lands_after_the_answer_keeps_the_answer(keyed: bool) -> None:
    """A cancel requested in the instant the answer came back: the call keeps its answer and reads RAN.

    The cancel is requested from inside the client's `call_tool`, once the server's result is in hand
    (as a caller's deadline firing in the same loop turn would). Before the fix a retryable call (a
    keyed write) let the loop run once after its answer, between attempts, and the cancellation landed
    there: the result was dropped and the write, which the server had applied and answered, read
    CANCELLED and UNKNOWN, telling the model it might have to check and repeat it.
    """
    workspace = Workspace(idempotency_key="idempotency_key")
    pending: list[Any] = []

    class CancelledOnAnswer(Client):
        async def call_tool(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().call_tool(*args, **kwargs)
            pending[0].cancel()
            return result

    async with Dispatcher(retry=RETRY if keyed else None) as d:
        await d.connect("ws", lambda: CancelledOnAnswer(workspace.server), trusted=True, idempotency=KEYED)
        batch = d.batch()
        pending.append(batch.submit(PAY))
        [result] = await batch.wait()
    assert workspace.notes == {"log": "paid"}
    assert result.status is CallStatus.OK and result.effect is Effect.RAN, (result.status, result.error)
    assert result.result is not None and result.attempts == 1


# A server that requires its key --------------------------------------------------------------------


def _requires_key() -> tuple[MCPServer[Any], list[str], list[object]]:
    """A server whose write requires the key argument (no default), deduplicating by it; what it applied
    and every key it was sent."""
    server: MCPServer[Any] = MCPServer("strict")
    applied: list[str] = []
    keys: list[object] = []
    first: dict[str, str] = {}

    @server.tool(name="append", annotations=WRITE)
    async def append(text: str, idempotency_key: str) -> str:
        keys.append(idempotency_key)
        if idempotency_key not in first:
            applied.append(text)
            first[idempotency_key] = f"appended {text}"
        return first[idempotency_key]

    return server, applied, keys


async def test_a_tool_that_requires_the_key_argument_takes_calls_without_it() -> None:
    """A write whose schema requires the key argument: a call without it runs with the dispatcher's key,
    its lost answer is retried with that key, and the write is applied once.

    The model cannot know the key (it is the dispatcher's), so it leaves the argument out, or puts
    anything there, which is dropped. Before the fix the arguments were checked for required names
    before the key was put in: every call the model made without the argument was rejected ("missing
    required 'idempotency_key'"), and one with it passed only for its value to be replaced.
    """
    server, applied, keys = _requires_key()
    faults = inject_faults(server, rate=0.0)
    faults.fail_next("append", "drop", strike="after")
    async with Dispatcher(retry=RETRY) as d:
        await d.connect("s", server, trusted=True, idempotency=KEYED)
        results = await d.dispatch(
            [
                ToolCall("a", "append", {"text": "x"}),
                ToolCall("b", "append", {"text": "y", "idempotency_key": ["not", "a", "key"]}),
            ]
        )
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK], [r.error for r in results]
    assert [r.attempts for r in results] == [2, 1]
    assert applied == ["x", "y"]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2]
    assert all(isinstance(key, str) and len(key) == 32 for key in keys)


# Fail-fast: what a rejected write conflicts with ---------------------------------------------------


def _bank_and_mail(d: Dispatcher, ran: list[str]) -> None:
    """A write keyed per account in domain "bank" (its key function needs a known account), and a write
    in domain "mail"."""

    async def pay(account: str) -> str:
        ran.append(f"pay {account}")
        return "paid"

    async def mail(to: str) -> str:
        ran.append(f"mail {to}")
        return "sent"

    accounts = {"alice": "alice", "bob": "bob"}
    d.add_function(pay, annotations=WRITE, domain="bank", keys=lambda arguments: accounts[arguments["account"]])
    d.add_function(mail, annotations=WRITE, domain="mail")


@pytest.mark.parametrize("why", ["arguments", "key function"])
async def test_a_write_rejected_before_it_had_keys_stops_only_its_domain(why: str) -> None:
    """A write rejected for its arguments or its key function stops the later calls of its domain, not
    an independent write in another domain.

    Before the fix such a call kept the root key (it never reached the gate, which gives a call its
    keys), so it conflicted with everything: the mail was skipped, its `depends_on` naming a payment it
    does not conflict with.
    """
    ran: list[str] = []
    first = {"acct": "alice"} if why == "arguments" else {"account": "mallory"}
    async with Dispatcher(fail_fast=True) as d:
        _bank_and_mail(d, ran)
        results = await d.dispatch(
            [
                ToolCall("p", "pay", first),
                ToolCall("m", "mail", {"to": "bob"}),
                ToolCall("q", "pay", {"account": "bob"}),
            ]
        )
    pay, mail, later = results
    assert pay.status is CallStatus.FAILED and pay.effect is Effect.NEVER_RAN
    assert mail.ok and mail.depends_on is None, mail.error
    assert later.depends_on == "p" and later.effect is Effect.NEVER_RAN  # same domain: it may depend on it
    assert ran == ["mail bob"]


# A retry racing a reconnect ------------------------------------------------------------------------


async def test_a_keyed_retry_is_not_sent_to_a_reconnected_tool_that_dropped_the_key() -> None:
    """A keyed write whose connection is lost after the server applied it, where the reconnect brings a
    definition without the key argument (accepted by the user): the repeat is not sent; UNKNOWN, applied once.

    The retry's eligibility was read before the attempt, and the reconnect (inside the attempt) came
    after it. Before the fix the repeat went out with the key to a tool that no longer declares it; the
    SDK's server dropped the key, and the write was applied twice.
    """
    applied: list[str] = []
    seen: set[str] = set()
    before: MCPServer[Any] = MCPServer("s")
    after: MCPServer[Any] = MCPServer("s")

    @before.tool(name="append", annotations=WRITE)
    async def append_keyed(text: str, idempotency_key: str | None = None) -> str:
        if idempotency_key not in seen:
            seen.add(str(idempotency_key))
            applied.append(text)
        return "appended"

    @after.tool(name="append", annotations=WRITE)
    async def append(text: str) -> str:
        applied.append(text)
        return "appended"

    class LostAfterTheWork(Client):
        async def call_tool(self, *args: Any, **kwargs: Any) -> Any:
            await super().call_tool(*args, **kwargs)
            raise anyio.BrokenResourceError  # the transport fails once the server has done the work

    clients: list[Client] = []

    def connect() -> Client:
        clients.append(LostAfterTheWork(before) if not clients else Client(after))
        return clients[-1]

    async with Dispatcher(retry=RETRY) as d:
        await d.connect("s", connect, trusted=True, idempotency=KEYED, on_definition_change=lambda change: True)
        [result] = await d.dispatch([ToolCall("w", "append", {"text": "x"})])
    assert len(clients) == 2, "the retry reconnected"
    assert applied == ["x"], "the write was applied twice"
    assert result.status is CallStatus.FAILED and result.effect is Effect.UNKNOWN
    assert result.error is not None and "no longer takes the idempotency key" in result.error
