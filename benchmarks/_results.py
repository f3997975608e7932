"""What a workload reports: measurements, ratios between variants, and the issue's targets; and a whole
run (its workloads, the command and the machine) as written to and read back from its JSON file."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ._measure import Stat, paired_ratios

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Comparison", "Row", "Run", "Target", "WorkloadResult"]


def _stat(data: dict[str, Any]) -> Stat:
    return Stat(**{name: data[name] for name in ("median", "q1", "q3", "min", "max", "n")})


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One variant measured in one case: its median and spread, in `unit`."""

    case: str
    variant: str
    unit: str
    stat: Stat
    note: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        """The row as `WorkloadResult.to_json` wrote it."""
        return cls(
            case=data["case"], variant=data["variant"], unit=data["unit"], stat=_stat(data["stat"]), note=data["note"]
        )


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
    def from_json(cls, data: dict[str, Any]) -> Comparison:
        """The comparison as `WorkloadResult.to_json` wrote it."""
        return cls(
            case=data["case"],
            numerator=data["numerator"],
            denominator=data["denominator"],
            ratio=_stat(data["ratio"]),
            better=data["better"],
        )

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
    """A target from the issue, checked against a median.

    `spread` is the distribution the figure summarises, when it has one (the paired ratios whose median
    it is, or the repetitions it is the median of, in the figure's unit): the report prints its IQR.
    `key` is the target's name in the full run when this run's sizes put other numbers in its name (the
    quick run times 10,000 calls where the full run times 100,000): the report finds the reference figure
    by it. None means the name is the same in every run.
    """

    name: str
    value: float
    op: Literal["<=", ">="]
    threshold: float
    detail: str = ""
    spread: Stat | None = None
    key: str | None = None

    @property
    def met(self) -> bool:
        """Whether the median meets the target."""
        return self.value <= self.threshold if self.op == "<=" else self.value >= self.threshold

    @property
    def reference_key(self) -> str:
        """What the target is called in the full run, which `benchmarks/reference.json` records."""
        return self.key if self.key is not None else self.name

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Target:
        """The target as `WorkloadResult.to_json` wrote it (older files have no spread and no key)."""
        spread = data.get("spread")
        return cls(
            name=data["name"],
            value=data["value"],
            op=data["op"],
            threshold=data["threshold"],
            detail=data.get("detail", ""),
            spread=_stat(spread) if spread is not None else None,
            key=data.get("key"),
        )


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
    # What the workload shows in a few words, for the report's first screen beside the targets (the
    # workloads with no target say there what they found).
    headline: str = ""

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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkloadResult:
        """The workload as `to_json` wrote it, from this version's files or an older one's."""
        return cls(
            name=data["name"],
            title=data["title"],
            params=data.get("params", {}),
            rows=[Row.from_json(row) for row in data.get("rows", [])],
            comparisons=[Comparison.from_json(c) for c in data.get("comparisons", [])],
            targets=[Target.from_json(target) for target in data.get("targets", [])],
            notes=data.get("notes", []),
            series=data.get("series", {}),
            headline=data.get("headline", ""),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One run of the suite as its JSON file holds it: what ran, how, where, and every workload's results.

    `verdicts` is False for the quick run, whose few repetitions cannot support a verdict: its targets'
    figures are shown without saying whether they are met.
    """

    workloads: list[WorkloadResult]
    command: str
    quick: bool
    verdicts: bool
    elapsed_seconds: float
    created: str = ""
    machine: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON document (a quick run's targets have `"met": null`)."""
        workloads = {result.name: result.to_json() for result in self.workloads}
        if not self.verdicts:
            for workload in workloads.values():
                for target in workload["targets"]:
                    target["met"] = None
        return {
            "created": self.created,
            "command": self.command,
            "quick": self.quick,
            "verdicts": self.verdicts,
            "elapsed_seconds": round(self.elapsed_seconds, 1),
            "machine": self.machine,
            "workloads": workloads,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        """The run a results file (or `benchmarks/reference.json`) holds."""
        return cls(
            workloads=[WorkloadResult.from_json(workload) for workload in data["workloads"].values()],
            command=data.get("command", ""),
            quick=bool(data.get("quick", False)),
            verdicts=bool(data.get("verdicts", not data.get("quick", False))),
            elapsed_seconds=float(data.get("elapsed_seconds", 0.0)),
            created=data.get("created", ""),
            machine=data.get("machine", {}),
        )

    @classmethod
    def load(cls, path: Path) -> Run:
        """Read a results file.

        Raises:
            ValueError: The file is not a results file of this suite.
        """
        try:
            data = json.loads(path.read_text())
            return cls.from_json(data)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path} is not a results file of python -m benchmarks: {exc!r}") from exc
