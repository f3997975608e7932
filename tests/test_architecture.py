"""The package's layering, read from its source with `ast` (scripts/architecture.py holds the layers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatcher._core import _errors as errors_module
from scripts.architecture import (
    CALL_PATH,
    DOC,
    LAYERS,
    PACKAGE_DIR,
    Import,
    call_path_problems,
    imports,
    layer_of,
    line_count,
    modules,
)

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable, Iterable

# Known exceptions, each in a file this change leaves alone, each to be removed when its file is fixed.
# An edge (importer, imported) listed here is left out of the cycle check.
KNOWN_RUNTIME_CYCLE_EDGES: frozenset[tuple[str, str]] = frozenset()

# The most lines a module may have (issue 22); the modules listed below are known to be longer, each to
# be removed from the list when it is split.
MAX_LINES = 600
KNOWN_LONG_MODULES: frozenset[str] = frozenset()

# The sans-I/O core: state machines and data, driven by `dispatcher._driver`.
CORE = "dispatcher._core"


def _all_imports(known: dict[str, pathlib.Path]) -> list[Import]:
    return [found for module in known for found in imports(module, known)]


def private_name_imports(found: Iterable[Import]) -> list[str]:
    """Imports of another package module's underscore-prefixed names (its private modules may be imported)."""
    return [
        f"{i.module}:{i.line} imports {name} from {i.source}"
        for i in found
        if i.target is not None and i.target != i.module
        for name in i.names
        if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
    ]


def sdk_private_imports(found: Iterable[Import]) -> list[str]:
    """Imports of the `mcp` SDK's private modules or names."""
    problems = []
    for i in found:
        top = i.source.split(".")[0]
        if top not in {"mcp", "mcp_types"}:
            continue
        private = [part for part in (*i.source.split("."), *i.names) if part.startswith("_")]
        if private:
            problems.append(f"{i.module}:{i.line} imports the SDK's private {private} ({i.source})")
    return problems


def upward_imports(found: Iterable[Import], layer: Callable[[str], int]) -> list[str]:
    """Run-time imports from a module of a higher layer."""
    return [
        f"{i.module}:{i.line} (layer {layer(i.module) + 1}) imports {i.target} (layer {layer(i.target) + 1})"
        for i in found
        if i.target is not None and not i.type_checking and layer(i.target) > layer(i.module)
    ]


def runtime_cycles(found: Iterable[Import], ignored: frozenset[tuple[str, str]]) -> list[str]:
    """Pairs of modules that import each other at run time, directly or through others."""
    graph: dict[str, set[str]] = {}
    for i in found:
        if i.target is not None and i.target != i.module and not i.type_checking:
            if (i.module, i.target) not in ignored:
                graph.setdefault(i.module, set()).add(i.target)

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(graph.get(node, ()))
        return False

    return sorted(f"{a} -> {b} -> ... -> {a}" for a, targets in graph.items() for b in targets if reaches(b, a))


def test_every_module_is_in_exactly_one_layer() -> None:
    """A new module must be placed in a layer; a layer names only modules that exist."""
    listed = [module for _, _, members in LAYERS for module in members]
    assert len(listed) == len(set(listed)), "a module is listed in two layers"
    unplaced = sorted(set(modules()) - set(listed))
    assert unplaced == [], "place these modules in a layer of LAYERS in scripts/architecture.py, then make architecture"
    assert sorted(set(listed) - set(modules())) == [], "LAYERS in scripts/architecture.py names modules that are gone"


def test_no_module_imports_another_modules_private_names() -> None:
    """Modules use each other's public names only (private modules are fine, their private names are not)."""
    assert private_name_imports(_all_imports(modules())) == []


def test_no_sdk_private_names_are_imported() -> None:
    """Nothing of the `mcp` SDK that starts with an underscore is imported: it may change in any release."""
    assert sdk_private_imports(_all_imports(modules())) == []


def test_no_module_imports_a_higher_layer_at_run_time() -> None:
    """Calls and results -> catalogue -> admission -> execution -> hooks -> adapters -> facade -> applications.

    Imports under `if TYPE_CHECKING:` may point up: with postponed annotations they never run, and let a lower
    layer name the type of what a higher one hands it (execution is given its hooks; a batch its observer).
    """
    assert upward_imports(_all_imports(modules()), layer_of) == []


def test_no_two_modules_import_each_other_at_run_time() -> None:
    """The run-time import graph has no cycle, apart from the known exceptions listed above."""
    assert runtime_cycles(_all_imports(modules()), KNOWN_RUNTIME_CYCLE_EDGES) == []


def test_the_known_exceptions_are_still_needed() -> None:
    """An exception that the code no longer needs is removed from the list (it would hide a regression)."""
    for edge in KNOWN_RUNTIME_CYCLE_EDGES:
        assert runtime_cycles(_all_imports(modules()), KNOWN_RUNTIME_CYCLE_EDGES - {edge}) != [], edge


def io_imports(found: Iterable[Import]) -> list[str]:
    """Run-time or type-only imports of an event loop library from a module of the sans-I/O core."""
    return [
        f"{i.module}:{i.line} imports {i.source}"
        for i in found
        if i.module.startswith(CORE) and i.source.split(".")[0] in {"anyio", "asyncio", "trio", "sniffio"}
    ]


def test_the_core_does_no_io() -> None:
    """No module of `dispatcher._core` imports anyio, asyncio or trio: the gate and lifecycle are sans-I/O."""
    assert io_imports(_all_imports(modules())) == []


def exceptions_outside_the_tree(known: dict[str, pathlib.Path]) -> list[str]:
    """Public or internal exception classes defined anywhere but `dispatcher._core._errors`."""
    import ast
    import builtins

    raised = {
        name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, Exception)
    }
    tree_names = set(errors_module.__all__)
    found = []
    for module, path in known.items():
        # The test doubles and the example server raise what a tool of theirs raises, not the package's errors.
        if module == "dispatcher._core._errors" or module.startswith(("dispatcher.testing", "dispatcher.examples")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {ast.unparse(base).rpartition(".")[2] for base in node.bases}
                if bases & (raised | tree_names):
                    found.append(f"{module}:{node.lineno} defines {node.name}")
    return found


def foreign_private_writes(known: dict[str, pathlib.Path]) -> list[str]:
    """Writes to another module's private attributes: `obj._name = ...` or `setattr(obj, "_name", ...)`.

    A module may write the private attributes its own classes define (`self._name`, or a `Ticket` of the gate
    updated by the gate); an attribute is its own when the module assigns it on `self` or names it in a class
    body (`__slots__` included).
    """
    import ast

    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own: set[str] = set()
        writes: list[tuple[int, str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    for target in getattr(statement, "targets", [getattr(statement, "target", None)]):
                        if isinstance(target, ast.Name):
                            own.add(target.id)
                    if isinstance(statement, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__slots__" for t in statement.targets
                    ):
                        own.update(
                            c.value
                            for c in ast.walk(statement.value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        )
            targets: list[ast.expr] = []
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and sub.attr.startswith("_") and not sub.attr.endswith("__"):
                        if ast.unparse(sub.value) in {"self", "cls"}:
                            own.add(sub.attr)
                        else:
                            writes.append((line, f"{ast.unparse(sub.value)}.{sub.attr}"))
            if isinstance(node, ast.Call) and ast.unparse(node.func) in {"setattr", "object.__setattr__"}:
                name = node.args[1] if len(node.args) > 1 else None
                if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("_"):
                    if ast.unparse(node.args[0]) in {"self", "cls"}:
                        own.add(name.value)
                    elif not name.value.endswith("__"):
                        writes.append((node.lineno, f"{ast.unparse(node.args[0])}.{name.value}"))
        found += [f"{module}:{line} writes {what}" for line, what in writes if what.rpartition(".")[2] not in own]
    return sorted(found)


def test_no_module_writes_another_modules_private_attributes() -> None:
    """A private attribute is written only by the module that defines it (state changes go through methods)."""
    assert foreign_private_writes(modules()) == []


def test_every_exception_is_in_the_errors_tree() -> None:
    """Every exception class of the package is defined in `dispatcher._core._errors`, whose docstring draws it."""
    assert exceptions_outside_the_tree(modules()) == []
    drawn = errors_module.__doc__ or ""
    assert [name for name in errors_module.__all__ if f" {name} " not in drawn.replace("\n", " \n ")] == []


def test_the_checks_catch_what_they_are_for(tmp_path: pathlib.Path) -> None:
    """Each check fails on a small package that breaks its rule (the checks are not vacuous)."""
    package = tmp_path / "dispatcher"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_low.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from mcp.client._memory import InMemoryTransport\n"
        "from ._high import _secret\n"
        "if TYPE_CHECKING:\n"
        "    from ._high import Public\n"
    )
    (package / "_high.py").write_text(
        "from . import _low\nclass Lost(ConnectionError):\n    pass\ndef poke(ticket):\n    ticket._state = 1\n"
    )
    (package / "_core").mkdir()
    (package / "_core" / "__init__.py").write_text("")
    (package / "_core" / "_state.py").write_text("import anyio\n")
    known = {"dispatcher": package / "__init__.py", "dispatcher._low": package / "_low.py"}
    known["dispatcher._high"] = package / "_high.py"
    known["dispatcher._core._state"] = package / "_core" / "_state.py"
    found = _all_imports(known)
    layers = {"dispatcher._low": 0, "dispatcher._high": 1, "dispatcher": 2, "dispatcher._core._state": 0}

    assert private_name_imports(found) == ["dispatcher._low:3 imports _secret from dispatcher._high"]
    assert sdk_private_imports(found) == [
        "dispatcher._low:2 imports the SDK's private ['_memory'] (mcp.client._memory)"
    ]
    # The type-only import of `Public` is not reported; the run-time one of `_secret` is.
    assert upward_imports(found, layers.__getitem__) == [
        "dispatcher._low:3 (layer 1) imports dispatcher._high (layer 2)"
    ]
    assert runtime_cycles(found, frozenset()) == [
        "dispatcher._high -> dispatcher._low -> ... -> dispatcher._high",
        "dispatcher._low -> dispatcher._high -> ... -> dispatcher._low",
    ]
    assert runtime_cycles(found, frozenset({("dispatcher._high", "dispatcher._low")})) == []
    assert io_imports(found) == ["dispatcher._core._state:1 imports anyio"]
    assert exceptions_outside_the_tree(known) == ["dispatcher._high:2 defines Lost"]
    assert foreign_private_writes(known) == ["dispatcher._high:5 writes ticket._state"]


def test_the_architecture_doc_lists_every_module() -> None:
    """docs/architecture.md names every module of the package (regenerate it with make architecture)."""
    text = DOC.read_text(encoding="utf-8")
    missing = [
        module
        for module in modules()
        if f"`{module.removeprefix('dispatcher.') if module != 'dispatcher' else module}`" not in text
    ]
    assert missing == [], "docs/architecture.md is out of date: run make architecture"


def test_the_path_of_one_call_names_code_that_exists(tmp_path: pathlib.Path) -> None:
    """docs/architecture.md's path of one call has at most eight hops, each naming what its module defines."""
    assert 1 <= len(CALL_PATH) <= 8
    assert call_path_problems() == []
    # The check is not vacuous: a module without the names is reported.
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    known = {module: empty for _, module, _ in CALL_PATH}
    assert len(call_path_problems(known)) == sum(len(names) for _, _, names in CALL_PATH)


def long_modules(package: pathlib.Path, limit: int) -> dict[str, int]:
    """Every .py file under `package` with more than `limit` lines, by its path from the package's parent."""
    return {
        path.relative_to(package.parent).as_posix(): lines
        for path in sorted(package.rglob("*.py"))
        if (lines := line_count(path)) > limit
    }


def test_no_module_is_over_the_line_limit(tmp_path: pathlib.Path) -> None:
    """No module of the package has more than MAX_LINES lines, apart from the known long modules."""
    too_long = long_modules(PACKAGE_DIR, MAX_LINES)
    assert set(too_long) - KNOWN_LONG_MODULES == set(), too_long
    # The check is not vacuous: a long file in a nested package is found, one at the limit is not.
    package = tmp_path / "dispatcher"
    (package / "_inner").mkdir(parents=True)
    (package / "_inner" / "_long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (package / "_short.py").write_text("x = 1\n" * MAX_LINES)
    assert long_modules(package, MAX_LINES) == {"dispatcher/_inner/_long.py": MAX_LINES + 1}


def test_the_known_long_modules_are_still_long() -> None:
    """Each module exempt from the line limit is still over it: once split, it leaves the list."""
    too_long = long_modules(PACKAGE_DIR, MAX_LINES)
    assert {path for path in KNOWN_LONG_MODULES if path not in too_long} == set()
