"""Property tests of execution through real tools: random batches, limits and trust."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.types import ToolAnnotations

from dispatcher import CallStatus, Dispatcher, ToolCall

from .recording import Execution, Recorder, recording_server

pytestmark = pytest.mark.anyio

call_specs = st.lists(
    st.tuples(
        st.sampled_from(["read", "write", "fail", "unknown"]),
        st.sampled_from(["a", "b", "local"]),
        st.integers(0, 3),
    ),
    max_size=25,
)


def check_order(calls: list[ToolCall], recorder: Recorder) -> None:
    """A write starts after every earlier executed call ended and ends before any later call starts."""
    first: dict[str, Execution] = {}
    for execution in recorder.executions:
        first.setdefault(execution.key, execution)
    executed = [first[c.id] for c in calls if c.id in first]
    for position, execution in enumerate(executed):
        if not execution.exclusive:
            continue
        assert execution.end is not None
        for earlier in executed[:position]:
            assert earlier.end is not None and earlier.end < execution.start
        for later in executed[position + 1 :]:
            assert later.start > execution.end


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=call_specs,
    limit=st.one_of(st.none(), st.integers(1, 5)),
    limit_a=st.one_of(st.none(), st.integers(1, 2)),
    trusted_b=st.booleans(),
)
@pytest.mark.slow
async def test_random_batches_keep_every_invariant(
    anyio_backend: Any, specs: list[tuple[str, str, int]], limit: int | None, limit_a: int | None, trusted_b: bool
) -> None:
    """Every call once, results in order, writes never overlap, limits hold, untrusted tools run alone."""
    recorder = Recorder()

    async def local_read(key: str, steps: int = 1) -> str:
        return await recorder.run("local", "read", key, False, "", steps)

    async def local_write(key: str, steps: int = 1) -> str:
        return await recorder.run("local", "write", key, True, "", steps)

    async with (
        Client(recording_server(recorder, "a")) as a,
        Client(recording_server(recorder, "b")) as b,
        Dispatcher(max_concurrency=limit) as dispatcher,
    ):
        await dispatcher.add_mcp_server("a", a, trusted=True, max_concurrency=limit_a)
        await dispatcher.add_mcp_server("b", b, trusted=trusted_b)
        dispatcher.add_function(local_read, name="read", annotations=ToolAnnotations(read_only_hint=True))
        dispatcher.add_function(local_write, name="write")
        calls = []
        for index, (tool, server, steps) in enumerate(specs):
            key = f"c{index}"
            if tool == "unknown":
                calls.append(ToolCall(key, "nope", {"key": key}))
            elif tool == "fail":
                calls.append(ToolCall(key, "fail", {"key": key}, server=server if server != "local" else "a"))
            elif server == "local":
                calls.append(ToolCall(key, f"local__{tool}", {"key": key, "steps": steps}))
            else:
                calls.append(ToolCall(key, tool, {"key": key, "steps": steps}, server=server))
        with anyio.fail_after(30):
            results = await dispatcher.dispatch(calls)
        assert dispatcher.idle

    assert [r.call_id for r in results] == [c.id for c in calls]
    for (tool, _, _), result in zip(specs, results, strict=True):
        expected = {
            "read": CallStatus.OK,
            "write": CallStatus.OK,
            "fail": CallStatus.TOOL_ERROR,
            "unknown": CallStatus.FAILED,
        }[tool]
        assert result.status is expected, result.error
    keys = [e.key for e in recorder.executions]
    assert len(keys) == len(set(keys)), "a call executed twice"
    assert set(keys) == {c.id for c, (tool, _, _) in zip(calls, specs, strict=True) if tool != "unknown"}
    assert recorder.violations == []
    assert limit is None or recorder.max_active <= limit
    assert limit_a is None or recorder.max_active_by_server.get("a", 0) <= limit_a
    if not trusted_b:
        b_calls = [e for e in recorder.executions if e.server == "b"]
        for execution in b_calls:
            others = [
                o
                for o in recorder.executions
                if o is not execution
                and o.end is not None
                and execution.end is not None
                and o.start < execution.end
                and execution.start < o.end
            ]
            assert not others, "a call of an untrusted server overlapped another call"
    check_order(calls, recorder)
