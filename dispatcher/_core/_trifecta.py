"""The lethal trifecta: which legs of it a tool's hints give a session.

A session that can read private data, ingest untrusted content and communicate externally can be steered
into exfiltration: instructions hidden in the content make the model send the data out. Annotations give
a vocabulary for the three legs (spec defaults filled in):

- private data: a read-only, closed-world tool (the user's own notes, files, database);
- untrusted content: any open-world tool (what it sends back came from outside);
- external communication: a tool that is not read-only and open-world (it can send data out).

`SessionGuard` applies this to what a session has actually done; `dispatcher inspect` to what a
toolset could do. The hints are self-reports: this is a tripwire, not a security boundary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcp.types import ToolAnnotations

__all__ = ["communicates_externally", "ingests_untrusted_content", "reads_private_data"]


def reads_private_data(hints: ToolAnnotations) -> bool:
    """Whether a tool's answers count as private data: read-only and closed-world."""
    return bool(hints.read_only_hint) and hints.open_world_hint is False


def ingests_untrusted_content(hints: ToolAnnotations) -> bool:
    """Whether a tool's answers are untrusted content: it is open-world (or does not say it is closed)."""
    return hints.open_world_hint is not False


def communicates_externally(hints: ToolAnnotations) -> bool:
    """Whether a tool can send data out: not read-only, and open-world (or not saying it is closed)."""
    return not hints.read_only_hint and hints.open_world_hint is not False
