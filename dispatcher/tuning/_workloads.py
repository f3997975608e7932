"""Workloads for `tune`: calls read from a JSONL file, or generated from a server's own tools.

A file gives the calls as written (`load_workload`). A synthetic workload (`synthetic_workload`) calls a
server's tools declared read-only and closed-world, and for "mixed" those declared additive, with
arguments generated from their input schemas; `resolve_workload` first calls each candidate tool once
and keeps those whose generated call succeeds, since generated arguments are a guess.
"""

from __future__ import annotations

import json
import random
import re
from typing import TYPE_CHECKING, Any, Literal

from dispatcher._core._calls import CallStatus, ToolCall
from dispatcher._core._errors import ConfigurationError
from dispatcher._schemas import pointer

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from dispatcher._core._calls import ToolResult
    from dispatcher._core._catalog import ToolEntry
    from dispatcher._dispatcher import Dispatcher

__all__ = [
    "Synthetic",
    "fast_value",
    "tool_change",
    "load_workload",
    "resolve_workload",
    "slow_defaults",
    "synthetic_workload",
]

Synthetic = Literal["reads", "mixed"]
"""The kinds of synthetic workload."""

# Words in a numeric property's name that mark it as making a call slow when large: a time to spend
# (`duration=10` makes every call last ten seconds) or a number of rounds of work.
_TIME_WORDS = frozenset(
    {
        "duration",
        "sleep",
        "delay",
        "wait",
        "seconds",
        "secs",
        "sec",
        "ms",
        "millis",
        "milliseconds",
        "interval",
        "pause",
    }
)
_COUNT_WORDS = frozenset({"count", "steps", "repeat", "repeats", "iterations", "times", "rounds", "loops"})
# Answers that say a call did nothing (a generated name that matched nothing, say), and answers that are an
# empty JSON value (`create_entities` given nothing to create answers "[]").
_NOTHING_DONE = re.compile(
    r"nothing to|no changes?\b|unchanged|already (exists|up to date)|not found|no such|did not|enoent|"
    r"\b0 (files?|rows?|items?|changes?)\b|skipped",
    re.IGNORECASE,
)
_EMPTY_ANSWERS = frozenset({"[]", "{}", "null", '""', "''"})

# The share of reads in the synthetic mixed workload, as in the benchmark suite's mixed turns.
_MIXED_READ_SHARE = 0.7
_SYNTHETIC_LENGTH = 100


def load_workload(lines: Iterable[str], *, source: str = "workload") -> list[ToolCall]:
    """Parse a JSONL workload: one JSON object per line, ``{"name": ..., "arguments": {...}}``.

    An "id" is accepted and ignored: the calls are repeated, so each gets a fresh id. Blank lines are
    skipped.

    Raises:
        ConfigurationError: A line is not such an object, or there are no calls.
    """
    calls: list[ToolCall] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ConfigurationError(f"{where}: not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise ConfigurationError(f"{where}: expected a JSON object with a name, got {type(item).__name__}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f'{where}: "name" must be a tool name, got {name!r}')
        arguments = item.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ConfigurationError(f'{where}: "arguments" must be a JSON object, got {type(arguments).__name__}')
        unknown = sorted(set(item) - {"name", "arguments", "id"})
        if unknown:
            raise ConfigurationError(f"{where}: unknown keys {unknown}; a call has name, arguments and id")
        calls.append(ToolCall(str(len(calls)), name, arguments))
    if not calls:
        raise ConfigurationError(f"{source} has no calls; write one JSON object per line")
    return calls


def synthetic_workload(
    entries: Sequence[ToolEntry], kind: Literal["reads", "mixed"], *, seed: int = 0
) -> list[ToolCall]:
    """A workload built from a server's own tools, with arguments generated from their input schemas.

    Reads are the tools declared read-only; open-world ones (declared `openWorldHint: true`) are left
    out, so that a load test never sends generated requests to third parties. "mixed" adds the tools
    declared additive (not read-only, `destructiveHint: false`, not open-world) for about 30% of the
    calls, chosen with `random.Random(seed)`; tools that may destroy or overwrite are never called.
    Tools are taken by what the server declares, whether it is trusted or not: trust decides how the
    calls are scheduled, not which are safe to generate.

    Raises:
        ConfigurationError: The server declares no suitable tool.
    """
    if kind not in ("reads", "mixed"):
        raise ConfigurationError(f"the synthetic workload is 'reads' or 'mixed', got {kind!r}")
    reads, writes = [], []
    for entry in entries:
        declared = entry.declared_annotations
        if declared is None or declared.open_world_hint is True:
            continue
        if declared.read_only_hint is True:
            reads.append(entry)
        elif declared.destructive_hint is False:
            writes.append(entry)
    if not reads:
        raise ConfigurationError(
            "the server declares no read-only, closed-world tool (readOnlyHint true, openWorldHint not true) "
            "for a synthetic workload; write a --workload file instead"
        )
    if kind == "mixed" and not writes:
        raise ConfigurationError(
            "the server declares no additive tool (readOnlyHint false, destructiveHint false, openWorldHint not "
            "true) for a mixed synthetic workload; use --synthetic reads or a --workload file"
        )
    rng = random.Random(seed)
    calls: list[ToolCall] = []
    for index in range(_SYNTHETIC_LENGTH):
        if kind == "mixed" and rng.random() >= _MIXED_READ_SHARE:
            entry = writes[index % len(writes)]
        else:
            entry = reads[index % len(reads)]
        calls.append(ToolCall(str(index), entry.name, _arguments(entry.input_schema, index)))
    return calls


def _declared_read_only(entry: ToolEntry) -> bool:
    return entry.declared_annotations is not None and entry.declared_annotations.read_only_hint is True


def _words(name: str) -> set[str]:
    """The words of a property name: snake_case, camelCase and kebab-case split, lower-cased."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {word.lower() for word in re.split(r"[^A-Za-z0-9]+", spaced) if word}


def fast_value(name: str, schema: object) -> int | float | None:
    """The value to use instead of a schema default that would make a call slow, or None.

    A numeric property named as a time to spend (duration, sleep, delay, wait, ...) or a number of
    rounds (count, steps, repeat, ...) whose default is above the smallest value the schema allows: a
    synthetic call would inherit the default (`duration=10`: every call lasts ten seconds), so the
    smallest allowed value is used instead (0 for a time, 1 for a count, when the schema sets no bound).
    """
    if not isinstance(schema, dict):
        return None
    default = schema.get("default")
    if not isinstance(default, int | float) or isinstance(default, bool):
        return None
    value = _smallest(name, schema, whole=isinstance(default, int))
    return value if value is not None and value < default else None


def _smallest(name: str, schema: Mapping[str, Any], *, whole: bool) -> int | float | None:
    """The smallest value a numeric property named as a time or a count allows, or None for other properties."""
    kind = schema.get("type")
    if isinstance(kind, list):  # ["integer", "null"]: an optional number
        kind = next((k for k in kind if k != "null"), None)
    if kind not in ("integer", "number", None):
        return None
    words = _words(name)
    if words & _TIME_WORDS:
        floor: float = 0
    elif words & _COUNT_WORDS:
        floor = 1
    else:
        return None
    low = schema.get("minimum")
    above = schema.get("exclusiveMinimum")
    if isinstance(low, int | float) and not isinstance(low, bool):
        floor = max(floor, low)
    elif isinstance(above, int | float) and not isinstance(above, bool) and above >= floor:
        floor = above + 1 if kind == "integer" else above + 0.001
    return int(floor) if kind == "integer" or (whole and float(floor).is_integer()) else floor


def _required_floor(name: str, schema: object) -> int | float | None:
    """The value for a required numeric time or count without a default (a generated one could be 9 seconds)."""
    if not isinstance(schema, dict) or any(key in schema for key in ("default", "const", "enum", "examples")):
        return None
    if schema.get("type") not in ("integer", "number"):
        return None
    return _smallest(name, schema, whole=True)


def slow_defaults(entry: ToolEntry) -> dict[str, tuple[Any, Any]]:
    """The arguments a synthetic call sets fast instead of slow: path -> (default or None, value used).

    Nested properties are named by their path (``spec.inner.delay``); a required time or count without a
    default has None for its default.
    """
    found: dict[str, tuple[Any, Any]] = {}
    _walk(entry.input_schema, entry.input_schema, "", found, depth=0)
    return found


def _walk(schema: Any, root: Mapping[str, Any], prefix: str, found: dict[str, tuple[Any, Any]], *, depth: int) -> None:
    """Record the fast values `_example` sets in an object schema, and in the required objects inside it."""
    schema = _resolve(schema, root)
    if not isinstance(schema, dict) or depth > 8 or "default" in schema:
        return
    properties = schema.get("properties")
    required = schema.get("required")
    required = required if isinstance(required, list) else []
    for name, prop in (properties if isinstance(properties, dict) else {}).items():
        fast = fast_value(name, prop)
        if fast is not None:
            found[prefix + name] = (prop["default"], fast)
        elif name in required and (floor := _required_floor(name, prop)) is not None:
            found[prefix + name] = (None, floor)
        elif name in required:
            _walk(prop, root, f"{prefix}{name}.", found, depth=depth + 1)


def _resolve(schema: Any, root: Mapping[str, Any]) -> Any:
    """A schema with its local ``$ref`` followed (a pydantic model nested in another is one)."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    return pointer(root, ref) if isinstance(ref, str) and ref.startswith("#/") else schema


def _arguments(schema: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Arguments for the required properties of an object schema."""
    value = _example(schema, index, schema, depth=0)
    return value if isinstance(value, dict) else {}


def _example(schema: Any, index: int, root: Mapping[str, Any], *, depth: int) -> Any:
    """A value that fits `schema`, varied by `index` (a best effort: the server validates)."""
    if not isinstance(schema, dict) or depth > 8:
        return f"tune-{index}"
    resolved = _resolve(schema, root)
    if resolved is not schema:
        return _example(resolved, index, root, depth=depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[index % len(enum)]
    if "default" in schema:
        return schema["default"]
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        return examples[index % len(examples)]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list):
            usable = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            if usable:
                return _example(usable[0], index, root, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        arguments = {
            name: _example(properties.get(name, {}), index, root, depth=depth + 1)
            for name in required
            if isinstance(name, str)
        }
        # Optional properties are left out (the server applies its defaults), except those whose default
        # would make the call slow: they are set, to the smallest value allowed.
        # A required time or count without a default gets the smallest allowed value too, not a generated one.
        for name, prop in properties.items():
            fast = fast_value(name, prop) if isinstance(name, str) else None
            if fast is None and name in arguments:
                fast = _required_floor(name, prop)
            if fast is not None:
                arguments[name] = fast
        return arguments
    if kind == "array":
        # One item at least: an empty list makes many tools do nothing at all (`create_entities(entities=[])`
        # succeeds, creating nothing), and the sweep would time calls that change nothing.
        count = schema.get("minItems", 1)
        count = max(count, 1) if isinstance(count, int) else 1
        most = schema.get("maxItems")
        count = min(count, most) if isinstance(most, int) and most >= 0 else count
        return [_example(schema.get("items", {}), index, root, depth=depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        low = low if isinstance(low, int | float) else 0
        high = schema.get("maximum", schema.get("exclusiveMaximum", low + 10))
        high = high if isinstance(high, int | float) else low + 10
        value = low + index % max(1, int(high - low))
        if schema.get("exclusiveMinimum") is not None and value <= low:
            value = low + 1
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _string(schema, index)


def _string(schema: Mapping[str, Any], index: int) -> str:
    fmt = schema.get("format")
    formats = {
        "uri": "https://example.com/",
        "url": "https://example.com/",
        "email": "tune@example.com",
        "date-time": "2026-01-01T00:00:00Z",
        "date": "2026-01-01",
        "time": "00:00:00Z",
        "uuid": "00000000-0000-4000-8000-000000000000",
    }
    text = formats.get(fmt, f"tune-{index % 16}") if isinstance(fmt, str) else f"tune-{index % 16}"
    low = schema.get("minLength")
    high = schema.get("maxLength")
    if isinstance(low, int) and len(text) < low:
        text = text + "x" * (low - len(text))
    if isinstance(high, int) and len(text) > high:
        text = text[: max(high, 0)]
    return text


async def resolve_workload(
    dispatcher: Dispatcher,
    workload: Sequence[ToolCall] | Synthetic,
    entries: Sequence[ToolEntry],
    *,
    seed: int,
    notes: list[str],
) -> tuple[list[ToolCall], str]:
    """The calls to repeat, named as the catalogue names them, and a description of the workload.

    Args:
        dispatcher: An open dispatcher with the server registered (the probes of a synthetic workload
            run through it).
        workload: The calls, or the kind of synthetic workload.
        entries: The server's catalogue entries.
        seed: The seed of the synthetic mixed workload.
        notes: Where to add what the reader should know (tools left out of a synthetic workload).

    Raises:
        ConfigurationError: The workload is empty or calls tools the server lacks, or no generated call
            of a synthetic workload succeeded.
    """
    if isinstance(workload, str):
        entries = await _probe(dispatcher, entries, workload, seed, notes)
        calls = synthetic_workload(entries, workload, seed=seed)
        used = dict.fromkeys(call.name for call in calls)
        by_name = {entry.name: entry for entry in entries}
        for name in used:
            replaced = slow_defaults(by_name[name])
            if replaced:
                settings = ", ".join(f"{arg}={value!r}" for arg, (_, value) in replaced.items())
                defaults = ", ".join(f"{arg}={d!r}" for arg, (d, _) in replaced.items() if d is not None)
                bare = ", ".join(arg for arg, (d, _) in replaced.items() if d is None)
                instead = " and ".join(
                    part
                    for part in (
                        f"the schema's defaults ({defaults})" if defaults else "",
                        f"generated values for {bare} (required, without a default)" if bare else "",
                    )
                    if part
                )
                notes.append(
                    f"the synthetic calls of {name} set {settings} instead of {instead}, which would make every call "
                    "slow; write a --workload file to measure the calls as your agent makes them"
                )
        return calls, f"synthetic {workload} ({', '.join(used)})"
    calls = list(workload)
    if not calls:
        raise ConfigurationError("the workload has no calls")
    known = {entry.name for entry in entries} | {entry.tool for entry in entries}
    unknown = sorted({call.name for call in calls} - known)
    if unknown:
        raise ConfigurationError(
            f"the workload calls tools the server does not offer: {unknown}; it offers "
            f"{sorted(entry.name for entry in entries)}"
        )
    names = {entry.tool: entry.name for entry in entries}
    calls = [ToolCall(call.id, names.get(call.name, call.name), call.arguments) for call in calls]
    counted = f"{len(calls)} call" if len(calls) == 1 else f"{len(calls)} calls"
    return calls, f"{counted} of {', '.join(dict.fromkeys(call.name for call in calls))}"


async def _probe(
    dispatcher: Dispatcher, entries: Sequence[ToolEntry], kind: Synthetic, seed: int, notes: list[str]
) -> list[ToolEntry]:
    """Call each tool a synthetic workload would use once; keep those whose call succeeds.

    Generated arguments are a guess (a note named "tune-0" may not exist, "tune-0" is no time zone),
    and a call that fails measures nothing about the server's capacity. Tools whose generated call
    fails are left out, with a note; when none succeeds there is nothing to measure.
    """
    first = {call.name: call for call in reversed(synthetic_workload(entries, kind, seed=seed))}
    probes = [ToolCall(f"probe-{number}", call.name, call.arguments) for number, call in enumerate(first.values())]
    results = {result.tool: result for result in await dispatcher.dispatch(probes)}
    keep = {name for name in first if results[name].status is CallStatus.OK}
    by_name = {entry.name: entry for entry in entries}
    instead = ("", "use --synthetic reads, or ")
    for is_read, what, other in ((True, "read", instead[0]), (False, "write", instead[1])):
        group = [name for name in first if _declared_read_only(by_name[name]) is is_read]
        if group and not any(name in keep for name in group):
            failures = "; ".join(f"{name}: {_first_line(results[name].error)}" for name in group)
            raise ConfigurationError(
                f"every generated {what} of the synthetic workload failed ({failures}), so there is nothing to "
                f"measure; {other}write the calls your agent makes to a --workload file"
            )
    notes.extend(
        f"the synthetic workload leaves out {name}: its generated call failed ({_first_line(results[name].error)})"
        for name in first
        if name not in keep
    )
    for name in first:
        answer = _answer_text(results[name])
        if name in keep and _did_nothing(answer):
            said = f"answered {_first_line(answer)!r}" if answer.strip() else "answered nothing"
            if _declared_read_only(by_name[name]):
                notes.append(
                    f"the synthetic read {name} succeeded but {said}, as if it found nothing: the sweep may time "
                    "reads that do less than your agent's; write a --workload file of the calls your agent makes"
                )
            else:
                notes.append(
                    f"the synthetic write {name} succeeded but {said}, as if it did nothing: the mixed workload may "
                    "time writes that change nothing; write a --workload file of writes your agent makes"
                )
    return [entry for entry in entries if entry.name in keep or entry.name not in first]


def _did_nothing(answer: str) -> bool:
    """Whether a successful call's answer says it did nothing: empty, an empty JSON value, or words to that effect."""
    stripped = answer.strip()
    return not stripped or stripped in _EMPTY_ANSWERS or _NOTHING_DONE.search(stripped) is not None


def _answer_text(result: ToolResult) -> str:
    """The text blocks of a call's answer, joined (untrusted: only shown, shortened, in a note)."""
    if result.result is None:
        return ""
    return "\n".join(getattr(block, "text", "") for block in result.result.content)


def _first_line(text: str | None, limit: int = 200) -> str:
    """The first line of an error, shortened: a server's error text can be long, and it is untrusted."""
    stripped = (text or "").strip()
    line = stripped.splitlines()[0] if stripped else "no error text"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def tool_change(
    before: Sequence[ToolEntry], after: Sequence[ToolEntry], calls: Sequence[ToolCall], limit: int
) -> str | None:
    """A note when the workload's tools changed between two settings' listings (removed, or declared anew).

    A server's tool list may change under a sweep (a tool turned destructive, replaced, gone): the settings
    listed after it run another workload (writes in order instead of reads at once, or failures), and
    comparing them with those before compares different things. None when nothing the workload calls changed.
    """
    old = {entry.name: entry for entry in before}
    new = {entry.name: entry for entry in after}
    changes = []
    for name in dict.fromkeys(call.name for call in calls):
        was, now = old.get(name), new.get(name)
        if was is None:
            continue
        if now is None:
            changes.append(f"{name} was removed")
        elif (was.declared_annotations, was.concurrent) != (now.declared_annotations, now.concurrent):
            runs = "runs with others" if now.concurrent else "runs alone, in order"
            changes.append(f"{name} declares other annotations (it now {runs})")
        elif was.input_schema != now.input_schema:
            changes.append(f"{name} takes other arguments")
    if not changes:
        return None
    return (
        f"the server's tools changed during the sweep, seen when {limit} was set up ({'; '.join(changes)}): the "
        "settings measured from then on ran another workload than those before, so comparing them (and the "
        "recommendation) may mislead; measure again against a server whose tools stay put"
    )
