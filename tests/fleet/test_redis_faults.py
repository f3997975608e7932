"""Faults of the fleet's Redis and races between its processes, against a real redis-server.

Six connections cutting the shared limit at one instant; redis-server killed (SIGKILL) and started again
on its port while calls hold and wait; redis-server frozen (SIGSTOP) past the lease, then resumed. Each
checks what the fleet promises: one result per call, no two writes holding at once, nothing hangs past
the configured waits.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import redis

from dispatcher.fleet._lua import LIMIT

if TYPE_CHECKING:
    from benchmarks._redis import RedisServer


def test_six_clients_cutting_the_shared_limit_at_once_cut_it_once_per_round_and_never_below_the_floor(
    redis_server: RedisServer,
) -> None:
    """Six connections send the same round's cut at one instant, forty rounds, with growths and stale cuts mixed in.

    Each round exactly one cut applies (the others were sent under the epoch it ended), the level stays
    within floor and ceiling, and the epoch moves by one per applied cut: no oscillation, no lost cut.
    """
    floor, ceiling, initial = 2, 64, 40
    clients = [redis.Redis.from_url(redis_server.url, decode_responses=True) for _ in range(6)]
    scripts = [client.register_script(LIMIT) for client in clients]
    barrier = threading.Barrier(len(clients))
    replies: list[list[Any]] = []
    lock = threading.Lock()

    def send(number: int, op: str, epoch: int, value: float) -> None:
        barrier.wait()
        reply = scripts[number](keys=["limit"], args=[floor, ceiling, initial, op, epoch, value, "inf"])
        with lock:
            replies.append([op, *reply])

    try:
        level, epoch = float(initial), 0
        for round_ in range(40):
            replies.clear()
            threads = []
            for number in range(len(clients)):
                # Four cut this round; one grows under it; one cuts under the round before (stale).
                op, sent, value = ("cut", epoch, 0.5) if number < 4 else ("grow", epoch, 3.0)
                if number == 5:
                    op, sent = "cut", epoch - 1
                threads.append(threading.Thread(target=send, args=(number, op, sent, value)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
            assert len(replies) == 6, replies
            cuts = [reply for reply in replies if reply[0] == "cut" and reply[3] == 1]
            assert len(cuts) == 1, (round_, replies)
            final_level, final_epoch = (
                float(clients[0].hget("limit", "level") or "nan"),
                int(clients[0].hget("limit", "epoch") or "-1"),
            )
            assert final_epoch == epoch + 1, (round_, replies)
            # The growth applies only when it came before the cut (same epoch); the cut halves at most.
            assert floor <= final_level <= min(ceiling, level + 3), (round_, level, replies)
            assert final_level <= max(floor, (level + 3) * 0.5 + 1e-9), (round_, level, replies)
            level, epoch = final_level, final_epoch
        assert level == floor  # forty halvings end at the floor, never below it
    finally:
        for client in clients:
            client.close()
