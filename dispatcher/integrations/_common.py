"""What the framework integrations share: a result as the text a model reads, and as plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatcher.formats import mark_untrusted, result_note, result_text

if TYPE_CHECKING:
    from dispatcher import ToolResult

__all__ = ["model_text", "plain_result"]


def model_text(result: ToolResult) -> str:
    """The text the model reads for a result: the tool's output or the error, open-world content marked.

    The dispatcher's note (an unknown outcome to check before repeating, a call fail-fast did not run)
    comes last, after the wrapper, as in `dispatcher.formats`.
    """
    text = result_text(result)
    if result.untrusted_content:
        text = mark_untrusted(text, result)
    note = result_note(result)
    return text if note is None else f"{text}\n{note}"


def plain_result(result: ToolResult) -> dict[str, Any]:
    """What a framework's checkpoint may keep of a result: plain data, no dispatcher class."""
    return {
        "status": result.status.value,
        "tool": result.tool,
        "server": result.server,
        "attempts": result.attempts,
        "untrusted_content": result.untrusted_content,
    }
