"""The mixed batch of local calls that the scale tests send: reads, writes, unknown tools and bad arguments.

`mixed_batch(size)` is the same mix at every size, repeating every 50 calls: call 0 of each 50 names a
tool nobody offers, call 1 gives ``peek`` an argument of the wrong type (both fail, each in its own
result), the positions in `writes` call ``bump`` (a mutating tool: each one a barrier) and every other
call reads with ``peek``. The caller registers ``peek(key: int)`` read-only and ``bump(key: int)``; with
``waits=True`` every read also passes ``wait`` (true for every third call), for a ``peek`` that takes it.

So a batch of `size` calls (a multiple of 50) has ``2 * size // 50`` failing calls and
``len(writes) * size // 50`` writes, whatever the size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatcher import ToolCall

if TYPE_CHECKING:
    from collections.abc import Collection


def mixed_batch(size: int, *, writes: Collection[int] = (2,), waits: bool = False) -> list[ToolCall]:
    """`size` calls of the mix: an unknown tool and a bad argument per 50, ``bump`` at `writes`, else ``peek``."""
    assert not {0, 1} & set(writes), "positions 0 and 1 of each 50 are the failing calls"
    calls = []
    for i in range(size):
        kind = i % 50
        if kind == 0:
            calls.append(ToolCall(f"c{i}", "no_such_tool", {"key": i}))
        elif kind == 1:
            calls.append(ToolCall(f"c{i}", "peek", {"key": "not a number"}))
        elif kind in writes:
            calls.append(ToolCall(f"c{i}", "bump", {"key": i}))
        elif waits:
            calls.append(ToolCall(f"c{i}", "peek", {"key": i, "wait": i % 3 == 0}))
        else:
            calls.append(ToolCall(f"c{i}", "peek", {"key": i}))
    return calls
