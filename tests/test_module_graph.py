"""The shape of the packages: no import cycles (hidden ones included), no module calling
another's private names, and the turn machinery in modules of a readable size."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.core

# Each package by the directory its distribution keeps it in (roder_api is roder-api's).
PACKAGES = {"roder_api": REPO / "packages" / "roder-api" / "src", "roder_runtime": REPO}


def modules() -> dict[str, Path]:
    """Return every module of our packages by dotted name."""
    found: dict[str, Path] = {}
    for package, root in PACKAGES.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Yield every import that runs: at module level, in functions and classes alike —
    only those under ``if TYPE_CHECKING:`` (never run) are left out."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def resolve(name: str, current: str, level: int, known: dict[str, Path]) -> str:
    if level:
        base = current.split(".")
        if not known[current].name == "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (level - 1)]
        name = ".".join([*base, name] if name else base)
    return name


def graph() -> dict[str, set[str]]:
    """Return the import edges between our modules."""
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = resolve(node.module or "", name, node.level, known)
                targets = []
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.append(submodule if submodule in known else source)
            for target in targets:
                if target in known and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_module_graph_has_no_import_cycles() -> None:
    edges = graph()
    assert edges["roder_runtime.session._session"], "the graph is empty: the import walk is broken"
    assert cycles(edges) == []


def test_roder_api_threads_and_the_store_kit_import_one_way() -> None:
    # roder_api.threads re-exports the kit's helpers, so the kit must not import it back
    # (not even late, inside a function): both import the contract from its own module.
    edges = graph()
    assert any(t.startswith("roder_api.storekit") for t in edges["roder_api.threads"])
    kit = [name for name in edges if name.startswith("roder_api.storekit")]
    assert [m for m in kit if "roder_api.threads" in edges[m]] == []
    assert "roder_api.threads" not in edges["roder_api.codec"]


def test_no_runtime_module_is_part_of_any_cycle() -> None:
    assert [c for c in cycles(graph()) if any(m.startswith("roder_runtime") for m in c)] == []


def test_the_cycle_check_sees_function_level_imports() -> None:
    tree = ast.parse("def f():\n    from roder_runtime import _runtime\n")
    assert [n.names[0].name for n in imports(tree)] == ["_runtime"]  # type: ignore[union-attr]
    hidden = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(hidden) == [["a", "b"]]


def private_uses(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """Return the private names of other modules that module ``name`` imports or uses."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    imported_modules: set[str] = set()
    for node in imports(tree):
        if isinstance(node, ast.ImportFrom):
            source = resolve(node.module or "", name, node.level, known)
            if source not in known:
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    imported_modules.add(alias.asname or alias.name)
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{source}.{alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported_modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_runtime_module_uses_another_modules_private_names() -> None:
    known = modules()
    offences = {
        name: private_uses(name, path, known)
        for name, path in known.items()
        if name.startswith("roder_runtime")
    }
    assert {name: uses for name, uses in offences.items() if uses} == {}


@pytest.mark.parametrize(
    "module",
    [
        "session/_session.py",
        "compaction/_compaction.py",
        "turn/_driver.py",
        "model/_call.py",
    ],
)
def test_the_turn_machinery_stays_readable(module: str) -> None:
    lines = (REPO / "roder_runtime" / module).read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"{module} has {lines} lines; split it along a seam"


def test_no_module_is_over_500_lines() -> None:
    sizes = {name: path.read_text(encoding="utf-8").count("\n") for name, path in modules().items()}
    assert {name: lines for name, lines in sizes.items() if lines > 500} == {}
