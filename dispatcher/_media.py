"""Media in results: the content blocks each model API accepts as what they are, and their descriptions."""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from typing import TYPE_CHECKING, Any

from ._text import visible

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._core._calls import ToolResult

# Media: content blocks that the APIs accept as what they are ------------------------------------------

_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_PDF = "application/pdf"
_AUDIO_FORMATS = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
}


def content(result: ToolResult) -> list[Any]:
    return list(result.result.content) if result.result is not None else []


def _media(block: Any) -> tuple[str, str, str] | None:
    """``(kind, mime type, base64 data)`` of an image, audio or binary resource block, else None.

    Data that is not well-formed base64 of what its MIME type says (checked by the file's signature)
    is None too: an API rejects the whole request for one such block, so a server could otherwise
    fail every result of the turn with one bad image. Such a block stays described in the text.
    """
    kind = getattr(block, "type", None)
    if kind in ("image", "audio"):
        found = kind, str(block.mime_type or ""), "".join(str(block.data).split())
    elif kind == "resource" and isinstance(blob := getattr(block.resource, "blob", None), str):
        mime = str(block.resource.mime_type or "")
        found = ("image" if mime in _IMAGE_TYPES else "file"), mime, "".join(blob.split())
    else:
        return None
    return found if _is_what_it_says(found[1], found[2]) else None


def _is_what_it_says(mime: str, data: str) -> bool:
    """Whether base64 `data` decodes strictly and starts with the signature of its MIME type."""
    check = _SIGNATURES.get(mime)
    if check is None:
        return True  # not sent as media by any API: only described
    try:
        raw = binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        return False
    return check(raw)


_SIGNATURES: dict[str, Callable[[bytes], bool]] = {
    "image/png": lambda raw: raw.startswith(b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": lambda raw: raw.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda raw: raw.startswith((b"GIF87a", b"GIF89a")),
    "image/webp": lambda raw: raw.startswith(b"RIFF") and raw[8:12] == b"WEBP",
    _PDF: lambda raw: raw.startswith(b"%PDF-"),
    **dict.fromkeys(
        ("audio/wav", "audio/x-wav", "audio/wave"), lambda raw: raw.startswith(b"RIFF") and raw[8:12] == b"WAVE"
    ),
    **dict.fromkeys(
        ("audio/mpeg", "audio/mp3"),
        lambda raw: raw.startswith(b"ID3") or (len(raw) > 1 and raw[0] == 0xFF and raw[1] & 0xE0 == 0xE0),
    ),
}


def _filename(block: Any) -> str:
    """A file name for an embedded PDF, made from the last segment of its URI and safe anywhere.

    The URI is the server's choice: only letters, digits and ``._-`` are kept (no path, no leading dot),
    at most 64 characters, ending in ``.pdf``.
    """
    uri = str(getattr(getattr(block, "resource", None), "uri", "") or "")
    last = re.split(r"[?#]", uri, maxsplit=1)[0].rstrip("/").rsplit("/", 1)[-1]
    stem = _NOT_FILENAME.sub("_", urllib.parse.unquote(last)).strip("._-")
    stem = stem[:-4] if stem.lower().endswith(".pdf") else stem
    return f"{stem[:60].rstrip('._-') or 'file'}.pdf"


_NOT_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")


def anthropic_media(block: Any) -> dict[str, Any] | None:
    found = _media(block)
    if found is None:
        return None
    kind, mime, data = found
    if kind == "image" and mime in _IMAGE_TYPES:
        return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}
    if mime == _PDF:
        return {"type": "document", "source": {"type": "base64", "media_type": mime, "data": data}}
    return None  # audio and other files: the text describes them


def openai_chat_media(block: Any) -> dict[str, Any] | None:
    found = _media(block)
    if found is None:
        return None
    kind, mime, data = found
    if kind == "image" and mime in _IMAGE_TYPES:
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
    if kind == "audio" and mime in _AUDIO_FORMATS:
        return {"type": "input_audio", "input_audio": {"data": data, "format": _AUDIO_FORMATS[mime]}}
    if mime == _PDF:
        return {"type": "file", "file": {"filename": _filename(block), "file_data": f"data:{mime};base64,{data}"}}
    return None


def openai_responses_media(block: Any) -> dict[str, Any] | None:
    found = _media(block)
    if found is None:
        return None
    kind, mime, data = found
    if kind == "image" and mime in _IMAGE_TYPES:
        return {"type": "input_image", "image_url": f"data:{mime};base64,{data}", "detail": "auto"}
    if mime == _PDF:
        return {"type": "input_file", "filename": _filename(block), "file_data": f"data:{mime};base64,{data}"}
    return None


def block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {_named(block.mime_type)}, {_decoded_size(block.data)} bytes]"
    if kind == "resource_link":
        mime = f", {_named(block.mime_type)}" if block.mime_type else ""
        return f"[resource link: {_named(block.name)} <{_named(block.uri)}>{mime}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return f"[resource <{_named(resource.uri)}>]\n{text}"
        mime = f", {_named(resource.mime_type)}" if resource.mime_type else ""
        return f"[resource <{_named(resource.uri)}>{mime}, {_decoded_size(resource.blob)} bytes]"
    return f"[{_named(kind or type(block).__name__)} content]"


_NAME_LIMIT = 200
_BRACKETS = str.maketrans({"<": "%3C", ">": "%3E", "[": "%5B", "]": "%5D"})


def _named(value: object) -> str:
    """A name, URI or MIME type a server chose, as one line that closes nothing: at most 200 characters of it."""
    text = str(value)
    shown, cut = visible(text, _NAME_LIMIT, newlines=False)
    shown = shown.translate(_BRACKETS)
    return f"{shown}... ({len(text)} characters)" if cut is not None else shown


def _decoded_size(data: str) -> int:
    """The size of base64 data once decoded, without decoding it when it is well formed."""
    compact = "".join(data.split())
    if len(compact) % 4 == 0:
        return len(compact) // 4 * 3 - len(compact) + len(compact.rstrip("="))
    try:
        return len(base64.b64decode(compact + "=" * (-len(compact) % 4)))
    except (binascii.Error, ValueError):
        return len(compact) * 3 // 4
