"""Every command the docs show runs: each ``python -m MODULE [SUBCOMMAND]`` and ``wb SUBCOMMAND``
in README.md, ARCHITECTURE.md and docs/ answers ``--help`` with its usage and exit 0 (a module
that lost its ``__main__`` guard prints nothing, and fails here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli import main as wb_main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
FOREIGN = {"sglang_router.launch_router"}  # SGLang's router: its own CLI, driven in its tests
PY_M = re.compile(r"python -m ([A-Za-z_][\w.]*)(?: ([a-z][a-z_-]*)\b)?")
WB = re.compile(r"(?<![\w/.-])wb ([a-z]+)\b")


def documented() -> tuple[set[tuple[str, str]], set[str]]:
    mods, subs = set(), set()
    for doc in DOCS:
        text = doc.read_text()
        mods |= {(m, s or "") for m, s in PY_M.findall(text) if m not in FOREIGN}
        subs |= set(WB.findall(text))
    return mods, subs


MODULES, WB_SUBS = documented()


def test_the_docs_show_commands():
    assert ("workbench.studies.crash_study", "") in MODULES
    assert {"investigate", "bisect"} <= WB_SUBS


@pytest.mark.slow
@pytest.mark.parametrize("module,sub", sorted(MODULES))
def test_python_m_answers_help(module, sub):
    argv = [sys.executable, "-m", module, *([sub] if sub else []), "--help"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "usage" in out.stdout.lower(), f"{' '.join(argv[2:])} printed no usage: {out.stdout!r}"


@pytest.mark.parametrize("sub", sorted(WB_SUBS))
def test_wb_subcommand_answers_help(sub, capsys):
    with pytest.raises(SystemExit) as done:
        wb_main([sub, "--help"])
    assert done.value.code == 0
    assert f"wb {sub}" in capsys.readouterr().out


def _package_rows(section: str) -> list[tuple[str, list[str]]]:
    """(package, public names) of each row of ARCHITECTURE.md's table under ``section``;
    ``engine.{a,b}`` rows expand to one package each (their names belong to the first)."""
    text = (ROOT / "ARCHITECTURE.md").read_text().split(f"## {section}", 1)[1].split("\n## ")[0]
    rows = []
    for pkg, names in re.findall(r"^\| `([\w.{},]+)` \|.*\| (.*) \|$", text, re.M):
        head, _, tail = pkg.partition("{")
        subs = [head + s for s in tail.rstrip("}").split(",")] if tail else [pkg]
        found = [n for n in re.findall(r"`([A-Za-z_]\w*)`", names)]
        rows += [(s, found if i == 0 else []) for i, s in enumerate(subs)]
    return rows


@pytest.mark.parametrize("root", ["engine", "workbench"])
def test_the_architecture_package_table_matches_the_code(root):
    """Every unit of ``LAYERS`` has a row, in layer order, and every public name a row lists
    is exported by that package (or defined by that module)."""
    import importlib

    rows = _package_rows(f"{root.capitalize()} packages")
    layers = importlib.import_module(root).LAYERS
    units = [f"{root}.{u}" for u in layers if u not in ("__main__", "cli") or root == "workbench"]
    assert [p for p, _ in rows] == units
    for pkg, names in rows:
        mod = importlib.import_module(pkg)
        public = set(getattr(mod, "__all__", ())) or {n for n in vars(mod) if n[0] != "_"}
        assert set(names) <= public, (pkg, sorted(set(names) - public))
