"""Executes the investigation notebooks in a real Jupyter kernel with small parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.report import run_report

pytestmark = pytest.mark.slow
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SMALL = {"05_investigation_template.py": {"sessions": 2, "turns": 1, "max_tokens": 60}}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_executes_and_exports_html(tmp_path, name):
    html = run_report(NOTEBOOKS / name, SMALL[name], tmp_path, timeout_s=600)
    text = html.read_text()
    assert html.exists() and "Traceback" not in text
    assert "first_bad_position" in text  # the diff table rendered


def test_every_notebook_is_paired_and_tested():
    pys = {p.name for p in NOTEBOOKS.glob("*.py")}
    assert pys == set(SMALL)
    assert all((NOTEBOOKS / n).with_suffix(".ipynb").exists() for n in pys)
