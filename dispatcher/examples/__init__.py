"""A bundled example MCP server, for tests, demos and benchmarks of `dispatcher`.

`Workspace` is a notes server with honest tool annotations, latency, saturation, faults injected by
`dispatcher.testing.inject_faults`, and a ledger of every tool execution (`ToolRun`). `serve_http`
serves any `MCPServer` over streamable HTTP on a free port. Run `python -m dispatcher.examples.workspace
--help` to start the workspace as a process.
"""

from ._http import serve_http as serve_http
from ._ledger import ToolRun as ToolRun
from ._models import FaultConfig as FaultConfig
from ._models import saturated_latency as saturated_latency
from ._workspace import Workspace as Workspace

__all__ = [
    "FaultConfig",
    "ToolRun",
    "Workspace",
    "saturated_latency",
    "serve_http",
]


# The classes exported here report this module as their home (`dispatcher.examples.Workspace`, not its private one).
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and _value.__module__.startswith("dispatcher."):
        _value.__module__ = __name__
del _name, _value
