"""A fleet of processes sharing limits, order and retry budgets: see docs/fleet.md.

`RedisCoordinator` needs the `fleet` extra (``pip install "mcp-dispatcher[fleet]"``); the rest of this
module does not.
"""

from ._coordination import CoordinationError as CoordinationError
from ._coordination import Coordinator as Coordinator
from ._coordination import LocalCoordinator as LocalCoordinator
from ._fleet import FleetServer as FleetServer
from ._fleet import RedisCoordinator as RedisCoordinator

__all__ = ["CoordinationError", "Coordinator", "FleetServer", "LocalCoordinator", "RedisCoordinator"]
