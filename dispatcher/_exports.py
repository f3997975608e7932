"""The home a public module gives the classes it re-exports, so that they print as its names.

A class defined in a private module reports that module as its `__module__`
(``dispatcher._core._calls.ToolResult``); a public module that re-exports it calls `rehome` last, and
tracebacks, reprs and docs then show the name users import (``dispatcher.ToolResult``), as anyio does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["rehome"]


def rehome(namespace: dict[str, Any]) -> None:
    """Make every class named in the module's `__all__` report that module as its home.

    Args:
        namespace: The public module's `globals()`: its `__all__` lists the exports, its `__name__` is
            the home. Classes from outside the package (none today) keep their own.
    """
    home = namespace["__name__"]
    for name in namespace["__all__"]:
        value = namespace[name]
        if isinstance(value, type) and value.__module__.startswith("dispatcher."):
            value.__module__ = home
