"""Find the concurrency limit that suits a server: sweep `max_concurrency`, measure, recommend.

`tune` runs a workload against one server under each setting, over one connection, several times
(`repeats`), and measures throughput and p50/p95 run and queue times, with their spread;
`TuneReport.recommended` is the knee: the smallest setting within 5% of the best throughput per unit of
run time, or the smallest setting when no setting matters (throughput flat while latency grows).
``tune(..., online=True)`` then runs the online limit on the same workload (`TuneReport.online`, an
`OnlineResult`). The `dispatcher tune` command is the same from a terminal (docs/tuning.md).
`render_table` needs `rich` (``pip install 'mcp-dispatcher[cli]'``).
"""

from .._exports import rehome as _rehome
from ..cli._present import render_tune as render_table
from ._measure import SettingResult as SettingResult
from ._online import OnlineResult as OnlineResult
from ._recommend import recommend as recommend
from ._report import TuneProgress as TuneProgress
from ._report import TuneReport as TuneReport
from ._sweep import DEFAULT_REPEATS as DEFAULT_REPEATS
from ._sweep import DEFAULT_SETTINGS as DEFAULT_SETTINGS
from ._sweep import tune as tune
from ._workloads import load_workload as load_workload
from ._workloads import synthetic_workload as synthetic_workload

__all__ = [
    "DEFAULT_REPEATS",
    "DEFAULT_SETTINGS",
    "OnlineResult",
    "SettingResult",
    "TuneProgress",
    "TuneReport",
    "load_workload",
    "recommend",
    "render_table",
    "synthetic_workload",
    "tune",
]


# The classes exported here report this module as their home (`dispatcher.tuning.TuneReport`, not a private module).
_rehome(globals())
