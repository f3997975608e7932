"""The timeline as a Chrome trace-event JSON object, which Perfetto and chrome://tracing open."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..timeline import Timeline

__all__ = ["chrome_trace"]


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """`Timeline.chrome_trace`: one process per batch, one thread per call, times in microseconds."""
    origin = timeline.origin
    events: list[dict[str, Any]] = []

    def micros(time: float) -> float:
        return round((time - origin) * 1e6, 3)

    batches = sorted({row.batch for row in timeline.rows})
    for batch in batches:
        pid = batch + 1
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"batch {pid}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    positions: dict[int, int] = {}
    for row in timeline.rows:
        pid = row.batch + 1
        tid = positions[pid] = positions.get(pid, 0) + 1
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": row.label}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        end = row.finished_at if row.finished_at is not None else timeline.end
        began = row.started_at if row.started_at is not None else end
        args: dict[str, Any] = {
            "call_id": row.call.id,
            "tool": row.tool or row.call.name,
            "server": row.server,
            "status": row.status.value if row.status is not None else "unfinished",
            "attempts": row.attempts,
        }
        if row.error is not None:
            args["error"] = row.error
        if row.wait is not None:
            args["waited_for"] = row.wait.describe()
        if row.depends_on is not None:
            args["depends_on"] = row.depends_on
        if row.keys and row.keys != ("",):
            args["keys"] = list(row.keys)
        if began > row.queued_at:
            events.append(
                {
                    "name": f"waiting: {row.wait.kind}" if row.wait is not None else "waiting",
                    "cat": "wait",
                    "ph": "X",
                    "ts": micros(row.queued_at),
                    "dur": round(max(began - row.queued_at, 0.0) * 1e6, 3),
                    "pid": pid,
                    "tid": tid,
                    "args": args,
                }
            )
        events.append(
            {
                "name": row.tool or row.call.name,
                "cat": args["status"],
                "ph": "X" if row.started_at is not None else "i",
                "ts": micros(began),
                **({"dur": round(max(end - began, 0.0) * 1e6, 3)} if row.started_at is not None else {"s": "t"}),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )
        for attempt, retry in enumerate(row.attempt_starts[1:], start=2):
            events.append(
                {
                    "name": f"attempt {attempt}",
                    "cat": "retry",
                    "ph": "i",
                    "s": "t",
                    "ts": micros(retry),
                    "pid": pid,
                    "tid": tid,
                    "args": {"call_id": row.call.id},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"producer": "dispatcher.timeline"}}
