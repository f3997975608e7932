"""What a workload reports: measurements, ratios between variants, and the issue's targets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ._measure import Stat, paired_ratios

__all__ = ["Comparison", "Row", "Target", "WorkloadResult"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One variant measured in one case: its median and spread, in `unit`."""

    case: str
    variant: str
    unit: str
    stat: Stat
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """A ratio between two variants of one case, from paired repetitions.

    `better` says which direction favours the dispatcher: "lower" when the dispatcher's time is the
    numerator, "higher" when it is the denominator (a speedup) or a ratio of rates.
    """

    case: str
    numerator: str
    denominator: str
    ratio: Stat
    better: Literal["lower", "higher"]

    @classmethod
    def paired(
        cls,
        case: str,
        numerator: tuple[str, list[float]],
        denominator: tuple[str, list[float]],
        *,
        better: Literal["lower", "higher"],
    ) -> Comparison:
        """Compare two variants' measurements repetition by repetition."""
        return cls(
            case=case,
            numerator=numerator[0],
            denominator=denominator[0],
            ratio=Stat.of(paired_ratios(numerator[1], denominator[1])),
            better=better,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A target from the issue, checked against a median."""

    name: str
    value: float
    op: Literal["<=", ">="]
    threshold: float
    detail: str = ""

    @property
    def met(self) -> bool:
        """Whether the median meets the target."""
        return self.value <= self.threshold if self.op == "<=" else self.value >= self.threshold


@dataclass(slots=True, kw_only=True)
class WorkloadResult:
    """Everything one workload measured."""

    name: str
    title: str
    params: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Named series for the plots: each a list of points (dicts of plain numbers and labels).
    series: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def row(self, case: str, variant: str, unit: str, samples: list[float], note: str = "") -> Stat:
        """Add a row from raw samples already in `unit`; returns their statistics."""
        stat = Stat.of(samples)
        self.rows.append(Row(case=case, variant=variant, unit=unit, stat=stat, note=note))
        return stat

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        data = dataclasses.asdict(self)
        data["targets"] = [{**dataclasses.asdict(target), "met": target.met} for target in self.targets]
        return data
