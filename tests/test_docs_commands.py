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
    assert ("workbench.investigate.crash_study", "") in MODULES
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
