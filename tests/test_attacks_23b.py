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

import pytest
from mcp import Client

from dispatcher import CallStatus, Dispatcher, Effect, IdempotencyKeys, RetryPolicy, ToolCall
from dispatcher.examples import Workspace

pytestmark = pytest.mark.anyio

KEYED = IdempotencyKeys(argument="idempotency_key")
RETRY = RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.002, jitter=False)
PAY = ToolCall("w", "append_note", {"name": "log", "text": "paid"})


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
