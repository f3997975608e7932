"""The workspace's ledger: one `ToolRun` for each execution of a tool, in the order they started."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dispatcher.testing import Outcome

__all__ = ["KEY", "ToolRun", "replay"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolRun:
    """One tool execution, as the workspace's ledger records it.

    An entry is recorded when the execution starts, so executions that then hang or are cancelled are
    counted too. Calls the SDK rejects before the tool runs (an unknown tool, invalid arguments) and
    calls an injected fault stopped never reach this ledger (the injector's ledger has those).

    Attributes:
        seq: Its position in the order executions started, from 0.
        tool: The tool's name.
        arguments: The arguments it was called with.
        started: `anyio.current_time()` when it started.
        ended: `anyio.current_time()` when it ended, or `None` while it runs.
        outcome: How it ended (see `dispatcher.testing.Outcome`).
        running_at_start: The `seq` of every execution still running when it started.
    """

    seq: int
    tool: str
    arguments: Mapping[str, str]
    started: float
    ended: float | None = None
    outcome: Outcome = "running"
    running_at_start: frozenset[int] = field(default_factory=frozenset)

    @property
    def in_flight_at_start(self) -> int:
        """How many executions were running when it started, itself included."""
        return len(self.running_at_start) + 1

    def overlaps(self, other: ToolRun) -> bool:
        """Whether the two executions ran at the same time.

        This reads the order of events rather than the clock, so it is exact even when virtual time
        stands still and both executions start and end at the same instant.
        """
        return self.seq in other.running_at_start or other.seq in self.running_at_start


# The idempotency key of the call a tool function runs for, when the workspace honours keys.
KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("workspace_idempotency_key", default=None)


def replay(answer: str | Exception) -> str:
    """The first outcome of a key again: its result, or the same error."""
    if isinstance(answer, Exception):
        raise answer
    return answer
