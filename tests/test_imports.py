"""No import cycles anywhere in the tree (imports inside functions included), and the service
never reaches torch or the model code: the bundle folder is the only seam."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "export", "service")


def module_name(file: Path) -> str:
    parts = list(file.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(file: Path, modules: set[str]) -> set[str]:
    """The tree's modules `file` imports, anywhere in it (a package import counts as its
    __init__; `from pkg import mod` as pkg.mod when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(f): f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")}
    modules = set(files)
    return {m: imports_of(f, modules) - {m} for m, f in files.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    edges = graph()
    inside = {m: {n for n in e if n.split(".")[0] == package} for m, e in edges.items() if m.split(".")[0] == package}
    assert find_cycle(inside) is None, " -> ".join(find_cycle(inside) or [])


def test_the_service_imports_neither_torch_nor_the_model_code_nor_the_exporter():
    for file in (ROOT / "service").rglob("*.py"):
        tree = ast.parse(file.read_text(), str(file))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    assert name.split(".")[0] not in ("torch", "models", "export"), (file, name)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
