"""A bundled example MCP server, for tests, demos and benchmarks of `dispatcher`.

`Workspace` is a notes server with honest tool annotations, latency, saturation and fault injection,
and a ledger of every tool execution. `serve_http` serves any `MCPServer` over streamable HTTP on a
free port. Run `python -m dispatcher.examples.workspace --help` to start the workspace as a process.
"""

from ._http import serve_http as serve_http
from ._workspace import Execution as Execution
from ._workspace import FaultConfig as FaultConfig
from ._workspace import FaultKind as FaultKind
from ._workspace import Outcome as Outcome
from ._workspace import Workspace as Workspace
from ._workspace import saturated_latency as saturated_latency

__all__ = [
    "Execution",
    "FaultConfig",
    "FaultKind",
    "Outcome",
    "Workspace",
    "saturated_latency",
    "serve_http",
]
