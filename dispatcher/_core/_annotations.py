"""Effective annotations: what the scheduler may believe about a tool.

MCP tool annotations are a server's self-report. The spec fixes a worst-case default for each hint and
says a client must not act on hints from a server it does not trust. The functions here turn what a server
declared, whether the user trusts it, and the user's own overrides into one `ToolAnnotations` with every
hint filled in.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcp.types import ToolAnnotations

from ._errors import ConfigurationError

__all__ = ["HINTS", "SPEC_DEFAULTS", "check_annotations", "effective_annotations"]

#: The spec's value for each hint when it is absent: mutating, destructive, non-idempotent, open-world.
SPEC_DEFAULTS = ToolAnnotations(
    read_only_hint=False,
    destructive_hint=True,
    idempotent_hint=False,
    open_world_hint=True,
)

HINTS: tuple[tuple[str, str], ...] = (
    ("readOnlyHint", "read_only_hint"),
    ("destructiveHint", "destructive_hint"),
    ("idempotentHint", "idempotent_hint"),
    ("openWorldHint", "open_world_hint"),
)
"""The four hints in the spec's order: each hint's name on the wire and its `ToolAnnotations` attribute."""


def effective_annotations(
    declared: ToolAnnotations | None,
    *,
    trusted: bool,
    override: ToolAnnotations | None = None,
) -> ToolAnnotations:
    """Combine declared hints, trust and a user override into fully specified annotations.

    Precedence for each hint: the user's override if it sets the hint, else the server's declaration if
    the server is trusted, else the spec default. The title is display-only and is kept from the override
    or the declaration whatever the trust.

    Args:
        declared: The annotations the server sent, or None.
        trusted: Whether the user trusts the server that declared them.
        override: The user's own declaration for this tool; it is trusted by definition.

    Returns:
        Annotations whose four hints are all booleans, never None.
    """
    values: dict[str, bool] = {}
    for _, hint in HINTS:
        value: bool | None = None
        if override is not None:
            value = getattr(override, hint)
        if value is None and trusted and declared is not None:
            value = getattr(declared, hint)
        if value is None:
            value = bool(getattr(SPEC_DEFAULTS, hint))
        values[hint] = value
    title = (override.title if override is not None else None) or (declared.title if declared else None)
    return ToolAnnotations(title=title, **values)


def check_annotations(value: object, tool: str) -> None:
    """Raise `ConfigurationError` unless `value` is a `ToolAnnotations` (or None), naming the tool."""
    if value is not None and not isinstance(value, ToolAnnotations):
        hint = " (build one: ToolAnnotations(readOnlyHint=True, ...))" if isinstance(value, Mapping) else ""
        raise ConfigurationError(
            f"the annotations of tool {tool!r} must be an mcp.types.ToolAnnotations, got {type(value).__name__}{hint}"
        )
