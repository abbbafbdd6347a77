"""dsgen's imports flow one way: no module reaches, directly or through others, back to itself.

The graph is read from the source with :mod:`ast`, so it sees every import: module-level ones,
the lazy ones inside functions, and those under ``TYPE_CHECKING``. A lazy import that closes a
circle is still a circle (the two modules still depend on each other); the fix is to move the
shared piece to a module both sides import downward.

An edge is an import as written: ``from dsgen.a import b`` depends on the submodule ``dsgen.a.b``
when there is one, and on the package ``dsgen.a`` for any other name it takes from it. (Python
also runs ``dsgen/a/__init__.py`` first; a package that re-exports its submodules is not a circle
with them, it is their facade.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "dsgen"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


def _absolute(module: str, level: int, name: str | None, is_package: bool) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _imported(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every dsgen module that ``module`` imports."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node.level, node.module, is_package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append(submodule if submodule in known else base)
        yield from (target for target in targets if target in known and target != module)


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: set(_imported(name, path, known)) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module are the circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_circle() -> None:
    assert strongly_connected(import_graph()) == []


def test_the_graph_sees_lazy_and_relative_imports() -> None:
    """The walker itself: a known downward edge of each kind is found."""
    graph = import_graph()
    assert "dsgen.errors" in graph["dsgen.cli"]  # module-level import
    assert "dsgen.validate.loader" in graph["dsgen.validate.validator"]  # lazy, inside a function
    assert "dsgen.validate.rules.batch" in graph["dsgen.validate.rules"]  # relative: from pkg import submodule
    assert len(graph) == len(_modules()) > 50


@pytest.mark.parametrize(
    ("graph", "circles"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_circle_finder(graph: dict[str, set[str]], circles: list[list[str]]) -> None:
    assert strongly_connected(graph) == circles
