"""The report's first screen: every target of a run, its figure and spread, the reference figure, and
whether it is met; then each workload's headline.

It is built from `Run`s, so it reads the same from a run just measured, a results file
(`python -m benchmarks --show FILE`) and `benchmarks/reference.json`. Nothing in it names a workload: a
new workload's targets appear as they are, found in the reference by `Target.reference_key` within their
workload. A target named ``asyncio: ...`` or ``trio, ...`` is one backend's figure: the backends of a
target share a line, one column each; a target with no backend in its name is its workload's
``params["backend"]`` figure, or the figure of the one backend its ``params["backends"]`` lists (a run
on trio only is labelled trio); a workload that names none, or several, is labelled with the first
(asyncio, anyio's default, when it names none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._measure import Stat
    from ._results import Run, Target, WorkloadResult

__all__ = ["BACKENDS", "NO_VERDICTS", "Cell", "Line", "Summary", "summarize"]

BACKENDS = ("asyncio", "trio")
_BACKEND = re.compile(r"^(asyncio|trio)[:,] (.+)$", re.S)

# What the quick run says instead of verdicts: a fact about the run, in words that read as no failure.
NO_VERDICTS = "quick run: figures only, no verdicts"
QUICK_NOTE = (
    "Quick run: figures without verdicts. Its few repetitions at smaller sizes cannot tell a few percent "
    "from noise; `make bench` (the full run) gives the verdicts."
)

State = Literal["met", "not met", "figure", "missing", "not in this run"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One backend's figure of a target: this run's and the reference's.

    `state` is ``"met"`` or ``"not met"`` (a run with verdicts), ``"figure"`` (the quick run: the figure
    without a verdict), ``"missing"`` (the reference has the target, this full run's workload did not
    report it) or ``"not in this run"`` (the same in the quick run, which leaves parts out).
    """

    state: State
    target: Target | None
    reference: Target | None

    @property
    def other_sizes(self) -> bool:
        """Whether this run measured the target at other sizes than the full run (its name differs)."""
        return self.target is not None and self.target.reference_key != self.target.name


@dataclass(frozen=True, slots=True, kw_only=True)
class Line:
    """One target of one workload, with a cell per backend it was measured (or is expected) on."""

    workload: str
    label: str
    goal: str
    cells: dict[str, Cell] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """What the first screen shows."""

    run: Run
    reference: Run | None
    lines: list[Line]
    backends: list[str]
    # (workload, headline) for every workload of the run that has one.
    headlines: list[tuple[str, str]]

    def count(self, state: State) -> int:
        """How many cells are in this state."""
        return sum(1 for line in self.lines for cell in line.cells.values() if cell.state == state)


def split_backend(name: str, workload: WorkloadResult) -> tuple[str, str]:
    """(backend, the name without it): ``"trio: 1. x"`` is trio's ``"1. x"``; a name with no backend is
    the workload's."""
    match = _BACKEND.match(name)
    if match is not None:
        return match.group(1), match.group(2)
    return _backend_of(workload), name


def _backend_of(workload: WorkloadResult) -> str:
    """The backend a workload's targets without one in their names were measured on (module docstring)."""
    backend = workload.params.get("backend")
    if isinstance(backend, str):
        return backend
    backends = workload.params.get("backends")
    if isinstance(backends, list) and backends and all(isinstance(name, str) for name in backends):
        return str(backends[0])
    return BACKENDS[0]


def _goal(target: Target) -> str:
    return f"{target.op} {target.threshold:g}"


def summarize(run: Run, reference: Run | None) -> Summary:
    """The first screen of `run`, its targets set against `reference` (None: no reference figures)."""
    references = {workload.name: workload for workload in reference.workloads} if reference is not None else {}
    lines: list[Line] = []
    for workload in run.workloads:
        by_key: dict[str, Line] = {}
        for target in workload.targets:
            backend, key = split_backend(target.reference_key, workload)
            _, label = split_backend(target.name, workload)
            line = by_key.get(key)
            while line is not None and backend in line.cells:
                # Two targets of one name on one backend: each keeps a line of its own.
                key += " (again)"
                line = by_key.get(key)
            if line is None:
                line = by_key[key] = Line(workload=workload.name, label=label, goal=_goal(target))
            state: State = ("met" if target.met else "not met") if run.verdicts else "figure"
            line.cells[backend] = Cell(state=state, target=target, reference=None)
        published = references.get(workload.name)
        if published is not None:
            _add_reference(published, by_key, missing="missing" if run.verdicts else "not in this run")
        lines.extend(by_key.values())
    seen = {backend for line in lines for backend in line.cells}
    backends = [b for b in BACKENDS if b in seen] + sorted(seen - set(BACKENDS))
    headlines = [(workload.name, workload.headline) for workload in run.workloads if workload.headline]
    return Summary(run=run, reference=reference, lines=lines, backends=backends, headlines=headlines)


def _add_reference(published: WorkloadResult, by_key: dict[str, Line], *, missing: State) -> None:
    """Set each reference figure beside this run's; a target only the reference has gets a `missing` cell."""
    for target in published.targets:
        backend, key = split_backend(target.reference_key, published)
        line = by_key.get(key)
        if line is None:
            _, label = split_backend(target.name, published)
            line = by_key[key] = Line(workload=published.name, label=label, goal=_goal(target))
        cell = line.cells.get(backend)
        if cell is None:
            line.cells[backend] = Cell(state=missing, target=None, reference=target)
        else:
            line.cells[backend] = Cell(state=cell.state, target=cell.target, reference=target)


# Formatting -------------------------------------------------------------------------------------------


def figure(value: float) -> str:
    """A target's figure: three decimals for ratios (a target of 1.03 needs them), fewer for larger figures."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if magnitude else "0"


def spread(stat: Stat | None) -> str:
    """The IQR of the figure's distribution, or how many runs it is, or nothing when it is a single figure."""
    if stat is None:
        return ""
    if stat.n < 2:
        return " (1 run)"
    low, high = figure(stat.q1), figure(stat.q3)
    # Two decimals are enough for a spread: the figure beside it has three.
    if abs(stat.q3) < 10:
        low, high = f"{stat.q1:.2f}", f"{stat.q3:.2f}"
    return f" ({low}-{high})"


_STYLES = {"met": "green", "not met": "bold red", "missing": "yellow", "figure": "", "not in this run": "dim"}
_WORDS = {"met": "met", "not met": "NOT MET", "missing": "missing", "figure": "", "not in this run": "not run"}


def cell_text(cell: Cell | None) -> tuple[str, str]:
    """(text, rich style) of a cell: the figure, its spread and the verdict."""
    if cell is None:
        return "", ""
    word = _WORDS[cell.state]
    if cell.target is None:
        return word, _STYLES[cell.state]
    text = figure(cell.target.value) + spread(cell.target.spread) + ("*" if cell.other_sizes else "")
    return (f"{text} {word}" if word else text), _STYLES[cell.state]


def reference_text(line: Line, backends: list[str]) -> str:
    """The reference figures of a line, one per backend it has, in column order."""
    shown = [line.cells[backend] for backend in backends if backend in line.cells]
    values = [figure(cell.reference.value) if cell.reference is not None else "none" for cell in shown]
    return " / ".join(values)


def heading(run: Run) -> str:
    """What ran, where and how long, in one line."""
    machine = run.machine
    where = ", ".join(
        str(part)
        for part in (
            f"{machine['cpu_count']} cores" if machine.get("cpu_count") else None,
            machine.get("cpu_model"),
            f"CPython {machine['python']}" if machine.get("python") else None,
        )
        if part
    )
    commit = machine.get("git_commit")
    at = f" at {commit}{'+' if machine.get('git_dirty') else ''}" if commit else ""
    return f"{run.command}{at}: {run.elapsed_seconds:.1f} s" + (f" on {where}" if where else "")
