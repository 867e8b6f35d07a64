"""The project's import graph: no module import cycle anywhere; the engine's and the workbench's
packages import only down their documented ``LAYERS``; the workbench reaches the engine only
through the seams ``ARCHITECTURE.md`` lists; no module grows past ~300 lines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

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


def unit_of(mod: str, root: str) -> str | None:
    """The layer unit of ``mod`` inside ``root`` (``engine.core.engine`` -> ``core``); ``None``
    for the root package itself and for modules outside it."""
    parts = mod.split(".")
    return parts[1] if parts[0] == root and len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]], root: str, layers: tuple[str, ...]) -> list[str]:
    """Every import inside ``root`` that points up ``layers`` (top first), imports the root
    package's own ``__init__`` (the public surface is for users), or comes from a unit that
    ``layers`` does not name."""
    rank = {u: i for i, u in enumerate(layers)}
    out = []
    for mod, deps in graph.items():
        src = unit_of(mod, root)
        if src is None:
            continue
        if src not in rank:
            out.append(f"{mod}: unit {src!r} is not in the documented layers")
            continue
        for dep in deps:
            dst = unit_of(dep, root)
            if dep == root:
                out.append(f"{mod} -> {dep} (the package's public surface)")
            elif dst is not None and dst in rank and rank[dst] < rank[src]:
                out.append(f"{mod} -> {dep} ({dst} is above {src})")
    return sorted(out)


# Where the workbench may reach into the engine: the seams ARCHITECTURE.md documents. Everywhere:
# settings and the variant registries, the model and its no-cache reference, the text stack
# (tokenizer, chat template, DSML grammar, parsers), prompt planning, sessions, the dump format
# and the completion-id format. In-process hosts of engine code (the simulator, the kernel
# comparison) also reach the engine loop, the PD engines and the simulated runtime; the launcher
# the control plane's secret and NIXL's pacing; the CLI the engine's override parser.
SEAMS_EVERYWHERE = ("engine.config", "engine.patches", "engine.registry", "engine.faults",
                    "engine.model", "engine.text", "engine.serving.generation",
                    "engine.training.datagen", "engine.core.dump", "engine.serving.responses")
SEAMS_FOR = {
    "workbench.sim": ("engine.core", "engine.disagg", "engine.sim", "engine.kernels"),
    "workbench.studies.kernels": ("engine.core", "engine.kernels"),
    "workbench.studies.kernel_faults": ("engine.kernels",),
    "workbench.deploy": ("engine.disagg.control", "engine.transfer.progress"),
    "workbench.cli": ("engine.cli",),
}


def _within(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def engine_reach(graph: dict[str, set[str]]) -> list[str]:
    """Workbench imports of engine modules outside the documented seams."""
    out = []
    for mod, deps in graph.items():
        if not _within(mod, "workbench"):
            continue
        allowed = SEAMS_EVERYWHERE + tuple(
            s for owner, seams in SEAMS_FOR.items() if _within(mod, owner) for s in seams)
        out += [f"{mod} -> {d}" for d in deps
                if _within(d, "engine") and not any(_within(d, s) for s in allowed)]
    return sorted(out)


def test_layer_check_finds_planted_violations():
    graph = {"pkg.low.a": {"pkg.high.b"}, "pkg.high.b": {"pkg.low.a"}, "pkg.mid.c": {"pkg"},
             "pkg.stray.d": set(), "pkg": {"pkg.high.b"}}
    found = upward_imports(graph, "pkg", ("high", "mid", "low"))
    assert found == ["pkg.low.a -> pkg.high.b (high is above low)",
                     "pkg.mid.c -> pkg (the package's public surface)",
                     "pkg.stray.d: unit 'stray' is not in the documented layers"]
    assert engine_reach({"workbench.drive.x": {"engine.core.engine", "engine.config"},
                         "workbench.sim.y": {"engine.core.engine"}}) == [
        "workbench.drive.x -> engine.core.engine"]


@pytest.mark.parametrize("root", ["engine", "workbench"])
def test_imports_point_down_the_documented_layers(root):
    layers = importlib.import_module(root).LAYERS
    graph = import_graph()
    assert sum(unit_of(m, root) is not None for m in graph) > 30, "the graph was read"
    assert upward_imports(graph, root, layers) == []


def test_the_workbench_reaches_the_engine_only_through_its_seams():
    assert engine_reach(import_graph()) == []


def test_the_workbench_is_packages_not_a_bag_of_files():
    top = [p.name for p in (ROOT / "workbench").glob("*.py")]
    assert len(top) <= 10, top
    long = [str(p.relative_to(ROOT)) for pkg in ("engine", "workbench") for p in
            (ROOT / pkg).rglob("*.py") if len(p.read_text().splitlines()) > 320]
    assert long == [], long


HOT_PATH = ("engine/core/engine.py", "engine/core/model_runner.py", "engine/disagg/decode.py",
            "engine/disagg/prefill.py", "engine/router/app.py")


def test_bug_variants_sit_behind_named_seams_not_on_the_hot_path():
    import engine.disagg.decode  # noqa: F401 - registers the decode, prefill and core variants
    import engine.disagg.prefill  # noqa: F401
    import engine.router.app  # noqa: F401 - registers the router's variants
    from engine.disagg.variants import DecodeHooks
    from engine.patches import PATCHES
    from engine.variants import hooks_for, variant_names

    assert variant_names() == {n for n in PATCHES if PATCHES.get(n).behaviour}
    assert all(PATCHES.get(n).behaviour or PATCHES.get(n).config for n in PATCHES)
    for rel in HOT_PATH:
        text = (ROOT / rel).read_text()
        assert ".has(" not in text, rel
        assert not [p for p in PATCHES if f'"{p}"' in text], rel
    assert type(hooks_for(DecodeHooks, ())) is DecodeHooks
    both = hooks_for(DecodeHooks, ["aux_slot_double_free", "late_write_after_abort"])
    slots: list[int] = []
    both.release_aux(slots, 3)
    assert slots == [3, 3] and both.frees_aborted_pages_now(False) and both.waits_for_aux()


def _string_literals(tree: ast.AST):
    """(literal, is the argument of a ``variant(...)`` call) for every str constant."""
    bound = {id(c.args[0]) for c in ast.walk(tree) if isinstance(c, ast.Call) and c.args
             and getattr(c.func, "id", getattr(c.func, "attr", "")) == "variant"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value, id(node) in bound


def test_patch_names_are_spelled_only_in_their_records():
    """Library code names a patch only in ``engine/patches.py`` (its record and the named roles
    beside it) or as the ``variant("...")`` that binds its mixin; every list of patches is
    derived from the records."""
    from engine.patches import PATCHES

    names, found = set(PATCHES), []
    for mod, path in _modules().items():
        if mod.startswith("bench") or mod == "engine.patches":
            continue
        for text, bound in _string_literals(ast.parse(path.read_text())):
            if text in names and not bound:
                found.append(f"{path.relative_to(ROOT)}: {text}")
    assert found == [], found


def test_every_patch_record_is_complete_and_the_investigation_never_reads_its_truth():
    from engine.patches import PATCHES, SIMULATED, SIMULATED_PD, ZOO, SimScope
    from workbench.drive.modes import MODES

    for name in PATCHES:
        p = PATCHES.get(name)
        assert bool(p.components) != p.modifier, name  # a bug arises somewhere; a modifier not
        assert set(p.needs) <= set(MODES), (name, p.needs)
        assert (name in SIMULATED_PD) == (p.sim is not SimScope.NONE), name
    assert set(ZOO) - SIMULATED_PD, "the real-only variants exist and are not called simulated"
    assert SIMULATED <= SIMULATED_PD
    readers = [m for m, path in _modules().items() if m.startswith("workbench")
               and ".components" in path.read_text()]
    assert readers == [], readers


def _notebook_cells(path: Path) -> list[tuple[bool, str]]:
    """(is the parameters cell, source) of each code cell of a jupytext percent notebook."""
    cells, params, lines = [], False, []
    for line in path.read_text().splitlines():
        if line.startswith("# %%"):
            if lines:
                cells.append((params, "\n".join(lines)))
            params, lines = "parameters" in line, []
            if "[markdown]" in line:
                params = None
        elif params is not None:
            lines.append(line)
    if lines and params is not None:
        cells.append((params, "\n".join(lines)))
    return [(bool(p), src) for p, src in cells]


FILE_SUFFIXES = (".safetensors", ".parquet", ".sqlite", ".pickle", ".jsonl", ".json", ".npz")


def test_notebooks_call_public_names_and_spell_no_file_names():
    """A notebook imports ``workbench``'s top-level names or a package's exported ones (its
    ``__all__``); outside its parameters cell no string names a file (formats belong to the
    library that writes and reads them)."""
    bad = []
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        for params, src in _notebook_cells(nb):
            tree = ast.parse(src)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench"):
                    public = set(importlib.import_module(node.module).__dict__.get("__all__", ()))
                    deep = node.module.count(".") > 1
                    bad += [f"{nb.name}: from {node.module} import {a.name}" for a in node.names
                            if deep or a.name not in public]
                if not params and isinstance(node, ast.Constant) and isinstance(node.value, str):
                    bad += [f"{nb.name}: {node.value!r}" for s in FILE_SUFFIXES
                            if node.value.endswith(s)]
            bad += [f"{nb.name}: import {a.name}" for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for a in node.names
                    if a.name.startswith("workbench.")]
    assert bad == [], bad


def test_notebooks_record_only_library_claims():
    """A notebook records ``FindingDraft``s a library computed (``record_drafts``); it builds no
    checks of its own (``record_finding`` takes a dict of checks)."""
    inline = [nb.name for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
              if "record_finding" in nb.read_text()]
    assert inline == [], inline
