"""What the framework integrations share: a result as the text a model reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatcher.formats import mark_untrusted, result_text

if TYPE_CHECKING:
    from dispatcher import ToolResult

__all__ = ["model_text"]


def model_text(result: ToolResult) -> str:
    """The text the model reads for a result: the tool's output or the error, open-world content marked."""
    text = result_text(result)
    if result.untrusted_content:
        text = mark_untrusted(text, result)
    return text
