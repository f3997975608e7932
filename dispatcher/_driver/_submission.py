"""Submission: the executor's part that turns a checked call into a record in the lifecycle and a ticket in the gate.

`Submission` is the part of the executor (`_execution.Executor` derives from it) that queues calls:
each call's name is resolved in the catalogue, its arguments checked (a call of a server that takes
idempotency keys gets its key first, `_give_key`), its conflict keys read, and its ticket submitted to
the gate, held while its approval is asked (`_asking`). A call that cannot run settles at once as
REJECTED, or SKIPPED after a failure it may depend on (`FailFast`). A long batch is submitted in
slices of a few milliseconds, letting the loop run between them (`submit_yielding`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._core._errors import ArgumentError, DispatcherClosedError, KeyRuleError
from .._core._idempotency import IdempotencyKeys, call_key, takes_key
from .._core._keys import call_keys
from .._core._lifecycle import Ending
from ._asking import Approvals
from ._batch import PendingCall

if TYPE_CHECKING:
    from .._core._calls import ToolCall
    from .._core._catalog import Resolution, ToolEntry
    from ._batch import Batch

__all__ = ["Submission"]

# Seconds of submitting calls after which `submit_yielding` lets the loop run, how many calls it
# submits between two readings of the clock, and the most readings in one slice: a virtual clock (trio's
# MockClock) stands still while tasks run, so time alone would never end a slice there.
_SLICE = 0.002
_SLICE_CHECK = 32
_SLICE_READINGS = 16


class Submission(Approvals):
    """The executor's submission of calls (see the module's description)."""

    # How each server declared to deduplicate takes its idempotency keys, and the secret they derive from.
    _idempotency: dict[str, IdempotencyKeys]
    _key_secret: bytes

    def check_open(self) -> None:
        """Raise `DispatcherClosedError` unless calls can be submitted."""
        if not self._open:
            raise DispatcherClosedError("the Dispatcher is not open: use it inside `async with Dispatcher() as d:`")

    # Submission ------------------------------------------------------------------------------------

    def submit_all(self, batch: Batch, calls: list[ToolCall]) -> list[PendingCall]:
        """Queue checked calls of `batch` in order."""
        queue = self._queue
        names: dict[object, _Known] = {}
        works = []
        now = self._now()
        for position, call in enumerate(calls, start=1):
            works.append(queue(batch, call, names, now))
            if not position % _SLICE_CHECK:
                now = self._now()
        self._pump()
        return works

    async def submit_yielding(self, batch: Batch, calls: list[ToolCall]) -> None:
        """Queue checked calls of `batch` in order, letting the event loop run every few milliseconds.

        Checking a call's arguments takes microseconds, so a batch of thousands would otherwise hold
        the loop for as long (and, with no concurrency limit, start all of its calls in one go); the loop
        also runs at least every `_SLICE_CHECK * _SLICE_READINGS` calls, for a clock that stands still. If the
        caller is cancelled meanwhile, the calls already queued are cancelled and awaited.
        """
        queue = self._queue
        clock = self._now
        now = clock()
        until = now + _SLICE
        readings = _SLICE_READINGS
        names: dict[object, _Known] = {}
        for position, call in enumerate(calls, start=1):
            queue(batch, call, names, now)
            if position % _SLICE_CHECK:
                continue
            now = clock()
            readings -= 1
            if now >= until or not readings:
                self._pump()
                try:
                    await anyio.lowlevel.checkpoint()
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        batch.cancel()
                        await batch.wait()
                    raise
                now = clock()
                until = now + _SLICE
                readings = _SLICE_READINGS
                names.clear()  # the catalogue may have changed while the loop ran
        self._pump()

    def submit(self, batch: Batch, call: ToolCall) -> PendingCall:
        """Queue one checked call of `batch`; a call that cannot run settles at once as FAILED."""
        work = self._queue(batch, call)
        self._pump()
        return work

    def _queue(
        self, batch: Batch, call: ToolCall, names: dict[object, _Known] | None = None, now: float | None = None
    ) -> PendingCall:
        """Queue one checked call of `batch` without starting anything; see `submit`.

        `names` keeps the resolutions of the names seen so far in one synchronous run of submissions,
        during which the catalogue cannot change; `now`, a recent reading of the loop clock (one per
        few dozen calls of a run), is taken as the time the call was queued.
        """
        if not self._open:
            self.check_open()
        if now is None:
            now = self._now()
        work = PendingCall(call, batch, now)
        batch._add(work)
        name = call.name
        if names is not None and type(name) is str and call.server is None:
            known = names.get(name)
            if known is None:
                known = names[name] = _known(self._catalog.resolve(name))
            resolution, fixed, exclusive = known
        else:
            resolution = self._catalog.resolve(name, call.server)
            fixed = exclusive = None
        hooks = work.hooks
        entry = resolution.entry
        if hooks is not None:
            work.observe(hooks.queued(call, entry, now))
        if entry is None or resolution.impl is None:
            work.settle(Ending.REJECTED, now, resolution.error, untrusted=resolution.untrusted)
            return work
        work.resolve(entry, resolution.impl)
        arguments = call.arguments if call.arguments is not None else {}
        if type(arguments) is not dict and not isinstance(arguments, Mapping):
            work.settle(Ending.REJECTED, now, _invalid_arguments(arguments))
            return work
        # Checking arguments against an untrusted server's schema can quote it (a required argument's
        # name is whatever the server wrote): every result of an untrusted server's tool is marked.
        try:
            sent = arguments
            if self._idempotency and entry.server in self._idempotency:
                sent = self._give_key(work, batch.number, entry, arguments)
            work.prepare(resolution.impl.prepare(sent))
        except ArgumentError as exc:
            work.settle(Ending.REJECTED, now, exc, untrusted=not entry.trusted)
            return work
        except Exception as exc:
            error = f"invalid arguments: {type(exc).__name__}: {exc}"
            work.settle(Ending.REJECTED, now, error, untrusted=not entry.trusted)
            return work
        if fixed is not None:
            keys = fixed
        else:
            try:
                keys = call_keys(entry, arguments)
            except KeyRuleError as exc:
                work.settle(Ending.REJECTED, now, f"invalid conflict keys: {exc}")
                return work
        if exclusive is None:
            exclusive = entry.exclusive
        fail_fast = batch.fail_fast
        if fail_fast:  # an earlier call of the batch failed: this one may depend on it
            dependency = fail_fast.blocker(work.position, keys)
            if dependency is not None:
                work.skip(keys, dependency, now)  # with its keys: a failure in turn, for what conflicts with it
                return work
        if hooks is None:
            work.enter(self.gate.submit(work, exclusive=exclusive, server=entry.server, keys=keys), held=False)
            return work
        state = work.state
        assert state is not None
        state.keys = keys
        request = hooks.approval(call, entry, state)
        held = request is not None
        work.enter(self.gate.submit(work, exclusive=exclusive, server=entry.server, held=held, keys=keys), held=held)
        if request is not None:
            self._ask(work, request)
        return work

    def set_idempotency(self, server: str, keys: IdempotencyKeys | None) -> None:
        """How `server` takes idempotency keys from now on (None: it takes none)."""
        if keys is None:
            self._idempotency.pop(server, None)
        else:
            self._idempotency[server] = keys

    def _keyed(self, entry: ToolEntry) -> bool:
        """Whether the calls of `entry` carry their server's idempotency key (a write that can take it)."""
        how = self._idempotency.get(entry.server) if entry.server is not None else None
        return how is not None and not entry.annotations.read_only_hint and takes_key(how, entry.input_schema)

    def _give_key(
        self, work: PendingCall, batch: int, entry: ToolEntry, arguments: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """Give a call of a server that takes idempotency keys its key, if its tool takes one.

        One key per logical call, the same on every attempt. On a server that takes the key in an
        argument, that argument is the dispatcher's on every call: what the model put there is dropped,
        and the call's key put in its place before the arguments are checked, so that a tool whose
        schema requires the argument takes a call the model could not give it to.

        Returns:
            The arguments to check and send.
        """
        server = entry.server
        assert server is not None
        how = self._idempotency[server]
        argument = how.argument
        if argument is not None and argument in arguments:
            arguments = {name: value for name, value in arguments.items() if name != argument}
        if not self._keyed(entry):
            return arguments
        key = call_key(self._key_secret, batch, work.position, work.call.id, server, entry.tool)
        if how.meta is not None:
            work.carry_key(meta={how.meta: key})
            return arguments
        assert argument is not None
        work.carry_key()
        return {**arguments, argument: key}


# A name's resolution in one synchronous run of submissions, with what every call of it shares: its
# conflict keys when its tool has no key function (its domain, or the root key), and whether it is exclusive.
_Known = tuple["Resolution", "tuple[str, ...] | None", "bool | None"]


def _known(resolution: Resolution) -> _Known:
    entry = resolution.entry
    if entry is None:
        return resolution, None, None
    fixed = call_keys(entry, {}) if entry.key_function is None else None  # read no argument
    return resolution, fixed, entry.exclusive


def _invalid_arguments(arguments: object) -> str:
    """Why arguments that are not a mapping are rejected; JSON text that failed to parse says where."""
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            # RecursionError: nested deeper than the parser goes, which fails this call alone.
            why = exc if isinstance(exc, ValueError) else "nested too deep to parse"
            text = arguments if len(arguments) <= 200 else f"{arguments[:200]}..."
            return f"invalid arguments: expected a JSON object, got text that is not valid JSON ({why}): {text!r}"
        return "invalid arguments: expected a JSON object, got a str of JSON text; parse it into a dict"
    return f"invalid arguments: expected a JSON object, got {type(arguments).__name__}"
