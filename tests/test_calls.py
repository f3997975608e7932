"""`ToolResult` as the executor builds it."""

from __future__ import annotations

import dataclasses

import pytest
from mcp.types import CallToolResult, TextContent

from dispatcher import CallStatus, Effect, ToolCall, ToolResult
from dispatcher._core._lifecycle import build_result as settled_result


def test_the_executor_builds_results_equal_to_the_constructor() -> None:
    """`settled_result` gives the same frozen ToolResult as the constructor, field by field."""
    call = ToolCall("c1", "read", {"key": "k"}, server="files")
    answer = CallToolResult(content=[TextContent(type="text", text="boom")], is_error=True)
    fast = settled_result(
        call,
        CallStatus.TOOL_ERROR,
        answer,
        "boom",
        2,
        "read",
        "files",
        1.0,
        1.5,
        2.5,
        ("timed out",),
        True,
        Effect.RAN,
        False,
    )
    built = ToolResult(
        call,
        CallStatus.TOOL_ERROR,
        result=answer,
        error="boom",
        attempts=2,
        tool="read",
        server="files",
        queued_at=1.0,
        started_at=1.5,
        finished_at=2.5,
        attempt_errors=("timed out",),
        untrusted_content=True,
        effect=Effect.RAN,
        mutating=False,
    )
    assert type(fast) is ToolResult and not hasattr(fast, "__dict__")
    assert fast == built and dataclasses.astuple(fast) == dataclasses.astuple(built)
    assert fast.run_time == 1.0 and fast.queue_time == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.status = CallStatus.OK  # type: ignore[misc]
