"""Executable reports: run a notebook with papermill parameters, export it to HTML."""

from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

def notebooks_dir() -> Path:
    """The notebooks: a checkout's beside this package, else ``./notebooks`` (an installed
    package run from a checkout, as the engine's ``data/`` needs anyway)."""
    beside = Path(__file__).resolve().parents[2] / "notebooks"
    return beside if beside.is_dir() else Path("notebooks").resolve()


NOTEBOOKS = notebooks_dir()
REPORT_MODULES = ("jupytext", "papermill", "nbconvert", "nbformat", "ipykernel")


class ReportUnavailable(RuntimeError):
    """Executable reports need the ``report`` extra and the notebooks of a source checkout."""


def require_report_extra(what: str = "an executable report") -> None:
    """Raises ``ReportUnavailable`` naming what is missing (modules or the notebooks folder)."""
    import importlib.util

    missing = [m for m in REPORT_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ReportUnavailable(f"{what} needs the report extra ({', '.join(missing)} missing): "
                                "pip install 'pd-workbench[report]'")
    if not NOTEBOOKS.is_dir():
        raise ReportUnavailable(f"{what} executes the notebooks of a source checkout; none at "
                                f"{NOTEBOOKS} (run from a clone, or without the report)")


def run_report(notebook: str | Path, params: dict | None = None,
               out_dir: str | Path = "reports", kernel: str = "python3",
               timeout_s: int = 1800) -> Path:
    """Executes ``notebook`` (a .ipynb, or a jupytext .py paired with one) and writes HTML.

    Returns the HTML path (written by ``workbench.report.static.export_html``);
    ``ReportUnavailable`` without the report extra. A cell that raises (e.g.
    a finding whose assertion no longer holds) fails the run with papermill's
    ``PapermillExecutionError``; the executed notebook is kept.
    """
    require_report_extra(f"running {Path(notebook).name}")
    import jupytext
    import nbformat
    import papermill

    from workbench.report.static import export_html

    src = Path(notebook)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if src.suffix == ".py":
        ipynb = out / (src.stem + ".source.ipynb")
        nbformat.write(jupytext.read(src), ipynb)
        src = ipynb
    executed = out / (Path(notebook).stem + ".ipynb")
    t0 = time.monotonic()
    papermill.execute_notebook(str(src), str(executed), parameters=params or {},
                               kernel_name=kernel, execution_timeout=timeout_s, progress_bar=False,
                               cwd=str(Path.cwd()))
    html = export_html(executed)  # static views, the embedded DSML font
    log.info("executed %s in %.0fs -> %s", notebook, time.monotonic() - t0, html)
    return html
