"""Find the concurrency limit that suits a server: sweep `max_concurrency`, measure, recommend.

`tune` runs a workload against one server under each setting, over one connection, and measures
throughput and p50/p95 run and queue times; `TuneReport.recommended` is the smallest setting within 5%
of the best throughput. The `dispatcher tune` command is the same from a terminal (docs/tuning.md).
"""

from ._tune import DEFAULT_SETTINGS as DEFAULT_SETTINGS
from ._tune import SettingResult as SettingResult
from ._tune import TuneProgress as TuneProgress
from ._tune import TuneReport as TuneReport
from ._tune import load_workload as load_workload
from ._tune import recommend as recommend
from ._tune import render_table as render_table
from ._tune import synthetic_workload as synthetic_workload
from ._tune import tune as tune

__all__ = [
    "DEFAULT_SETTINGS",
    "SettingResult",
    "TuneProgress",
    "TuneReport",
    "load_workload",
    "recommend",
    "render_table",
    "synthetic_workload",
    "tune",
]
