"""Untrusted input schemas: their size once references are inlined, and the texts in them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# The most nodes an untrusted schema may have once its references are inlined. Frameworks inline them
# (LangChain's bind_tools, some pydantic-ai model profiles), and a 1 KB schema whose definitions each
# refer twice to the one before expands to gigabytes: past this many, its references are left out (the
# parts they stood for accept anything, and the server checks the arguments).
MAX_EXPANDED = 10_000
_REFERENCE_MAPS = ("$defs", "definitions")


def expanded_size(schema: Any) -> int:
    """How many nodes `schema` has with every local ``$ref`` inlined (a cycle counts once), at most one more
    than `MAX_EXPANDED`: each reference's size is computed once, so this costs the schema's own size. A
    reference to anything but a part of the schema counts as over the limit."""
    limit = MAX_EXPANDED + 1
    sizes: dict[str, int] = {}
    visiting: set[str] = set()

    def size(value: Any) -> int:
        if isinstance(value, Mapping):
            total = 1
            if "$ref" in value:
                ref = value["$ref"]
                if not isinstance(ref, str) or _pointer(schema, ref) is None:
                    # Not a part of this schema (another document, a URL, a dangling pointer): a
                    # framework that inlines references raises for it (LangChain does, failing every
                    # tool of the agent), or fetches it. It counts as too large.
                    return limit
                if ref not in visiting:
                    if ref not in sizes:
                        visiting.add(ref)
                        sizes[ref] = size(_pointer(schema, ref))
                        visiting.discard(ref)
                    total += sizes[ref]
            for item in value.values():
                total += size(item)
                if total >= limit:
                    return limit
            return total
        if isinstance(value, list | tuple):
            return min(limit, 1 + sum(size(item) for item in value))
        return 1

    return size(schema)


def _pointer(schema: Any, ref: str) -> Any:
    """What a local JSON pointer (``#/$defs/name``) designates in `schema`, or None."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    value = schema
    for part in ref.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def without_refs(value: Any) -> Any:
    """`value` without references and the definitions they point to."""
    if isinstance(value, Mapping):
        return {key: without_refs(item) for key, item in value.items() if key != "$ref" and key not in _REFERENCE_MAPS}
    if isinstance(value, list):
        return [without_refs(item) for item in value]
    return value


def plain(value: Any) -> Any:
    """A deep copy made of dicts and lists, safe to mutate and to serialise."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


# Keywords whose string values are schema machinery, kept as they are; values the model must copy are kept
# too. Every other string in an untrusted schema is text for the model to read, and is marked.
_SCHEMA_WORDS = frozenset(
    {
        "type",
        "format",
        "pattern",
        "required",
        "$ref",
        "$id",
        "$schema",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "contentEncoding",
        "contentMediaType",
        "dependentRequired",
    }
)
_SCHEMA_VALUES = frozenset({"enum", "const", "default", "examples"})
# Maps from names the schema defines (property names, definitions) to schemas: the names are kept.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def map_texts(schema: Any, mark: Callable[[str], str]) -> Any:
    """A plain copy of `schema` in which `mark` replaced every text for the model (see `tool_schema`)."""

    def walk(value: Any, key: str | None) -> Any:
        if key in _SCHEMA_WORDS:
            return keyword(value, key)
        if isinstance(value, Mapping):
            if key in _SCHEMA_MAPS:
                return {str(name): walk(item, None) for name, item in value.items()}
            return {
                str(name): plain(item) if name in _SCHEMA_VALUES else walk(item, str(name))
                for name, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [walk(item, key) for item in value]
        if isinstance(value, str):
            return mark(value)
        return value

    def keyword(value: Any, key: str) -> Any:
        # A keyword's value is a string, a list of strings, or (dependentRequired) a map of such lists:
        # anything else under a keyword (``"type": {"description": ...}``) is text in disguise, and
        # every string in it is marked like any other.
        if isinstance(value, Mapping):
            if key == "dependentRequired":
                return {str(name): keyword(item, "required") for name, item in value.items()}
            return walk(value, None)
        if isinstance(value, list | tuple):
            return [item if isinstance(item, str) else walk(item, None) for item in value]
        return value

    return walk(schema, None)
