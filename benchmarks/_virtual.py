"""Virtual time on both anyio backends: trio's `MockClock`, and an asyncio loop whose clock jumps the same way.

`run(fn, *args, backend=...)` runs `fn` on a loop whose clock starts at 0 and, whenever every task waits
for a timer and nothing else, jumps to the next timer at once (trio's ``MockClock(autojump_threshold=0)``).
Sleeps cost nothing, and every figure read from the clock is exact. Only for code that does no real I/O
and starts no threads: a loop waiting on a socket or a thread would see the clock race ahead of it.

On asyncio, `VirtualEventLoop` is the standard selector loop with two changes: `time()` reads a virtual
clock, and a select that would block for a while with no event ready advances the clock by that while
instead (the way the `looptime` package does it, in a dozen lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

__all__ = ["BACKENDS", "VirtualEventLoop", "run"]

T = TypeVar("T")

BACKENDS = ("asyncio", "trio")


class _Selector(selectors.DefaultSelector):
    """A selector that, where it would wait with nothing ready, moves the loop's virtual clock instead."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualEventLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0 or self.loop is None:
            return ready if ready or timeout is not None else super().select(timeout)
        self.loop.advance(timeout)
        return []


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a virtual clock that jumps to the next timer whenever the loop would wait."""

    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        # Timers are compared with `time()` plus this resolution: keep it small, the clock is exact.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self._now += seconds


@contextlib.contextmanager
def _trio_schedule(seed: int) -> Iterator[None]:
    """Make trio's schedule a function of `seed` alone, for this run (restored after it).

    trio runs the tasks made ready at one instant in an order it picks at random (a coin from a private
    RNG seeded by the OS), after waking the timers due at one instant in the order of their cancel
    scopes' ``id()``: memory addresses, which move with the allocation history (the hash seed changes
    it). Its deterministic mode (the one pytest-trio uses under Hypothesis) sorts each batch by task
    creation and shuffles it with that RNG, so seeding the RNG makes a run repeat exactly. A benchmark
    measure only: the dispatcher never depends on it.
    """
    import trio._core._run as trio_run  # private: trio has no public switch for this

    rng = trio_run._r
    state, deterministic = rng.getstate(), trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    rng.seed(seed)
    # A Final in trio's own code: set as an attribute, which is what trio's test suite does too.
    setattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)  # noqa: B010
    try:
        yield
    finally:
        rng.setstate(state)
        setattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", deterministic)  # noqa: B010


def run(fn: Callable[..., Awaitable[T]], *args: Any, backend: str, seed: int = 0) -> T:
    """Run `fn(*args)` on `backend` ("asyncio" or "trio") with a virtual clock that jumps when all tasks wait.

    On trio, `seed` picks the order in which tasks made ready at one instant run (`_trio_schedule`): the
    same seed, the same run.
    """
    if backend == "trio":
        import trio.testing

        with _trio_schedule(seed):
            return anyio.run(
                fn, *args, backend="trio", backend_options={"clock": trio.testing.MockClock(autojump_threshold=0)}
            )
    if backend == "asyncio":
        return anyio.run(fn, *args, backend="asyncio", backend_options={"loop_factory": VirtualEventLoop})
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
