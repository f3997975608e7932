"""The applications built on the dispatcher: `tune`, `inspect`, and the `dispatcher` command line.

- `tune` (`_sweep`, public as `dispatcher.tuning`): sweep a concurrency limit against a server. Its parts:
  workloads (`_workloads`), the closed-loop measurement of one setting (`_measure`), the recommendation
  (`_recommend`), and the report with the reading of a sweep's measurements into it (`_report`).
- `inspect` (`_inspect`): how a dispatcher would treat a server's tools, with warnings.
- The command line (`_main`, with one module per subcommand and `_targets` for the server options they
  share), presentation with `rich` (`_present`, `_plot`), and `machine_info` (`_machine`), which the
  benchmark suite records too.

The command line needs the `cli` extra (``pip install 'mcp-dispatcher[cli]'``, for `rich`); `tune` and
`inspect` as functions do not.
"""

from ._inspect import Report as Report
from ._inspect import inspect_server as inspect_server
from ._machine import machine_info as machine_info
from ._main import main as main

__all__ = ["Report", "inspect_server", "machine_info", "main"]
