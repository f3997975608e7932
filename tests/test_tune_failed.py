"""`tune` when every call failed and then the server stopped answering: no setting is blamed for the loss."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import Tool as MCPTool
from mcp.types import ToolAnnotations

from dispatcher.tuning import load_workload, tune
from dispatcher.tuning._report import Conclusion, conclude

from .test_tune import setting

if TYPE_CHECKING:
    from dispatcher.tuning._measure import SettingResult


class FailingThenGone(MCPServer[Any]):
    """Every call of `lookup` fails; once one was made, listing the tools (the next setting) is refused, as gone."""

    def __init__(self) -> None:
        super().__init__("failing")
        self.called = False

        async def lookup(name: str) -> str:
            """Look a name up."""
            self.called = True
            raise ToolError(f"no {name}")

        self.add_tool(lookup, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))

    async def list_tools(self) -> list[MCPTool]:
        if self.called:
            raise MCPError(-32000, "Connection closed")
        return await super().list_tools()


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_every_call_failed_then_the_server_was_lost_blames_no_setting() -> None:
    """Setting 1's calls all failed (tool errors), then the server went: 1 was said to be lost "while measured".

    The old sentence: "the server stopped answering while 1 was measured, before any setting was measured
    whole", the failures taken for the connection's. Now: every call failed, and then the server went.
    """
    workload = load_workload(['{"name": "lookup", "arguments": {"name": "a"}}'])
    report = await tune(FailingThenGone(), workload, (1, 2, 4), trusted=True, calls=5, repeats=2)
    assert report.cut_short == "server_lost"
    assert report.recommended is None and report.best is None
    assert [(s.limit, s.calls, s.errors > 0) for s in report.settings] == [(1, 0, True)], report.settings
    assert report.explanation.startswith("every measured call failed, at 1"), report.explanation
    assert "(lookup: tool_error: " in report.explanation and "no a" in report.explanation
    assert "then the server stopped answering (" in report.explanation
    assert "while 1 was measured" not in report.explanation and "left out" not in report.explanation


def lost_during_4(measured: dict[int, list[SettingResult]]) -> Conclusion:
    """`conclude` on a sweep of 1 to 8 whose server stopped answering while 4 was measured."""
    return conclude(
        measured,
        share=1.0,
        tolerance=0.05,
        planned_top=8,
        synthetic=False,
        repeats=1,
        cut_short="server_lost",
        max_time=None,
        lost="Connection closed, before measuring 8",
        lost_during=4,
    )


def test_every_setting_failed_is_said_so_whichever_setting_was_measured_last() -> None:
    """Pure: 1, 2 and 4 all failed every call, the server lost after 4: no "4 is left out", no "only 2 was"."""
    failed = [
        replace(setting(limit, 0.0, calls=0), errors=10, error="tool_error: nope", error_tool="lookup")
        for limit in (1, 2, 4)
    ]
    verdict = lost_during_4({1: [failed[0]], 2: [failed[1]], 4: [failed[2]], 8: []})
    assert verdict.recommended is None and verdict.best is None
    assert verdict.explanation.startswith(
        "every measured call failed, at 1 and 2 and 4 (lookup: tool_error: nope), so there is nothing to recommend; "
        "then the server stopped answering (Connection closed, before measuring 8)"
    ), verdict.explanation
    assert "4 is left out" not in verdict.explanation
    # One setting that succeeded keeps the old reading: the last one's failures are the connection's.
    mixed = {1: [setting(1, 10.0)], 2: [setting(2, 20.0)], 4: [failed[2]], 8: []}
    kept = lost_during_4(mixed)
    assert kept.recommended == 2 and "4 is left out: the server stopped answering" in kept.explanation
