"""A fleet of processes sharing limits, order and retry budgets: see docs/fleet.md.

`RedisCoordinator` needs the `fleet` extra (``pip install "mcp-dispatcher[fleet]"``); the rest of this
module does not.
"""

from .._core._errors import CoordinationError as CoordinationError
from .._driver._coordination import Coordinator as Coordinator
from .._driver._coordination import LocalCoordinator as LocalCoordinator
from .._exports import rehome as _rehome
from ._config import FleetServer as FleetServer
from ._redis import RedisCoordinator as RedisCoordinator

__all__ = ["CoordinationError", "Coordinator", "FleetServer", "LocalCoordinator", "RedisCoordinator"]


# The classes exported here report this module as their home (`dispatcher.fleet.RedisCoordinator`, not its private one).
_rehome(globals())
