"""models/ imports flow one way: no module reaches itself through its imports.

Every module under models/ is parsed with `ast` (imports inside functions count: a lazy import
hides a cycle from Python at import time, not from the design), and the graph of imports
between models' own modules must have no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import models

ROOT = Path(models.__file__).parent


def module_name(path: Path) -> str:
    parts = ["models", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The models.* modules one module imports, anywhere in its body."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from models import encoder`
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(paths)
    return {
        name: imported(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        for name, path in paths.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_lazy_imports_inside_functions():
    tree = ast.parse("def f():\n    from models.encoder import Encoder\n")
    known = {"models.encoder", "models.config"}
    assert imported(tree, "models.config", False, known) == {"models.encoder"}


def test_a_cycle_is_found_and_named():
    graph = {"models.a": {"models.b"}, "models.b": {"models.c"}, "models.c": {"models.a"}}
    assert find_cycle(graph) == ["models.a", "models.b", "models.c", "models.a"]


def test_models_modules_import_each_other_without_a_cycle():
    graph = import_graph()
    assert "models.config" in graph and "models.encoder" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
