"""The product's modules import one another without a circle: every import counts, those inside functions and
under TYPE_CHECKING included (each is a dependency of the design, whenever it runs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("service", "client_stub")


def product_modules() -> dict[str, Path]:
    """Every module of the product by its dotted name (a package by its own name, for its __init__.py)."""
    modules = {}
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product's modules that ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # ``from package import name``: the submodule if there is one of that name, else the package's name.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module -> the modules whose import runs when it imports: those it names, and their packages'
    __init__.py (but for its own packages', which are running already when it is imported)."""
    modules = product_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges = set()
        for target in imported(name, path, modules):
            parts = target.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} - own
        graph[name] = edges - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_product_has_no_import_circle() -> None:
    graph = import_graph()
    assert "service.front.sidecar_front" in graph and "client_stub.producer" in graph, "the walk found no product"
    found = circles(graph)
    described = [" -> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
                 for c in found]
    assert not found, "import circles:\n" + "\n".join(described)


@pytest.mark.parametrize(("source", "edge"), [
    ("def later():\n    from service.b import thing\n", "service.b"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import thing\n", "service.b"),
    ("from . import b\n", "service.b"),
])
def test_the_walk_counts_imports_in_functions_and_for_types_too(tmp_path: Path, source: str, edge: str) -> None:
    path = tmp_path / "a.py"
    path.write_text(source)
    modules = {"service": tmp_path / "__init__.py", "service.a": path, "service.b": tmp_path / "b.py"}
    assert imported("service.a", path, modules) == {edge}


def test_a_circle_is_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
