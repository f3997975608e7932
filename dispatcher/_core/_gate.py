"""Admission control: which submitted call may start now.

`Gate` is a synchronous state machine with no I/O, so every interleaving can be tested without an event
loop.

The rule
--------
Every call (a *ticket*) carries a set of conflict keys naming the state it touches and is either a read
(concurrent) or exclusive (it may mutate). Keys are paths of ``/``-separated segments; two keys
conflict when one is a prefix of the other segment-wise (``"github"`` conflicts with
``"github/repo:acme"``, which does not conflict with ``"github/repo:acme-2"``). The root key ``""``
conflicts with every key; it is the default, and with every call on it the rule is exactly the ordered
barriers of `benchmarks/reference.py` (a fair readers-writer lock in submission order).

A call may start when every call submitted before it that has a key conflicting with one of its own,
where either of the two is exclusive, has finished or was withdrawn. Reads never wait for reads. Among
the calls that may start, the oldest starts first, within the limits: a global cap on running calls and
optional per-server caps. A call whose server is at its cap is *parked* and later calls of other
servers go first; it comes back as soon as its server has room. Nothing overtakes a call it conflicts
with, so no call starves, across concurrent batches too.

A call can be submitted *held* (waiting for something else, such as a person's approval): it keeps its
place in the order and blocks what conflicts with it, but does not start until `release`. `reclassify`
changes a waiting call's keys or class at its place: a read that becomes exclusive waits for what was
submitted before it and for the later calls it conflicts with that already started, and every later
call that now conflicts with it waits for it.

How it is computed
------------------
Multi-granularity locking: a read takes S on each of its keys and IS on their ancestors, an exclusive
call X and IX. Two tickets conflict exactly when they hold incompatible modes on a shared node
(X is compatible with nothing, S with IS and S, IX with IS and IX). Each node keeps, per mode, the
unfinished tickets in submission order and the tickets still blocked there. A ticket is blocked at a node
while the oldest unfinished ticket of a mode incompatible with its own is older than itself; it is ready
when it is blocked nowhere.

Cost, with d the number of nodes a call touches (its keys and their ancestors: 1 for the root key, 2 for
``"github"``, 3 for ``"github/repo:acme"``):

- `submit`, `finish`, `withdraw`, `release`: O(d), amortised; each ticket enters and leaves each of its
  per-node queues once. This does not depend on how many calls are queued, for one domain or many.
- `take`: O(1) amortised when calls become ready in submission order (always the case when every call
  is on one key: the root key by default, or one domain without key functions); otherwise O(log r), r
  being the calls ready but held back by a limit (a heap orders them by age). Parking a call for its
  server's cap costs O(log p), p being that server's parked calls.
- `reclassify`: rebuilds the whole state, O(n d) for n unfinished calls. It happens only when a changed
  tool definition is approved while calls of it wait.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable

__all__ = ["ROOT", "ROOT_KEYS", "Gate", "Ticket", "TicketState", "conflicts", "lock_nodes", "normalize_keys"]

T = TypeVar("T")

ROOT = ""
ROOT_KEYS = (ROOT,)
_ROOT_KEYS = ROOT_KEYS

# Lock modes on a node of the key tree.
_IS, _IX, _S, _X = 0, 1, 2, 3
# _BLOCKERS[m]: the modes, held by an older unfinished ticket, that keep a ticket of mode m waiting.
_BLOCKERS: tuple[tuple[int, ...], ...] = ((_X,), (_S, _X), (_IX, _X), (_IS, _IX, _S, _X))
# _UNBLOCKS[m]: the modes whose waiting tickets may go ahead when a ticket of mode m ends.
_UNBLOCKS: tuple[tuple[int, ...], ...] = ((_X,), (_S, _X), (_IX, _X), (_IS, _IX, _S, _X))
_INFINITY = float("inf")
# Normalised key sets and their nodes, by the keys as given: most calls repeat a few key sets.
_CACHE_SIZE = 4096


class TicketState(enum.Enum):
    HELD = "held"
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    WITHDRAWN = "withdrawn"


# The states, read once here: on Python 3.11 each read of an Enum class's attribute (`TicketState.RUNNING`) goes
# through the metaclass's `__getattr__` hook (about 45 ns), several times per call in `submit`, `take` and `finish`.
_HELD = TicketState.HELD
_PENDING = TicketState.PENDING
_RUNNING = TicketState.RUNNING
_DONE = TicketState.DONE
_WITHDRAWN = TicketState.WITHDRAWN
_WAITING = (_PENDING, _HELD)


def _segments(key: str) -> tuple[str, ...]:
    return tuple(segment for segment in key.split("/") if segment)


def normalize_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """A key set in canonical form: empty segments dropped, keys under another key of the set removed.

    The result is sorted; it is ``("",)`` (the root key) if any key is the root, or if there is none.
    """
    paths = sorted({_segments(key) for key in keys}, key=len)
    kept: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    for path in paths:
        if not path:
            return _ROOT_KEYS
        if any(path[:i] in seen for i in range(1, len(path))):
            continue
        seen.add(path)
        kept.append(path)
    if not kept:
        return _ROOT_KEYS
    return tuple(sorted("/".join(path) for path in kept))


def conflicts(first: Iterable[str], second: Iterable[str]) -> bool:
    """Whether two key sets conflict: some key of one is a segment-wise prefix of a key of the other."""
    a = [_segments(key) for key in first]
    b = [_segments(key) for key in second]
    return any(x[: len(y)] == y or y[: len(x)] == x for x in a for y in b)


def lock_nodes(keys: tuple[str, ...], exclusive: bool) -> tuple[tuple[str, int], ...]:
    """The nodes a normalised key set locks, with the mode on each."""
    own, intent = (_X, _IX) if exclusive else (_S, _IS)
    modes: dict[str, int] = {}
    for key in keys:
        path = _segments(key)
        for i in range(len(path)):
            modes["/".join(path[:i])] = intent
    for key in keys:
        modes[key] = own
    return tuple(modes.items())


_ROOT_READ = ((ROOT, _S),)
_ROOT_EXCLUSIVE = ((ROOT, _X),)


class _Node:
    """One node of the key tree: per mode, its unfinished tickets and the ones blocked here."""

    __slots__ = ("open", "waiting")

    def __init__(self) -> None:
        self.open: tuple[deque[Ticket[object]], ...] = (deque(), deque(), deque(), deque())
        self.waiting: tuple[deque[Ticket[object]], ...] = (deque(), deque(), deque(), deque())


class Ticket(Generic[T]):
    """A call's place in the gate."""

    __slots__ = ("_blocked", "_nodes", "_seq", "_waiters", "exclusive", "item", "keys", "server", "state")

    def __init__(
        self,
        item: T,
        exclusive: bool,
        server: Hashable | None,
        keys: tuple[str, ...],
        nodes: tuple[tuple[str, int], ...],
        seq: int,
        state: TicketState,
    ) -> None:
        self.item = item
        self.exclusive = exclusive
        self.server = server
        self.keys = keys
        self.state = state
        self._nodes = nodes
        self._seq = seq
        # The nodes where it is blocked, plus the later running calls it waits for (after a reclassify).
        self._blocked = 0
        # Waiting calls that wait for this running one to end (only after a reclassify).
        self._waiters: list[Ticket[object]] | None = None

    def __repr__(self) -> str:
        kind = "exclusive" if self.exclusive else "read"
        return f"<Ticket #{self._seq} {kind} {self.keys} {self.state.value}>"


class Gate(Generic[T]):
    """Decides the order in which calls start.

    Args:
        limit: The most calls running at once, or None for no limit.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.running = 0
        self.readied = 0
        """How many times a call became ready to start: a change tells that `take` may give more."""
        self._seq = 0
        self._tree: dict[str, _Node] = {}
        # Tickets not yet done or withdrawn, in submission order.
        self._open: dict[int, Ticket[T]] = {}
        # Ready tickets: those that became ready in submission order, and the others by age.
        self._fifo: deque[Ticket[T]] = deque()
        self._heap: list[tuple[int, Ticket[T]]] = []
        self._server_limits: dict[Hashable, int] = {}
        self._server_running: dict[Hashable, int] = {}
        self._parked: dict[Hashable, list[tuple[int, Ticket[T]]]] = {}
        self._cache: dict[tuple[tuple[str, ...], bool], tuple[tuple[str, ...], tuple[tuple[str, int], ...]]] = {}

    def set_server_limit(self, server: Hashable, limit: int | None) -> None:
        """Cap the calls running at once on one server (None removes the cap).

        A cap that did not grow brings back no parked call; one that grew brings back as many as it
        has room for (an adaptive limit moves at every answer: a full pass over the parked calls each
        time would cost O(p log p)).
        """
        old = self._server_limits.get(server)
        if limit is None:
            self._server_limits.pop(server, None)
        else:
            self._server_limits[server] = limit
        parked = self._parked.get(server)
        if not parked or (old is not None and limit is not None and limit <= old):
            return
        if limit is None:
            del self._parked[server]
            for _, ticket in parked:
                self._ready(ticket)
            return
        for _ in range(limit - self._server_running.get(server, 0)):
            if server not in self._parked:
                break
            self._unpark(server)

    def server_limit(self, server: Hashable) -> int | None:
        """A server's cap (None: none)."""
        return self._server_limits.get(server)

    def server_waiting(self, server: Hashable) -> bool:
        """Whether calls of a server wait for room under its cap (parked: nothing else holds them back)."""
        return bool(self._parked.get(server))

    def server_running(self, server: Hashable) -> int:
        """How many calls of a server are running."""
        return self._server_running.get(server, 0)

    @property
    def idle(self) -> bool:
        """Whether no call is waiting or running."""
        return not self._open

    def submit(
        self,
        item: T,
        *,
        exclusive: bool,
        server: Hashable | None = None,
        held: bool = False,
        keys: tuple[str, ...] = _ROOT_KEYS,
    ) -> Ticket[T]:
        """Queue a call behind everything submitted before it; a held call waits for `release`.

        Args:
            item: What the ticket stands for.
            exclusive: Whether the call may mutate: it then waits for every earlier call it conflicts
                with, and every later call it conflicts with waits for it.
            server: The server whose cap the call counts against, if any.
            held: Whether the call waits for `release` before it may start.
            keys: The call's conflict keys (default: the root key, which conflicts with everything).
        """
        normal: tuple[str, ...]
        nodes: tuple[tuple[str, int], ...]
        if keys is _ROOT_KEYS:  # `_locks`, inline for the default
            normal, nodes = _ROOT_KEYS, _ROOT_EXCLUSIVE if exclusive else _ROOT_READ
        else:
            normal, nodes = self._locks(keys, exclusive)
        seq = self._seq
        self._seq = seq + 1
        ticket = Ticket(item, exclusive, server, normal, nodes, seq, _HELD if held else _PENDING)
        self._open[seq] = ticket
        self._enter(ticket)  # type: ignore[arg-type]
        if not held and not ticket._blocked:
            # `_ready`, inline (a new ticket is the latest: it goes to the end of the FIFO)
            self.readied += 1
            fifo = self._fifo
            if not fifo or fifo[-1]._seq < seq:
                fifo.append(ticket)
            else:
                heapq.heappush(self._heap, (seq, ticket))
        return ticket

    def _locks(self, keys: tuple[str, ...], exclusive: bool) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
        if keys is _ROOT_KEYS:
            return _ROOT_KEYS, _ROOT_EXCLUSIVE if exclusive else _ROOT_READ
        cache = self._cache
        found = cache.get((keys, exclusive))
        if found is None:
            if len(cache) >= _CACHE_SIZE:
                cache.clear()
            normal = normalize_keys(keys)
            found = cache[(keys, exclusive)] = (normal, lock_nodes(normal, exclusive))
        return found

    def _enter(self, ticket: Ticket[object]) -> None:
        """Add a ticket's locks behind every unfinished ticket, counting the nodes where it is blocked."""
        tree = self._tree
        waits = ticket.state is not _RUNNING
        for path, mode in ticket._nodes:
            node = tree.get(path)
            if node is None:
                node = tree[path] = _Node()
            queues = node.open
            if waits:
                for blocker in _BLOCKERS[mode]:
                    if queues[blocker]:
                        node.waiting[mode].append(ticket)
                        ticket._blocked += 1
                        break
            queues[mode].append(ticket)

    def _ready(self, ticket: Ticket[T]) -> None:
        self.readied += 1
        fifo = self._fifo
        if not fifo or fifo[-1]._seq < ticket._seq:
            fifo.append(ticket)
        else:
            heapq.heappush(self._heap, (ticket._seq, ticket))

    @property
    def may_take(self) -> int:
        """At most how many calls `take` would start now (0: it certainly returns None)."""
        ready = len(self._fifo) + len(self._heap)
        limit = self.limit
        return ready if limit is None or ready <= limit - self.running else max(limit - self.running, 0)

    def take(self) -> Ticket[T] | None:
        """Start the next call the rules allow, or return None if none may start now."""
        if self.limit is not None and self.running >= self.limit:
            return None
        fifo = self._fifo
        heap = self._heap
        limits = self._server_limits
        while fifo or heap:
            if heap and (not fifo or heap[0][0] < fifo[0]._seq):
                ticket = heapq.heappop(heap)[1]
            else:
                ticket = fifo.popleft()
            if ticket.state is not _PENDING or ticket._blocked:
                continue  # withdrawn after it became ready
            server = ticket.server
            if server is not None and server in limits and self._server_running.get(server, 0) >= limits[server]:
                heapq.heappush(self._parked.setdefault(server, []), (ticket._seq, ticket))
                continue
            ticket.state = _RUNNING
            self.running += 1
            if server is not None:
                self._server_running[server] = self._server_running.get(server, 0) + 1
            return ticket
        return None

    def finish(self, ticket: Ticket[T]) -> None:
        """Mark a running call as ended, freeing its place."""
        if ticket.state is not _RUNNING:
            raise RuntimeError(f"finish() on a ticket that is {ticket.state.value}, not running")
        ticket.state = _DONE
        self.running -= 1
        server = ticket.server
        if server is not None:
            self._server_running[server] -= 1
        self._close(ticket)
        waiters = ticket._waiters
        if waiters is not None:
            ticket._waiters = None
            for waiter in waiters:
                self._unblock(waiter)  # type: ignore[arg-type]
        if server is not None:
            self._unpark(server)

    def release(self, ticket: Ticket[T]) -> None:
        """Make a held call admissible; it keeps its original place in the order."""
        if ticket.state is not _HELD:
            raise RuntimeError(f"release() on a ticket that is {ticket.state.value}, not held")
        ticket.state = _PENDING
        if not ticket._blocked:
            self._ready(ticket)

    def withdraw(self, ticket: Ticket[T]) -> bool:
        """Remove a call that has not started; returns False if it already started or ended."""
        if ticket.state not in _WAITING:
            return False
        ticket.state = _WITHDRAWN
        # Left in the ready and parked queues and in the nodes' blocked queues: skipped when reached.
        self._close(ticket)
        if ticket.server is not None:
            # It may have been the parked call brought back when its server got room: bring another.
            self._unpark(ticket.server)
        return True

    def reclassify(
        self,
        ticket: Ticket[T],
        *,
        exclusive: bool | None = None,
        keys: tuple[str, ...] | None = None,
        held: bool | None = None,
    ) -> bool:
        """Change a waiting call's class, keys or hold, at its place in the order.

        A call that becomes exclusive waits for every earlier call it conflicts with and for the later
        ones it conflicts with that already started; later calls that now conflict with it wait for it.

        Returns:
            False if the call has already started or ended (nothing changed).
        """
        if ticket.state not in _WAITING:
            return False
        if exclusive is not None:
            ticket.exclusive = exclusive
        ticket.keys, ticket._nodes = self._locks(ticket.keys if keys is None else keys, ticket.exclusive)
        if held is not None:
            ticket.state = _HELD if held else _PENDING
        self._rebuild()
        return True

    def _close(self, ticket: Ticket[T]) -> None:
        """Remove an ended or withdrawn ticket's locks and let the tickets it blocked go ahead."""
        del self._open[ticket._seq]
        tree = self._tree
        for path, mode in ticket._nodes:
            node = tree[path]
            queues = node.open
            queue = queues[mode]
            if queue[0] is not ticket:
                continue  # an older ticket of its mode is still there: nothing changes here yet
            queue.popleft()
            while queue and queue[0].state not in _WAITING and queue[0].state is not _RUNNING:
                queue.popleft()
            if not (queues[0] or queues[1] or queues[2] or queues[3]):
                # Nothing unfinished is left here; what the blocked queues still hold was withdrawn.
                del tree[path]
                continue
            for waiting_mode in _UNBLOCKS[mode]:
                waiting = node.waiting[waiting_mode]
                if not waiting:
                    continue
                frontier: float = _INFINITY
                for blocker in _BLOCKERS[waiting_mode]:
                    if queues[blocker]:
                        frontier = min(frontier, queues[blocker][0]._seq)
                while waiting and waiting[0]._seq <= frontier:
                    self._unblock(waiting.popleft())  # type: ignore[arg-type]

    def _unblock(self, ticket: Ticket[T]) -> None:
        if ticket.state not in _WAITING:
            return
        ticket._blocked -= 1
        if not ticket._blocked and ticket.state is _PENDING:
            self._ready(ticket)

    def _unpark(self, server: Hashable) -> None:
        parked = self._parked.get(server)
        if parked is None:
            return
        limit = self._server_limits.get(server)
        if limit is not None and self._server_running.get(server, 0) >= limit:
            return
        # The server has room: its oldest parked call still waiting goes back among the ready ones.
        while parked:
            ticket = heapq.heappop(parked)[1]
            if ticket.state is _PENDING and not ticket._blocked:
                self._ready(ticket)
                break
        if not parked:
            del self._parked[server]

    def _rebuild(self) -> None:
        """Recompute every lock and readiness from the unfinished tickets, in submission order."""
        self._tree = {}
        self._fifo.clear()
        self._heap.clear()
        self._parked.clear()
        tickets = list(self._open.values())
        for ticket in tickets:
            ticket._blocked = 0
            ticket._waiters = None
        for ticket in tickets:
            self._enter(ticket)  # type: ignore[arg-type]
        # A running ticket later than a waiting one it conflicts with (possible only after a
        # reclassify): the waiting one must not start before it ends.
        for running in tickets:
            if running.state is not _RUNNING:
                continue
            waiters: list[Ticket[object]] = []
            for path, mode in running._nodes:
                queues = self._tree[path].open
                for other in _BLOCKERS[mode]:
                    for waiting in queues[other]:
                        if waiting._seq >= running._seq:
                            break
                        if waiting.state in _WAITING and waiting not in waiters:
                            waiters.append(waiting)
                            waiting._blocked += 1
            if waiters:
                running._waiters = waiters
        for ticket in tickets:
            if ticket.state is _PENDING and not ticket._blocked:
                self._ready(ticket)
