"""What the framework integrations share: a result as the text a model reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatcher.formats import mark_untrusted, result_note, result_text

if TYPE_CHECKING:
    from dispatcher import ToolResult

__all__ = ["model_text"]


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
