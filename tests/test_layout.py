"""The project's import graph: no module import cycle anywhere, and engine packages form
layers (a package never imports one that imports it back)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "workbench", "bench")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(tree: ast.AST):
    """Every import node, lazy and ``TYPE_CHECKING`` ones included (a type-only cycle is still a
    cycle of the design)."""
    return (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))


def import_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports (``from a import b`` is ``a.b`` when that is a
    module, else ``a``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level == 0 and node.module:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods
                           else node.module for a in node.names]
            else:
                targets = []
            graph[mod] |= {t for t in targets if t in mods and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_import_cycle():
    graph = import_graph()
    assert len(graph) > 60 and graph["engine.core.engine"], "the graph was read"
    assert cycles(graph) == []


def test_engine_packages_are_layered():
    def package(mod: str) -> str | None:
        parts = mod.split(".")
        return parts[1] if mod.startswith("engine.") and len(parts) > 2 else None

    edges: dict[str, set[str]] = {}
    for mod, deps in import_graph().items():
        src = package(mod)
        if src is None:
            continue
        edges.setdefault(src, set())
        edges[src] |= {p for d in deps if (p := package(d)) and p != src}
    for p in list(edges):
        for d in list(edges[p]):
            edges.setdefault(d, set())
    assert cycles(edges) == [], edges
    assert "core" in edges["serving"] and "serving" not in edges["core"]
