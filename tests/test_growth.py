"""The adaptive limit's growth rule (`_core._growth` and how `_core._adaptive` uses it), as a model on a mock clock.

Pure discrete-event simulations: no event loop, every time exact.
"""

from __future__ import annotations

import heapq
import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher import AdaptiveLimit
from dispatcher._core._adaptive import Controller, Flight, Signal
from dispatcher._core._growth import Outstanding, Overlap, Proof


def _bursts(
    controller: Controller,
    capacity: list[tuple[float, int]],
    end: float,
    seed: int = 0,
    latency: float = 0.1,
    slowdowns: list[tuple[float, float]] | None = None,
    arrival: bool = False,
) -> list[tuple[float, float, int, list[int]]]:
    """Bursts of 4 to 64 calls, 1 to 5 s apart, against a server that serves `capacity` at full speed and shares
    itself past it (each call's latency is fixed when it is sent). Returns each burst's (start, end, calls, the
    limits after each of its answers); `slowdowns` gets each call's (send time, latency / unloaded latency).
    `arrival`: a call's load is the calls in flight when it arrives (the example `Workspace`'s model): of calls
    sent at one instant, the first ones see less load than the last."""
    rng = random.Random(seed)
    now = 0.0
    out: list[tuple[float, float, int, list[int]]] = []

    def cap(at: float) -> int:
        return [c for t, c in capacity if at >= t][-1]

    while now < end:
        size = rng.randint(4, 64)
        start, queued, running, seq = now, size, 0, 0
        events: list[tuple[float, int, Flight]] = []
        limits: list[int] = []

        def fill(at: float, events: list[tuple[float, int, Flight]]) -> None:
            nonlocal queued, running, seq
            batch: list[Flight] = []
            while queued and running < controller.limit:
                queued -= 1
                running += 1
                batch.append(controller.start(at))
            # The server's load: the calls that have not ended by now (one that ends now does not count,
            # whether or not its answer has been told yet), and every call sent now (they share it).
            load = len(batch) + sum(1 for due, _, _ in events if due > at)
            for index, flight in enumerate(batch):
                seen = load - len(batch) + index + 1 if arrival else load
                heapq.heappush(events, (at + latency * max(1.0, seen / cap(at)), seq, flight))
                if slowdowns is not None:
                    slowdowns.append((at, max(1.0, seen / cap(at))))
                seq += 1

        fill(now, events)
        while events:
            now, _, flight = heapq.heappop(events)
            running -= 1
            controller.finish(flight, now, Signal.ANSWER, tool="t", waiting=queued > 0)
            limits.append(controller.limit)
            if not events or events[0][0] > now:
                fill(now, events)  # once every answer of the instant is in: the calls sent now share the server
        out.append((start, now, size, limits))
        now += rng.uniform(1.0, 5.0)
    return out


def test_bursts_settle_within_20_percent_of_the_capacity() -> None:
    """Bursts against 8, then 3, then 16: from the second burst of each phase on, the limit at each burst's end
    is within 20% of the capacity (plus the probe's one call), and in the last phase each later burst takes
    at most one round more than the capacity needs."""
    phases = [(0.0, 8), (15.0, 3), (30.0, 16)]
    bursts = _bursts(Controller(AdaptiveLimit()), phases, 45.0)
    for begin, knee in phases:
        inside = [burst for burst in bursts if begin <= burst[0] < begin + 15.0]
        assert len(inside) >= 2
        for _, _, _, limits in inside[1:]:
            assert abs(limits[-1] - knee) <= 0.2 * knee + 1, (knee, limits)
    for start, stop, size, _ in [burst for burst in bursts if burst[0] >= 30.0][1:]:
        rounds = -(-size // 16)
        assert stop - start <= 0.1 * (rounds + 1) + 1e-9, (size, stop - start)


def test_slow_start_is_bounded_by_what_is_proven() -> None:
    """While no knee is known, no round sends more than max(proven + 1, 1.25 x proven) calls: from 4 against a
    server of 8, the limit never overshoots to twice the capacity as a doubling slow start would."""
    bursts = _bursts(Controller(AdaptiveLimit()), [(0.0, 8)], 0.5)
    limits = bursts[0][3]
    assert max(limits) <= 10, limits  # 8 proven: 1.25 x 8 at most
    assert limits[-1] in (8, 9)


@settings(max_examples=60, deadline=None)
@given(proven=st.integers(2, 40), over=st.integers(1, 20))
def test_a_slow_answer_above_proven_never_cuts_below_proven(proven: int, over: int) -> None:
    """Answers at the unloaded speed with `proven` in flight, then one answer sent above proven whose slowdown the
    calls past proven explain (Little's law): the limit goes back to proven, never below."""
    controller = Controller(AdaptiveLimit(initial=proven))
    first = [controller.start(0.0) for _ in range(proven)]
    for flight in first:
        controller.finish(flight, 0.1, Signal.ANSWER, tool="t", waiting=True)
    sent = proven + over
    flights = [controller.start(0.1) for _ in range(sent)]
    assert flights[-1].in_flight == sent
    controller.finish(flights[-1], 0.1 + 0.1 * sent / proven, Signal.ANSWER, tool="t", waiting=True)
    assert controller.limit >= proven


def test_a_server_that_got_slower_is_still_cut_below_proven() -> None:
    """Proven is no floor: when the server itself serves far fewer calls than proven, the cut goes below it."""
    controller = Controller(AdaptiveLimit(initial=16))
    for flight in [controller.start(0.0) for _ in range(16)]:
        controller.finish(flight, 0.1, Signal.ANSWER, tool="t", waiting=True)
    flights = [controller.start(0.1) for _ in range(16)]
    for flight in flights:
        controller.finish(flight, 0.1 + 0.1 * 16 / 3, Signal.ANSWER, tool="t", waiting=True)
    assert controller.limit < 16


def _replay(order: list[tuple[str, int]]) -> tuple[list[int], int, float | None]:
    """Eight calls sent at 0; at 0.1 the `order` of finishes ("f", i) and new sends ("s", j); then every call still
    out answers at 0.2. Returns the new sends' counts of calls in flight, the limit and the knee."""
    controller = Controller(AdaptiveLimit(initial=8))
    first = [controller.start(0.0) for _ in range(8)]
    later: dict[int, Flight] = {}
    for kind, index in order:
        if kind == "f":
            controller.finish(first[index], 0.1, Signal.ANSWER, tool="t", waiting=True)
        else:
            later[index] = controller.start(0.1)
    counts = [later[j].in_flight for j in sorted(later)]
    for j in sorted(later):
        controller.finish(later[j], 0.2 + 0.01 * j, Signal.ANSWER, tool="t", waiting=True)
    for index in range(8):
        if not any(kind == "f" and i == index for kind, i in order):
            controller.finish(first[index], 0.3, Signal.ANSWER, tool="t", waiting=True)
    return counts, controller.limit, controller.knee


@settings(max_examples=80, deadline=None)
@given(data=st.data(), ended=st.integers(1, 8), sent=st.integers(1, 8))
def test_same_instant_events_in_any_order_give_the_same_level(data: st.DataObject, ended: int, sent: int) -> None:
    """Answers and sends at one instant, interleaved in any order (each in its own order): each send counts the
    same calls in flight, and the limit and the knee come out the same."""
    events = [("f", i) for i in range(ended)] + [("s", j) for j in range(sent)]
    finishes_first = _replay(events)
    shuffled = data.draw(st.permutations(events))
    sends = iter([event for event in events if event[0] == "s"])
    finishes = iter([event for event in events if event[0] == "f"])
    order = [next(sends) if kind == "s" else next(finishes) for kind, _ in shuffled]
    assert _replay(order) == finishes_first


def test_an_answer_at_the_instant_of_a_send_is_not_counted_in_flight() -> None:
    """A send told before an answer of the same instant counted that answer's call as in flight; the answer
    corrects it (and only the sends of that instant after the answered call's own send)."""
    overlap = Overlap()
    ended = Flight(0.0, 1, 4, 0, probe=False)
    overlap.start(ended, 0.0)
    early = Flight(0.1, 2, 4, 0, probe=False)  # sent at 0.1, told before `ended`'s answer at 0.1
    overlap.start(early, 0.1)
    assert early.in_flight == 2
    overlap.finish(ended, 0.1)
    assert early.in_flight == 1
    # A call sent after another at one instant, which then ends at it (no latency), did not share it either.
    second = Flight(0.1, 2, 4, 0, probe=False)
    overlap.start(second, 0.1)
    overlap.finish(early, 0.1)
    assert second.in_flight == 1
    overlap.finish(second, 0.2)  # another instant: nothing to correct
    assert second.in_flight == 1


def test_proof_steps() -> None:
    """Slow start from proven: one call more while few are proven, a quarter more past that, twice on a noisy server."""
    proof = Proof()
    assert proof.top(noisy=False) == 1.0
    proof.clean(3)
    assert proof.top(noisy=False) == 4.0
    proof.clean(16)
    proof.clean(5)
    assert proof.level == 16
    assert proof.top(noisy=False) == 20.0 and proof.top(noisy=True) == 32.0
    assert proof.explains(20, 16.0) and not proof.explains(16, 16.0) and not proof.explains(20, 3.0)
    proof.cut(3.5)
    assert proof.level == 3


def test_a_clean_probe_below_a_knee_seen_grows_one_call_not_to_the_knee() -> None:
    """Cut from 16 to 8 by a slowdown, a clean probe of 9 moves the knee to 9 (one call more, the next probed at
    once), not to just short of the 16 the server had had enough at: growth never overshoots a knee seen."""
    controller = Controller(AdaptiveLimit(initial=16))
    now = 0.0
    for _ in range(10):  # rounds at 4 in flight, unloaded and without noise: the traffic holds the limit back
        for flight in [controller.start(now) for _ in range(4)]:
            controller.finish(flight, now + 0.1, Signal.ANSWER, tool="t")
        now += 0.1
    flights = [controller.start(now) for _ in range(16)]
    controller.finish(flights[-1], now + 0.2, Signal.ANSWER, tool="t", waiting=True)  # 2x slower at 16: serves 8
    assert (controller.limit, controller.knee) == (8, 8.0)
    for flight in flights[:-1]:
        controller.finish(flight, now + 0.2, Signal.OTHER, tool="t")
    now += 0.2
    flights = [controller.start(now) for _ in range(8)]
    controller.finish(flights.pop(), now + 0.1, Signal.ANSWER, tool="t", waiting=True)
    assert controller.limit == 9  # a probe is armed at the knee
    flights += [controller.start(now + 0.1) for _ in range(2)]
    probe = flights[-1]
    assert probe.probe and probe.in_flight == 9
    controller.finish(probe, now + 0.2, Signal.ANSWER, tool="t", waiting=True)
    assert (controller.limit, controller.knee) == (9, 9.0)


def test_calls_sent_at_one_instant_all_count_each_other() -> None:
    """A closed loop whose six answers come back at one instant re-sends six calls then: each shares the server with
    the other five, whatever the order of the answers and sends (the first re-sent once counted itself alone, so a
    probe sent among them counted 2 of its 7 and could not grow the limit)."""
    controller = Controller(AdaptiveLimit(initial=6))
    first = [controller.start(0.0) for _ in range(6)]
    assert [flight.in_flight for flight in first] == [6] * 6
    again = []
    for flight in first:
        controller.finish(flight, 0.1, Signal.ANSWER, tool="t", waiting=True)
        again.append(controller.start(0.1))
    assert [flight.in_flight for flight in again] == [6] * 6
    # One that ends at the instant it was sent shared the server with none sent after it.
    overlap = Overlap()
    flights = [Flight(0.0, k, 4, 0, probe=False) for k in (1, 2, 3)]
    for flight in flights:
        overlap.start(flight, 0.0)
    overlap.finish(flights[0], 0.0)
    assert [flight.in_flight for flight in flights] == [1, 2, 2]


def _collapse_run(end: float) -> list[tuple[float, int]]:
    """A closed loop of 64 callers against a server that answers in 0.1 s up to 12 in flight and never past it
    (a call past 12 times out at 2 s). Returns (time, limit) after each answer."""
    controller = Controller(AdaptiveLimit())
    events: list[tuple[float, int, Flight, Signal]] = []
    seq, now, out = 0, 0.0, []

    def fill(at: float) -> None:
        nonlocal seq
        while controller.in_flight < controller.limit:
            flight = controller.start(at)
            hangs = controller.in_flight > 12
            signal = Signal.TIMEOUT if hangs else Signal.ANSWER
            heapq.heappush(events, (at + (2.0 if hangs else 0.1), seq, flight, signal))
            seq += 1

    fill(0.0)
    while events and now < end:
        now, _, flight, signal = heapq.heappop(events)
        controller.finish(flight, now, signal, tool="t", waiting=True)
        assert 1 <= controller.limit <= 64
        out.append((now, controller.limit))
        fill(now)
    return out


def test_a_timeout_cut_below_the_capacity_grows_back_to_it() -> None:
    """Cut by timeouts past 12 (a server that hangs past its capacity), the limit grows back towards 12 after each
    cut: from 30 to 60 s it averages over 10 (it stayed at the 6 the first cut left it at, its probes counted as
    sent alone), and it never went past 1.25 x 12 (plus a probe's one call)."""
    trace = _collapse_run(60.0)
    pairs = itertools.pairwise(trace)
    held = sum((min(60.0, t1) - max(30.0, t0)) * limit for (t0, limit), (t1, _) in pairs if t1 > 30.0)
    assert held / 30.0 > 10.0, held / 30.0
    assert max(limit for _, limit in trace) <= 16


def test_a_cut_by_single_answers_is_not_read_as_noise() -> None:
    """Bursts against 8, then 3, then 16, each call's load counted as it arrives (the `Workspace`'s model): the
    answers that cut the limit from 8 to 3 on their own, one after another (each slower than the last: calls sent
    at one instant arrive one by one), are load, not noise; they stay out of their round, which does not judge
    the server noisy, and the limit does not grow back a call per round past the knee (with them, 30 calls of
    the first second at capacity 3 took more than 1.25x; without, 13). The limit still reaches 16 in the first
    burst after the capacity went 3 -> 16."""
    slowdowns: list[tuple[float, float]] = []
    phases = [(0.0, 8), (15.0, 3), (30.0, 16)]
    bursts = _bursts(Controller(AdaptiveLimit()), phases, 45.0, slowdowns=slowdowns, arrival=True)
    change = next(burst for burst in bursts if burst[0] >= 15.0)
    slow = [at for at, ratio in slowdowns if change[0] <= at < change[1] and ratio > 1.25 + 1e-9]
    assert len(slow) <= 15, slow
    limits = change[3]
    settled = limits.index(3)
    assert max(limits[settled:]) <= 4, limits  # at most a probe's one call more
    first = next(burst for burst in bursts if burst[0] >= 30.0)
    assert max(first[3]) >= 0.8 * 16, first[3]


def test_bursts_slow_few_calls_past_the_p95_target() -> None:
    """Bursts against 8, then 3, then 16 (the benchmark's bursty workload, loads counted as calls arrive): under 5%
    of all calls take more than 1.25x their unloaded time (the p95 target), and the limit is back at 16 within 3 s
    of the first burst after the capacity went 3 -> 16."""
    slowdowns: list[tuple[float, float]] = []
    phases = [(0.0, 8), (15.0, 3), (30.0, 16)]
    bursts = _bursts(Controller(AdaptiveLimit()), phases, 45.0, slowdowns=slowdowns, arrival=True)
    slow = [at for at, ratio in slowdowns if ratio > 1.25 + 1e-9]
    assert len(slow) < 0.05 * len(slowdowns), (len(slow), len(slowdowns), slow)
    first = next(burst for burst in bursts if burst[0] >= 30.0)
    reached = [start for start, _, _, limits in bursts if start >= 30.0 and max(limits) >= 0.8 * 16]
    assert reached and reached[0] - first[0] <= 3.0, [(start, max(limits)) for start, _, _, limits in bursts]


def test_outstanding_counts_the_calls_sent_no_later_that_are_still_out() -> None:
    """Of the calls still out, an ending one counts those sent before it and at its own instant, not later ones."""
    out = Outstanding()
    for at in (0.0, 0.0, 0.0, 0.1, 0.2):
        out.start(at)
    assert out.finish(0.0) == 2  # the other two of its instant
    assert out.finish(0.1) == 2  # the two of 0.0 still out, not the one of 0.2
    assert out.finish(0.2) == 2  # the two of 0.0
    assert out.finish(0.0) == 1 and out.finish(0.0) == 0
    assert out.sent == []


def test_a_round_is_proven_as_far_as_its_answers_are_in() -> None:
    """A round of 20 against a server that serves 16 at full speed, its calls arriving one by one: the first 16 answer
    at the unloaded speed while the last 4 are out. They prove 16, not 20: the slow start does not go past 20 on
    them (it went to 25 before the slower 4 came back, and the 5 calls more ran 1.3x to 1.6x slower)."""
    controller = Controller(AdaptiveLimit(initial=20))
    flights = [controller.start(0.0) for _ in range(20)]
    assert {flight.in_flight for flight in flights} == {20}
    for flight in flights[:16]:
        controller.finish(flight, 0.1, Signal.ANSWER, tool="t", waiting=True)
    assert controller.limit == 20  # 16 proven: 1.25 x 16
    # Once all 20 are in at the unloaded speed, 20 is proven, a call at a time: the slow start goes on.
    for flight in flights[16:]:
        controller.finish(flight, 0.1 + 1e-9, Signal.ANSWER, tool="t", waiting=True)
    assert controller.limit == 24
