"""The timeline as a picture: a matplotlib ``Figure`` with one bar per call in its status's colour."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core._calls import CallStatus

if TYPE_CHECKING:
    import os

    from matplotlib.figure import Figure

    from ..timeline import Timeline, TimelineRow

__all__ = ["draw_picture"]

# Colours of the picture, chosen to stay distinct for the common forms of colour blindness (Okabe-Ito).
_COLOURS = {
    CallStatus.OK: "#009E73",
    CallStatus.TOOL_ERROR: "#E69F00",
    CallStatus.FAILED: "#D55E00",
    CallStatus.TIMEOUT: "#CC79A7",
    CallStatus.CANCELLED: "#999999",
    CallStatus.DENIED: "#0072B2",
}
_WAITING_COLOUR = "#DDDDDD"
_UNFINISHED_COLOUR = "#56B4E9"


def draw_picture(timeline: Timeline, path: str | os.PathLike[str] | None, *, title: str | None) -> Figure:
    """`Timeline.plot`: the timeline as a matplotlib ``Figure``, saved to `path` if one is given."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError(
            'Timeline.plot needs matplotlib: pip install "mcp-dispatcher[plot]" (or pip install matplotlib)'
        ) from exc
    rows = timeline.rows
    origin = timeline.origin
    figure = Figure(figsize=(9, 1.2 + 0.32 * max(len(rows), 1)), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    ends = {id(row): row.finished_at if row.finished_at is not None else timeline.end for row in rows}
    by_id: dict[str, list[tuple[int, TimelineRow]]] = {}
    for y, row in enumerate(rows):
        by_id.setdefault(row.call.id, []).append((y, row))
        queued = (row.queued_at - origin) * 1000
        began = ((row.started_at if row.started_at is not None else ends[id(row)]) - origin) * 1000
        if began > queued:
            axes.broken_barh([(queued, began - queued)], (y - 0.3, 0.6), facecolors=_WAITING_COLOUR)
        colour = _COLOURS[row.status] if row.status is not None else _UNFINISHED_COLOUR
        if row.started_at is not None:
            run = (ends[id(row)] - row.started_at) * 1000
            axes.broken_barh([(began, max(run, 0.0))], (y - 0.4, 0.8), facecolors=colour)
            for retry in row.attempt_starts[1:]:
                at = (retry - origin) * 1000
                axes.plot([at, at], [y - 0.4, y + 0.4], color="white", linewidth=2)
        else:
            axes.plot([began], [y], marker="X", markersize=9, color=colour, linestyle="none")
    for y, row in enumerate(rows):
        # An arrow from the end of the call it waited for, or (dashed) of the one it depended on.
        after = row.depends_on
        if after is None and row.wait is not None and row.wait.after:
            after = row.wait.after[-1]
        if after is None:
            continue
        candidates = [(by, other) for by, other in by_id.get(after, []) if other.batch == row.batch]
        if not candidates:
            continue
        by, other = candidates[0]
        start = ((ends[id(other)]) - origin) * 1000
        began = ((row.started_at if row.started_at is not None else ends[id(row)]) - origin) * 1000
        style = "--" if row.depends_on is not None else "-"
        axes.annotate(
            "",
            xy=(began, y),
            xytext=(start, by),
            arrowprops={"arrowstyle": "->", "color": "#444444", "linewidth": 0.8, "linestyle": style},
        )
    # A "$" would start matplotlib's mathtext, which an odd call id could make fail to parse.
    axes.set_yticks(range(len(rows)), [row.label.replace("$", r"\$") for row in rows])
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xlim(0, max((timeline.end - origin) * 1000, 1e-3) * 1.02)
    axes.set_xlabel("ms since the first call was submitted")
    axes.grid(axis="x", color="#EEEEEE")
    axes.set_axisbelow(True)
    seen = [status for status in CallStatus if any(row.status is status for row in rows)]
    handles = [Patch(facecolor=_WAITING_COLOUR, label="waiting")]
    handles += [Patch(facecolor=_COLOURS[status], label=status.value) for status in seen]
    if any(row.status is None for row in rows):
        handles.append(Patch(facecolor=_UNFINISHED_COLOUR, label="unfinished"))
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    if title:
        axes.set_title(title)
    if path is not None:
        figure.savefig(path)
    return figure
