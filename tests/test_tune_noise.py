"""`tune`'s advice to try a wider range needs a gain beyond the noise of the measurements, not only beyond 10%."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import anyio
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from dispatcher.examples import Workspace
from dispatcher.tuning import recommend, tune

from .test_tune import setting


def noisy_server(seed: int) -> MCPServer[Any]:
    """A server with room for any number of calls, each taking 5 to 95 ms (seeded)."""
    server: MCPServer[Any] = MCPServer("noisy")
    draw = random.Random(seed)

    async def lookup(name: str) -> str:
        """Look a name up."""
        await anyio.sleep(draw.uniform(0.005, 0.095))
        return name

    server.add_tool(lookup, annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    return server


@pytest.mark.anyio
@pytest.mark.backends("asyncio", "trio", "trio-mockclock")
async def test_one_measurement_of_a_few_calls_never_asks_for_a_wider_range(virtual_clock: bool) -> None:
    """Two callers, so 2 and 4 run the same: 3 calls measured once each read as up to 108% more at 4.

    That gain was noise (throughput cannot differ), and the advice said to try a wider range; now it says the
    gain is within the noise of 3 calls and to measure with more calls or repeats.
    """
    explanations = []
    for seed in range(12):
        report = await tune(noisy_server(seed), "reads", (2, 4), trusted=True, calls=3, repeats=1, clients=2)
        explanations.append(report.explanation)
    assert not [why for why in explanations if "wider range" in why], explanations
    noise = [why for why in explanations if "within the noise of these measurements (3 calls a measurement" in why]
    if virtual_clock:  # on the virtual clock the seeds give the same draws: four of them came out higher at 4
        assert len(noise) == 4, explanations
    assert all(why.endswith("measure again with more --calls or --repeats to tell.") for why in noise)


@pytest.mark.anyio
@pytest.mark.backends("trio-mockclock")
async def test_a_real_gain_at_the_top_still_asks_for_a_wider_range() -> None:
    """A server with room for 8 calls, swept to 4 with enough calls: the gain stands out of the noise.

    On the virtual clock only: on a loaded machine's real clock the repeats scatter, and then the advice is
    rightly not to widen the range.
    """
    report = await tune(Workspace(latency=0.02, saturation=8).server, "reads", (1, 2, 4), trusted=True, calls=60)
    assert report.recommended == 4
    assert report.explanation.endswith("throughput was still growing, so try a wider range."), report.explanation


def test_the_noise_of_a_measurement_shrinks_with_its_calls() -> None:
    """30% more at the top: noise in 3 calls a measurement, evidence in 100; the repeats' spread counts too."""
    few = [setting(1, 20.0, calls=3), setting(2, 26.0, calls=3)]
    _, _, why = recommend(few)
    assert "wider" not in why and "within the noise of these measurements (3 calls a measurement, one" in why
    _, _, why = recommend([setting(1, 20.0), setting(2, 26.0)])
    assert why.endswith("so try a wider range."), why
    # Three repeats of 100 calls each: the lowest at 2 (21) is below the highest at 1 (22), so 30% is noise.
    spread = [
        replace(setting(1, 20.0, calls=300), repeats=3, throughput_range=(18.0, 22.0)),
        replace(setting(2, 26.0, calls=300), repeats=3, throughput_range=(21.0, 30.0)),
    ]
    _, _, why = recommend(spread)
    assert "wider" not in why and "(100 calls a measurement, 3 measurements a setting)" in why, why
