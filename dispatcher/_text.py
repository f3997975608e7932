"""Text as a reader sees it: what a terminal or a model would not show is written out, and long text cut."""

from __future__ import annotations

import functools
import re
import unicodedata

# Characters a reader does not see, or that break a line without a newline, are written out in untrusted
# definitions: control and format characters (bidirectional overrides, zero-width characters, the Unicode
# "tag" characters that can carry hidden ASCII), line and paragraph separators, unassigned and private-use
# code points, lone surrogates, and the variation selectors (which can hide data after any character).
_VARIATION_SELECTORS = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]")


def visible(text: str, limit: int, *, newlines: bool) -> tuple[str, int | None]:
    """The first `limit` characters of `text`, with its invisible characters written out (``\\u202e``).

    A written-out character takes 6 or 10 characters, so the result is at most ten times `limit` long;
    it costs a few passes in C over those characters, whatever the length of the text.

    Returns:
        The text as shown, and None, or where it was cut (how many of the text's characters are shown).
    """
    head = text[:limit]
    cut = None if len(text) <= limit else limit
    if head.isascii() and head.isprintable():  # the common case
        return head, cut
    if unicodedata.category(head[0])[0] == "M":
        # A combining mark first has no character of the text to combine with, only what precedes the
        # text: the ">" of a marking's opening tag, which NFC (as a model's tokenizer may apply) turns
        # into U+226F with it, so that the tag no longer reads as one. It is written out.
        head = _escape(head[0]) + head[1:]
    hidden = [char for char in set(head) if not _plain_char(char, newlines)]
    if len(hidden) > 8:  # str.translate looks a mapping up per character; str.replace runs in C
        return head.translate({ord(char): _escape(char) for char in hidden}), cut
    for char in hidden:
        head = head.replace(char, _escape(char))
    return head, cut


@functools.lru_cache(maxsize=4096)
def _plain_char(char: str, newlines: bool) -> bool:
    if char == "\n":
        return newlines
    if char == "\t" or char == " ":
        return True
    if _VARIATION_SELECTORS.match(char):
        return False
    category = unicodedata.category(char)
    return category[0] != "C" and category not in ("Zl", "Zp")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
