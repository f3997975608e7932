"""Conflict keys: which state a call touches, declared by the user alone.

A call's keys decide what it waits for (see `_gate`). They come only from the user's registration:

- by default every call is on the root key ``""``, which conflicts with every call (the ordered
  barriers: a call that may mutate runs alone);
- a server (or local function) given a ``domain`` has all its calls keyed under that domain, so its
  writes wait only for calls in the same domain (and for calls on the root key);
- a tool given a key function has each call keyed by what the function returns for the call's
  arguments: keys *relative to the domain*, so a key function can narrow a call within its domain but
  never reach outside it. Returning None (or ``""``) keys the call by the whole domain.

A key function that raises, or returns anything but a string, an iterable of strings or None, fails
the call (FAILED, never run): a call is never run with keys nobody declared. Nothing a server sends
(annotations, ``_meta``, names) takes part; a model chooses only the arguments a user's key function
reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError, KeyRuleError
from ._gate import ROOT_KEYS

if TYPE_CHECKING:
    from ._catalog import ToolEntry

__all__ = ["ROOT_KEYS", "KeyFunction", "KeyRuleError", "call_keys", "check_domain", "check_key_functions", "rule"]

KeyFunction = Callable[[Mapping[str, Any]], "str | Iterable[str] | None"]
"""Maps a call's arguments to its conflict keys, relative to its tool's domain."""


# A call's keys come partly from a model's arguments: bound how much they can hold.
_MAX_KEYS = 100
_MAX_KEY_LENGTH = 1000
# The most characters of a bad key an error message repeats.
_SHOWN = 100


class _Invalid(ValueError):
    """What a key function returned is not keys (the message says why)."""


def _segments(key: str, what: str) -> list[str]:
    segments = [segment for segment in key.split("/") if segment]
    for segment in segments:
        if segment in (".", ".."):
            raise _Invalid(
                f"{what} {_shown(key)}, which has a {segment!r} segment; normalise paths first "
                "(e.g. posixpath.normpath), since a key must name what the call touches"
            )
    return segments


def _shown(key: str) -> str:
    return repr(key) if len(key) <= _SHOWN else f"{key[:_SHOWN]!r}... ({len(key)} characters)"


def check_domain(domain: object, owner: str) -> str | None:
    """A domain from a registration, in canonical form.

    Raises:
        ConfigurationError: It is not a non-empty string of ``/``-separated segments.
    """
    if domain is None:
        return None
    if not isinstance(domain, str):
        raise ConfigurationError(f"domain for {owner} must be a string such as 'github', got {type(domain).__name__}")
    try:
        segments = _segments(domain, f"domain for {owner} is")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if not segments:
        raise ConfigurationError(
            f"domain for {owner} must name something, such as 'github', got {domain!r}; "
            "leave it None to keep the root key (calls that may mutate run alone)"
        )
    return "/".join(segments)


def check_key_functions(keys: object, domain: str | None, owner: str) -> dict[str, KeyFunction]:
    """A server's key functions by tool name, checked.

    Raises:
        ConfigurationError: Not a mapping of tool names to callables, or given without a domain.
    """
    if keys is None:
        return {}
    if not isinstance(keys, Mapping):
        raise ConfigurationError(f"keys for {owner} must map tool names to key functions, got {type(keys).__name__}")
    checked: dict[str, KeyFunction] = {}
    for tool, function in keys.items():
        if not isinstance(tool, str) or not callable(function):
            raise ConfigurationError(
                f"keys for {owner} must map tool names to callables taking the arguments, got {tool!r}: {function!r}"
            )
        checked[tool] = function
    if checked and domain is None:
        raise ConfigurationError(
            f"keys for {owner} need a domain: pass domain=... (the keys are relative to it), so that "
            "its keys cannot collide with another server's"
        )
    return checked


def rule(entry: ToolEntry) -> str:
    """How a tool's calls are keyed, for people: ``"root"``, ``"github"`` or ``"github/<fn(arguments)>"``."""
    if entry.domain is None:
        return "root"
    function = entry.key_function
    if function is None:
        return entry.domain
    name = getattr(function, "__qualname__", None) or type(function).__name__
    return f"{entry.domain}/<{name}(arguments)>"


def call_keys(entry: ToolEntry, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The conflict keys of one call of a tool.

    Raises:
        KeyRuleError: The tool's key function raised or returned something that is not keys.
    """
    domain = entry.domain
    if domain is None:
        return ROOT_KEYS
    function = entry.key_function
    if function is None:
        return (domain,)
    try:
        value = function(MappingProxyType(dict(arguments)))
    except Exception as exc:
        raise KeyRuleError(
            f"the key function of tool {entry.name!r} raised {type(exc).__name__}: {exc}; the call was not run"
        ) from exc
    try:
        return _keys(domain, value)
    except _Invalid as exc:
        raise KeyRuleError(f"the key function of tool {entry.name!r} {exc}; the call was not run") from None
    except Exception as exc:
        # What it returned could not even be read (an iterable that raises, say).
        raise KeyRuleError(
            f"the key function of tool {entry.name!r} returned keys that could not be read "
            f"({type(exc).__name__}: {exc}); the call was not run"
        ) from exc


def _keys(domain: str, value: object) -> tuple[str, ...]:
    if value is None:
        return (domain,)
    if isinstance(value, str):
        items: list[object] = [value]
    elif isinstance(value, Iterable) and not isinstance(value, bytes | bytearray | Mapping):
        items = []
        for item in value:
            items.append(item)
            if len(items) > _MAX_KEYS:
                raise _Invalid(f"returned more than {_MAX_KEYS} keys")
        if not items:
            raise _Invalid("returned no keys; return None to key the call by its whole domain")
    else:
        raise _Invalid(f"returned {type(value).__name__}, not a key string, an iterable of them or None")
    keys: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise _Invalid(f"returned a {type(item).__name__} among its keys; keys are strings")
        if len(item) > _MAX_KEY_LENGTH:
            raise _Invalid(f"returned a key of {len(item)} characters; the most is {_MAX_KEY_LENGTH}")
        segments = _segments(item, "returned the key")
        keys.append("/".join([domain, *segments]))
    return tuple(keys)
