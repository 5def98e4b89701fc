"""The package's imports form no cycle: a cycle makes import order matter and hides which module
owns an idea. Imports deferred into functions count too (they only move the cycle to run time);
a module's own packages do not (they are initialised before it runs)."""

from __future__ import annotations

import ast
from pathlib import Path

import specdec

ROOT = Path(specdec.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(name: str, modules: set[str]) -> set[str]:
    """``name`` and the subpackages importing it runs (their ``__init__``), if ours."""
    parts = name.split(".")
    prefixes = {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
    return {p for p in prefixes if p in modules}


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Our modules that ``path`` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found |= _targets(alias.name, modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= _targets(node.module, modules)
            for alias in node.names:  # ``from specdec import ops`` imports a module
                found |= _targets(f"{node.module}.{alias.name}", modules)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(files)
    # a module's own packages are initialised before it runs: importing a sibling through them
    # is no cycle
    return {
        m: {n for n in _imports(p, modules) if not (m + ".").startswith(n + ".")}
        for m, p in files.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_no_import_cycle_in_specdec():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
