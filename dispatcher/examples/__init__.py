"""A bundled example MCP server, for tests, demos and benchmarks of `dispatcher`.

`Workspace` is a notes server with honest tool annotations, latency, saturation, faults injected by
`dispatcher.testing.inject_faults`, and a ledger of every tool execution (`ToolRun`). `serve_http`
serves any `MCPServer` over streamable HTTP on a free port. Run `python -m dispatcher.examples.workspace
--help` to start the workspace as a process.
"""

from .._exports import rehome as _rehome
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
_rehome(globals())
