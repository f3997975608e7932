"""The package's layers and import graph, read from the source with `ast`: `python -m scripts.architecture`.

Writes docs/architecture.md (`--check` only compares, and fails when the file is out of date in anything
but line counts). tests/test_architecture.py checks the rules below with the same reading of the code:

- every module belongs to exactly one layer of `LAYERS`;
- no module imports from a module of a higher layer at run time (imports under `if TYPE_CHECKING:` may
  point upwards: with `from __future__ import annotations` they exist for the type checker alone, and
  let a lower layer name the type of an object a higher layer hands it, such as the hooks an execution
  is given);
- no module imports another module's private (underscore-prefixed) names; the package's own private
  modules (`dispatcher._core._calls`) may be imported, and their public names are what the package uses;
- no private name of the `mcp` SDK is imported;
- no two modules import each other at run time, directly or through others.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import pathlib
import re
import sys
from dataclasses import dataclass

__all__ = [
    "CALL_PATH",
    "DOC",
    "LAYERS",
    "PACKAGE_DIR",
    "Import",
    "call_path_problems",
    "concept",
    "imports",
    "layer_of",
    "line_count",
    "main",
    "modules",
    "render",
]

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "dispatcher"
DOC = ROOT / "docs" / "architecture.md"

LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "calls and results",
        "what a call is, what it returns, how a failure reads, and the errors the caller sees",
        (
            "dispatcher._core",
            "dispatcher._core._errors",
            "dispatcher._core._checks",
            "dispatcher._core._calls",
            "dispatcher._mcp._failures",
            "dispatcher._core._backoff",
            "dispatcher._version",
            "dispatcher._exports",
        ),
    ),
    (
        "catalogue and trust",
        "the tools that can be called, what the dispatcher may believe about them, and their pinned definitions",
        (
            "dispatcher._core._annotations",
            "dispatcher._core._catalog",
            "dispatcher._mcp._pins",
            "dispatcher._core._trifecta",
        ),
    ),
    (
        "admission and lifecycle",
        "sans-I/O state machines: which submitted call may start now (the gate and the conflict keys it orders"
        " by), and where each call is in its life until its one result (the lifecycle)",
        (
            "dispatcher._core._gate",
            "dispatcher._core._limit_setting",
            "dispatcher._core._growth",
            "dispatcher._core._adaptive",
            "dispatcher._core._overload",
            "dispatcher._core._keys",
            "dispatcher._core._idempotency",
            "dispatcher._core._outcomes",
            "dispatcher._core._lifecycle",
        ),
    ),
    (
        "execution",
        "the driver: one task per admitted call, run attempt by attempt as the retry policy allows",
        (
            "dispatcher._driver",
            "dispatcher._driver._turns",
            "dispatcher._driver._batch",
            "dispatcher._driver._retry",
            "dispatcher._driver._coordination",
            "dispatcher._driver._deadlines",
            "dispatcher._driver._clock",
            "dispatcher._driver._attempts",
            "dispatcher._driver._asking",
            "dispatcher._driver._submission",
            "dispatcher._driver._execution",
            "dispatcher._driver._unlimited",
            "dispatcher._driver._lifetime",
        ),
    ),
    (
        "policy hooks",
        "what a batch does around its calls: approvals, the session guard, events and spans, the one human channel",
        (
            "dispatcher._driver._approval",
            "dispatcher._driver._observe",
            "dispatcher._driver._person",
            "dispatcher._driver._hooks",
        ),
    ),
    (
        "adapters",
        "where tools come from and where holds are shared: MCP connections, local functions, a Redis fleet",
        (
            "dispatcher._mcp",
            "dispatcher._mcp._questions",
            "dispatcher._mcp._progress",
            "dispatcher._mcp._transport",
            "dispatcher._mcp._tasks",
            "dispatcher._mcp._session",
            "dispatcher._mcp._online",
            "dispatcher._mcp._reconnect",
            "dispatcher._mcp._connections",
            "dispatcher._mcp._registry",
            "dispatcher._functions",
            "dispatcher.fleet._lua_limit",
            "dispatcher.fleet._lua",
            "dispatcher.fleet._config",
            "dispatcher.fleet._links",
            "dispatcher.fleet._shared",
            "dispatcher.fleet._redis",
            "dispatcher.fleet",
        ),
    ),
    (
        "facade",
        "the `Dispatcher` users hold, and the public names of the package",
        ("dispatcher._servers", "dispatcher._dispatcher", "dispatcher"),
    ),
    (
        "applications, formats, integrations, testing, examples",
        "built on the facade, none of them needed by it: the command line and its `tune` and `inspect`, the "
        "model formats, the framework integrations, the test doubles and the example server",
        (
            "dispatcher.__main__",
            "dispatcher.cli",
            "dispatcher.tuning._connection",
            "dispatcher.tuning._fleet",
            "dispatcher.cli._inspect",
            "dispatcher.cli._inspect_command",
            "dispatcher.cli._machine",
            "dispatcher.cli._main",
            "dispatcher.tuning._measure",
            "dispatcher.tuning._online",
            "dispatcher.cli._plot",
            "dispatcher.cli._present",
            "dispatcher.tuning._recommend",
            "dispatcher.tuning._report",
            "dispatcher.tuning._sweep",
            "dispatcher.cli._targets",
            "dispatcher.cli._tune_command",
            "dispatcher.tuning._workloads",
            "dispatcher.tuning",
            "dispatcher.formats",
            "dispatcher._schemas",
            "dispatcher._text",
            "dispatcher._media",
            "dispatcher._timeline",
            "dispatcher._timeline._rows",
            "dispatcher._timeline._text",
            "dispatcher._timeline._picture",
            "dispatcher._timeline._trace",
            "dispatcher.timeline",
            "dispatcher.integrations",
            "dispatcher.integrations._common",
            "dispatcher.integrations.claude_agent_sdk",
            "dispatcher.integrations.google_adk",
            "dispatcher.integrations.langchain",
            "dispatcher.integrations.langgraph",
            "dispatcher.integrations.openai_agents",
            "dispatcher.integrations.pydantic_ai",
            "dispatcher.testing",
            "dispatcher.testing._hostile",
            "dispatcher.testing.__main__",
            "dispatcher.examples",
            "dispatcher.examples.__main__",
            "dispatcher.examples._http",
            "dispatcher.examples._ledger",
            "dispatcher.examples._loops",
            "dispatcher.examples._models",
            "dispatcher.examples._tools",
            "dispatcher.examples._workspace",
            "dispatcher.examples.demo",
            "dispatcher.examples.workspace",
        ),
    ),
)


# The path of one call from `Dispatcher.dispatch()` to its result: (what happens, the module, the names it
# runs there). tests/test_architecture.py checks that every name is defined in its module, so the page cannot
# describe code that is gone.
CALL_PATH: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "opens a `Batch` with this dispatch's hooks (approver, policy, guard, events) and waits for it",
        "dispatcher._dispatcher",
        ("Dispatcher.dispatch", "Dispatcher.batch"),
    ),
    (
        "checks every call before any runs (types, duplicate ids) and hands them over in the model's order",
        "dispatcher._driver._batch",
        ("Batch.submit_all", "Batch._accept"),
    ),
    (
        "finds the tool in the catalogue, reads its effective annotations and conflict keys, opens the call's"
        " record in the lifecycle and submits a ticket to the gate; approvals are asked at the call's place"
        " (`_asking`)",
        "dispatcher._driver._submission",
        ("Submission.submit_all", "Submission._queue"),
    ),
    (
        "decides when the call may start: reads together, a write after everything before it (or beside calls"
        " its keys prove apart), within the dispatcher's and the server's limits",
        "dispatcher._core._gate",
        ("Gate.submit", "Gate.finish"),
    ),
    (
        "runs each admitted call in a task: a task whose call has ended carries on with the next call the gate"
        " admits, the others get tasks of their own (a write always does, under asyncio); runs one attempt, or"
        " the retrier when the tool may be retried, under the call's deadline",
        "dispatcher._driver._execution",
        ("Executor._pump", "Executor._run", "Executor._execute", "Executor._attempt"),
    ),
    (
        "checks the arguments against the tool's schema and sends `tools/call` through the SDK's session (the"
        " connection is kept by `_mcp._connections`; a local function runs in `_functions` instead)",
        "dispatcher._mcp._session",
        ("MCPTool", "check_arguments"),
    ),
    (
        "turns what happened, and when, into the call's status, error and effect (the one table,"
        " `_outcomes.OUTCOMES`) and builds its one `ToolResult` (`_outcomes.build_result`); failures are read"
        " by `_mcp._failures`",
        "dispatcher._core._lifecycle",
        ("CallRecord.settle", "CallRecord._settle"),
    ),
    (
        "holds the result at the call's position; the gate, told the call finished, admits what waited on it",
        "dispatcher._driver._batch",
        ("Batch.settled", "Batch.results"),
    ),
)


def call_path_problems(known: dict[str, pathlib.Path] | None = None) -> list[str]:
    """Names of `CALL_PATH` that its module does not define (`Class.method`, a function or a constant)."""
    known = modules() if known is None else known
    problems = []
    for _, module, names in CALL_PATH:
        if module not in known:
            problems.append(f"{module} is not a module")
            continue
        tree = ast.parse(known[module].read_text(encoding="utf-8"))
        defined: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                defined.add(node.name)
                defined.update(
                    f"{node.name}.{item.name}"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                )
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(t.id for t in targets if isinstance(t, ast.Name))
        problems.extend(f"{module} defines no {name}" for name in names if name not in defined)
    return problems


@dataclass(frozen=True, kw_only=True, slots=True)
class Import:
    """One `import` or `from ... import` of a module, resolved to absolute names.

    Attributes:
        module: The importing module.
        source: The module imported from (`from source import names`, or `import source`).
        target: The package module it resolves to (None for modules outside the package).
        names: The names imported (empty for `import source`).
        type_checking: Whether it sits under `if TYPE_CHECKING:` (the type checker alone runs it).
        line: Its line in the importing module.
    """

    module: str
    source: str
    target: str | None
    names: tuple[str, ...]
    type_checking: bool
    line: int


def modules() -> dict[str, pathlib.Path]:
    """Every module of the package, by dotted name (a package by its own name), in name order."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return dict(sorted(found.items()))


def layer_of(module: str) -> int:
    """The index in `LAYERS` of a module's layer.

    Raises:
        KeyError: The module is in no layer.
    """
    for index, (_, _, members) in enumerate(LAYERS):
        if module in members:
            return index
    raise KeyError(f"{module} is in no layer: add it to scripts/architecture.py's LAYERS")


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}:
            for statement in node.body:
                inside.update(id(child) for child in ast.walk(statement))
    return inside


def _resolve(name: str, known: dict[str, pathlib.Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, known: dict[str, pathlib.Path] | None = None) -> list[Import]:
    """Every import in a module (at any depth: function-level imports too), in source order."""
    known = modules() if known is None else known
    path = known[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    type_checking = _type_checking_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known) if alias.name.split(".")[0] == "dispatcher" else None
                found.append(
                    Import(
                        module=module,
                        source=alias.name,
                        target=target,
                        names=(),
                        type_checking=id(node) in type_checking,
                        line=node.lineno,
                    )
                )
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, source] if source else base)
            inner = source.split(".")[0] == "dispatcher"
            for alias in node.names:
                # `from dispatcher import _calls` imports a module, `from ._calls import X` a name.
                full = f"{source}.{alias.name}"
                target = (full if full in known else _resolve(source, known)) if inner else None
                found.append(
                    Import(
                        module=module,
                        source=full if inner and full in known else source,
                        target=target,
                        names=() if inner and full in known else (alias.name,),
                        type_checking=id(node) in type_checking,
                        line=node.lineno,
                    )
                )
    return sorted(found, key=lambda found_import: found_import.line)


def concept(path: pathlib.Path) -> str:
    """The first line of a module's docstring: the one concept it holds."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return docstring.splitlines()[0] if docstring else ""


def line_count(path: pathlib.Path) -> int:
    """How many lines a module has."""
    return len(path.read_text(encoding="utf-8").splitlines())


def _short(module: str) -> str:
    return module.removeprefix("dispatcher.") if module != "dispatcher" else "dispatcher"


def _edges(known: dict[str, pathlib.Path]) -> dict[str, tuple[set[str], set[str]]]:
    """For each module: the package modules it imports at run time, and those it imports for types alone."""
    edges: dict[str, tuple[set[str], set[str]]] = {}
    for module in known:
        runtime: set[str] = set()
        typing_only: set[str] = set()
        for found in imports(module, known):
            if found.target is None or found.target == module:
                continue
            (typing_only if found.type_checking else runtime).add(found.target)
        edges[module] = (runtime, typing_only - runtime)
    return edges


def render() -> str:
    """docs/architecture.md, from the code."""
    known = modules()
    edges = _edges(known)
    out = [
        "# Architecture",
        "",
        "<!-- Generated by `make architecture` (python -m scripts.architecture) from the code: do not edit. -->",
        "",
        "The package is built in layers. A module imports, at run time, only from its own layer and the layers",
        "below it; imports under `if TYPE_CHECKING:` may name types of a higher layer (they never run). No",
        "module imports another's private names or the `mcp` SDK's, and no two modules import each other at run",
        "time. tests/test_architecture.py checks these rules and that this page lists every module.",
        "",
        "## Layers",
        "",
    ]
    for index, (name, description, members) in enumerate(LAYERS, start=1):
        out.append(f"{index}. **{name}**: {description}.")
        out.extend(f"   - `{_short(module)}`: {concept(known[module])}" for module in members if module in known)
    out += [
        "",
        "## The path of one call",
        "",
        "From `await dispatcher.dispatch(calls)` to the call's `ToolResult`, module by module:",
        "",
    ]
    for index, (what, module, names) in enumerate(CALL_PATH, start=1):
        shown = ", ".join(f"`{name}`" for name in names)
        out.append(f"{index}. `{_short(module)}` ({shown}): {what}.")
    out += ["", "## Modules", ""]
    out.append("| module | layer | lines | imports (run time) | imports (types only) |")
    out.append("|---|---|---:|---|---|")
    total = 0
    for index, (_, _, members) in enumerate(LAYERS, start=1):
        for module in members:
            if module not in known:
                continue
            lines = line_count(known[module])
            total += lines
            runtime, typing_only = edges[module]
            out.append(
                f"| `{_short(module)}` | {index} | {lines} | "
                f"{', '.join(_short(target) for target in sorted(runtime)) or '-'} | "
                f"{', '.join(_short(target) for target in sorted(typing_only)) or '-'} |"
            )
    out += ["", f"{len(known)} modules, {total} lines.", ""]
    out += [
        "## Import graph between layers",
        "",
        "A solid arrow: some module of the first layer imports one of the second at run time; a dotted arrow:",
        "for types only. Arrows within a layer are in the table above.",
        "",
        "```mermaid",
        "flowchart TD",
    ]
    out.extend(f'    L{index}["{index}. {name}"]' for index, (name, _, _) in enumerate(LAYERS, start=1))
    layer_edges: dict[tuple[int, int], bool] = {}
    for module, (runtime, typing_only) in edges.items():
        for target, type_only in [*((t, False) for t in runtime), *((t, True) for t in typing_only)]:
            pair = (layer_of(module) + 1, layer_of(target) + 1)
            if pair[0] != pair[1]:
                layer_edges[pair] = layer_edges.get(pair, True) and type_only
    for (upper, lower), type_only in sorted(layer_edges.items()):
        out.append(f"    L{upper} {'-.->' if type_only else '-->'} L{lower}")
    out += ["```", ""]
    return "\n".join(out)


def _without_counts(text: str) -> list[str]:
    """The page with its line counts blanked (they drift with every edit; the structure must not)."""
    text = re.sub(r"^(\| `[^`]+` \| \d+ \| )\d+( \|)", r"\1-\2", text, flags=re.MULTILINE)
    return re.sub(r"^\d+ modules, \d+ lines\.$", "", text, flags=re.MULTILINE).splitlines()


def main(argv: list[str] | None = None) -> int:
    """Write docs/architecture.md, or with `--check` report whether it is current (line counts aside)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.architecture", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/architecture.md, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        diff = list(difflib.unified_diff(_without_counts(current), _without_counts(text), lineterm=""))
        if diff:
            print("\n".join(diff[:60]), file=sys.stderr)
            print("docs/architecture.md is out of date: run make architecture", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
