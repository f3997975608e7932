"""Progress metering: a report counts only when its progress grows (total or not), and a flood is bounded."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

from dispatcher import CallEvent, CallStatus, Dispatcher, ToolCall
from dispatcher._mcp import _progress

pytestmark = [pytest.mark.anyio, pytest.mark.backends("asyncio", "trio", "trio-mockclock")]

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def reporting_server() -> MCPServer[Any]:
    """Tools that report progress: steadily without a total, stuck on one number, or in a flood."""
    server = MCPServer("reporter")

    @server.tool(annotations=READ)
    async def steady(ctx: Context, steps: int, every: float) -> str:
        """Reports a growing number every `every` seconds, never a total."""
        for step in range(1, steps + 1):
            await anyio.sleep(every)
            await ctx.report_progress(step)
        return "done"

    @server.tool(annotations=READ)
    async def stuck(ctx: Context, steps: int, every: float) -> str:
        """Reports the same number every `every` seconds: it never progresses."""
        for _ in range(steps):
            await anyio.sleep(every)
            await ctx.report_progress(1, 10)
        return "done"

    @server.tool(annotations=READ)
    async def flood(ctx: Context, times: int) -> str:
        """Sends `times` reports as fast as it can."""
        for step in range(1, times + 1):
            await ctx.report_progress(step, float("nan") if step % 2 else None, "x" * 10_000)
        return "done"

    return server


async def test_reports_without_a_total_keep_a_long_call_alive(virtual_clock: bool) -> None:
    """A call reporting growing progress, no total, every 0.3 s runs 3 s under idle_timeout=1 and ends OK."""
    every, idle = (0.3, 1.0) if virtual_clock else (0.3, 2.0)
    async with Dispatcher(call_timeout=60, retry=None) as dispatcher:
        await dispatcher.connect("reporter", reporting_server(), trusted=True, idle_timeout=idle)
        [result] = await dispatcher.dispatch([ToolCall("1", "steady", {"steps": 10, "every": every})])
    assert result.status is CallStatus.OK, result.error


@pytest.mark.parametrize("counting", [True, False])
async def test_a_repeated_number_does_not_reset_the_idle_wait(
    virtual_clock: bool, counting: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server repeating one number is cut off at idle_timeout (False: the oracle, every report counts)."""
    if not virtual_clock:
        pytest.skip("times are checked on the virtual clock")
    if not counting:
        monkeypatch.setattr(_progress.ProgressMeter, "advances", lambda self, progress: True)
    async with Dispatcher(call_timeout=60, retry=None) as dispatcher:
        await dispatcher.connect("reporter", reporting_server(), trusted=True, idle_timeout=1.0)
        started = anyio.current_time()
        [result] = await dispatcher.dispatch([ToolCall("1", "stuck", {"steps": 10, "every": 0.5})])
    if counting:
        assert result.status is CallStatus.TIMEOUT
        assert "idle_timeout" in (result.error or "")
        assert anyio.current_time() - started == pytest.approx(1.5, abs=0.01)  # its first report, then silence
    else:
        assert result.status is CallStatus.OK, result.error


@pytest.mark.parametrize("bounded", [True, False])
async def test_a_flood_of_progress_reaches_the_hook_bounded(
    virtual_clock: bool, bounded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5,000 reports at once become at most BURST events, totals that are not numbers dropped (False: the oracle)."""
    if not bounded:
        monkeypatch.setattr(_progress.ProgressMeter, "may_report", lambda self: True)
    events: list[CallEvent] = []
    async with Dispatcher(call_timeout=60, on_event=events.append) as dispatcher:
        await dispatcher.connect("reporter", reporting_server(), trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("1", "flood", {"times": 5000})])
    assert result.status is CallStatus.OK, result.error
    progress = [event for event in events if event.kind == "progress"]
    if not bounded:
        assert len(progress) == 5000
        return
    # The in-process flood takes well under a second on a virtual clock, a few on a loaded machine.
    assert len(progress) <= _progress.BURST + (0 if virtual_clock else 10 * _progress.RATE)
    numbers = [event.progress or 0.0 for event in progress]
    assert numbers == sorted(set(numbers)), "each event's progress grows"
    assert all(event.total is None for event in progress)
    assert all(event.message is not None and len(event.message) == 500 for event in progress)


def test_only_growing_finite_numbers_count() -> None:
    """The meter counts a report when its progress is a finite number above the last one that counted."""

    async def check() -> None:
        meter = _progress.ProgressMeter()
        seen = [meter.advances(value) for value in (0, 0, 1, 0.5, float("nan"), float("inf"), True, 2, 2.5)]
        assert seen == [True, False, True, False, False, False, False, True, True]

    anyio.run(check)
