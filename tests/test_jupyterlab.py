"""Opens every notebook in a real JupyterLab in headless Chromium and checks that ipywidgets load.

A JupyterLab server (loopback, token, tmp copy of ``notebooks/`` as its root, tmp config/runtime/
settings dirs, news and update checks off) is driven by Debian Chromium over the DevTools protocol
(``tests/support/cdp.py``). Each notebook must render its panel and cells (the first markdown
heading appears in the DOM); a tiny widget notebook run through the real kernel must render an
``IntProgress`` and an ``IntSlider`` and follow a kernel-side value change. Notebook 01 runs top to
bottom in JupyterLab (this is its only full run in the suite; ``test_notebooks.py`` leaves it
here): the pair monitor must update at least five times during the load, the explorer must show
a flagged request's highlighted first differing token, and the saved notebook's exported HTML,
screenshot in this Chromium (no CJK fonts), must draw U+FF5C as a bar, not a box. Logs and PNG
screenshots go to the test's tmp dir (their paths are logged).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
from support.cdp import Browser, CDPError, _stop_group, find_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET_NB = "_widgets_check.ipynb"
WIDGET_ERRORS = (  # ipywidgets' failure texts (the error view shows only the last one)
    "Error displaying widget",
    "Failed to load model class",
    "Error rendering",
    "Click to show javascript error",
)
SERVER_START_S = 90
LAB_LOAD_S = 90
RENDER_S = 60
KERNEL_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _first_heading(nb_path: Path) -> str:
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#{1,6}\s+(.+)$", cell.source, re.M)
            if m:
                return m.group(1).strip()
    raise AssertionError(f"{nb_path.name} has no markdown heading")


def _write_widget_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Widget check"),
        nbformat.v4.new_code_cell(
            "import ipywidgets as w\n"
            "p = w.IntProgress(value=7, min=0, max=10, description='wb-progress')\n"
            "s = w.IntSlider(value=3, min=0, max=10, description='wb-slider')\n"
            "display(w.VBox([p, s]))\n"
            "print('widgets-displayed', w.__version__)"
        ),
        nbformat.v4.new_code_cell("s.value = 9\np.value = 10\nprint('widgets-updated')"),
    ]
    nbformat.write(nb, path)


class Lab:
    def __init__(self, workdir: Path):
        self.root = workdir / "root"
        self.url = ""
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.log_path = workdir / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None
        self.workdir = workdir

    def start(self) -> None:
        shutil.copytree(ROOT / "notebooks", self.root / "notebooks")
        # kernels run in the notebook's folder; the engine's default model_dir is "data/model"
        (self.root / "notebooks" / "data").symlink_to(ROOT / "data", target_is_directory=True)
        _write_widget_notebook(self.root / WIDGET_NB)
        dirs = {k: self.workdir / k.lower() for k in (
            "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
            "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR", "IPYTHONDIR")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        settings = {
            "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
            # the default; pinned because the render check expects every cell in the DOM
            "notebook-extension/tracker": {"windowingMode": "contentVisibility"},
        }
        for name, value in settings.items():
            f = dirs["JUPYTERLAB_SETTINGS_DIR"] / "@jupyterlab" / f"{name}.jupyterlab-settings"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(value))
        env = {**os.environ, **{k: str(v) for k, v in dirs.items()}}
        env.update(JUPYTER_PLATFORM_DIRS="1", PYDEVD_DISABLE_FILE_VALIDATION="1")
        # kernels import this checkout's workbench (the notebooks run from a tmp copy)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable, "-m", "jupyterlab",
            "--no-browser",
            "--allow-root",  # CI runs as root
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.terminals_enabled=False",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
            "--LanguageServerManager.autodetect=False",
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=self.root, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterlab exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with self._get("/api/status", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"jupyterlab not up in {SERVER_START_S}s: {self.log_tail()}")

    def _get(self, path: str, method: str = "GET", timeout: float = 5):
        req = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        return urllib.request.urlopen(req, timeout=timeout)

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        kernels = []
        try:  # kernels run in their own sessions: note their pids, then shut down cleanly
            import psutil

            kernels = psutil.Process(self.proc.pid).children(recursive=True)
        except Exception:
            pass
        if self.proc.poll() is None:
            try:
                self._get("/api/shutdown", method="POST", timeout=5).close()
                self.proc.wait(20)
            except Exception:
                pass
        _stop_group(self.proc, timeout=10)
        for k in kernels:
            try:
                k.kill()
            except Exception:
                pass
        self._log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = Lab(tmp_path_factory.mktemp("jupyterlab"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(lab):
    exe = find_chromium()
    if exe is None:
        pytest.fail("chromium not found: run `make chromium` (apt-get install chromium)")
    b = Browser(exe, lab.workdir)
    try:
        b.navigate(f"{lab.url}/lab?token={lab.token}")
        b.wait_for(
            "window.jupyterapp ? window.jupyterapp.restored.then(() => true) : false",
            LAB_LOAD_S, "JupyterLab to load",
        )
        yield b
    except CDPError as e:
        raise AssertionError(f"{e}\n--- jupyterlab log ---\n{lab.log_tail()}") from e
    finally:
        (lab.workdir / "console-errors.txt").write_text("\n".join(b.console_errors()))
        b.close()


def _open(browser: Browser, path: str) -> dict:
    """Open ``path`` as a notebook and wait until its panel and cells are in the DOM."""
    browser.evaluate(
        "window.jupyterapp.commands.execute('docmanager:open',"
        f" {{path: {json.dumps(path)}, factory: 'Notebook'}})"
        ".then(w => { window.__wbPanel = w; window.jupyterapp.shell.activateById(w.id);"
        " return true; })",
        timeout=RENDER_S,
    )
    # done when every model cell is in the DOM (windowingMode contentVisibility attaches all of
    # them, progressively), code cells have their editor text and markdown cells are rendered
    probe = f"""(() => {{
        const w = window.__wbPanel;
        if (!w || !w.node.classList.contains('jp-NotebookPanel')) return null;
        if (window.jupyterapp.shell.currentWidget !== w) return null;
        if (w.context.path !== {json.dumps(path)} || !w.context.isReady) return null;
        const cells = w.content.widgets, q = s => w.node.querySelectorAll(s);
        const code = cells.filter(c => c.model.type === 'code');
        const md = cells.filter(c => c.model.type === 'markdown');
        const editors = [...q('.jp-CodeCell .cm-content')].filter(e => e.textContent.trim());
        const h1 = w.node.querySelector(
            '.jp-Cell .jp-MarkdownOutput :is(h1, h2, h3, h4, h5, h6)');
        if (!h1 || !w.node.offsetParent || q('.jp-Notebook .jp-Cell').length !== cells.length
            || editors.length < code.filter(c => c.model.sharedModel.getSource().trim()).length
            || q('.jp-MarkdownCell .jp-MarkdownOutput').length !== md.length) return null;
        return {{cells: cells.length, code_cells: code.length, h1: h1.textContent,
                 dialogs: [...document.querySelectorAll('.jp-Dialog')].map(d => d.innerText)}};
    }})()"""
    return browser.wait_for(probe, RENDER_S, f"{path} to render")


def _check_no_widget_errors(browser: Browser) -> None:
    text = browser.evaluate(  # outputs only: cell sources may quote these texts
        "[...document.querySelectorAll('.jp-OutputArea')].map(e => e.textContent).join('\\n')"
    )
    bad = [e for e in WIDGET_ERRORS if e in text]
    bad += browser.evaluate(
        "[...document.querySelectorAll('.jupyter-widgets-error-widget')].map(e => e.outerHTML"
        ".slice(0, 200))"
    )
    assert not bad, f"widget errors on page: {bad}; console: {browser.console_errors()}"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_renders_in_jupyterlab(lab, browser, nb_path, tmp_path):
    rel = f"notebooks/{nb_path.name}"
    try:
        got = _open(browser, rel)
    except CDPError as e:
        browser.screenshot(tmp_path / "failed.png")
        raise AssertionError(f"{e}\n--- jupyterlab log ---\n{lab.log_tail()}") from e
    browser.screenshot(tmp_path / f"{nb_path.stem}.png")
    # jupytext (server extension) may merge the paired .py, so cell counts come from the model
    assert got["cells"] >= 2 and got["code_cells"] >= 1, got
    assert _first_heading(nb_path) in got["h1"], got
    assert not got["dialogs"], f"unexpected dialog: {got['dialogs']}"
    _check_no_widget_errors(browser)
    # its kernel starts (kernelspec resolves); then stop it to keep the machine quiet
    kernel = browser.evaluate(
        "(async () => { const c = window.__wbPanel.sessionContext; await c.ready;"
        " const name = c.session?.kernel?.name ?? null; await c.shutdown(); return name; })()",
        timeout=KERNEL_S,
    )
    assert kernel, f"{rel}: no kernel started"


def test_ipywidgets_render_through_the_kernel(lab, browser, tmp_path):
    try:
        got = _open(browser, WIDGET_NB)
        assert got["cells"] == 3 and "Widget check" in got["h1"], got
        browser.evaluate(
            "(async () => { const w = window.__wbPanel;"
            " await w.sessionContext.ready; return true; })()",
            timeout=KERNEL_S,
        )
        kernel = """(() => { const k = window.__wbPanel.sessionContext.session?.kernel;
            return k && k.status === 'idle' ? k.name : null; })()"""
        browser.wait_for(kernel, KERNEL_S, "the kernel to be idle")

        def run_cell(i: int) -> None:
            # notebook:run-cell acts on the current notebook's active cell, as Shift+Enter does
            browser.evaluate(
                "(() => { const w = window.__wbPanel, app = window.jupyterapp;"
                " app.shell.activateById(w.id);"
                " if (app.shell.currentWidget !== w) throw new Error('notebook not current');"
                f" w.content.activeCellIndex = {i}; w.content.deselectAll();"
                " return app.commands.execute('notebook:run-cell').then(() => true); })()",
                timeout=KERNEL_S,
            )

        run_cell(1)
        rendered = """(() => {
            const w = window.__wbPanel;
            const out = w.content.widgets[1].node.querySelector('.jp-OutputArea');
            if (!out) return null;
            const box = out.querySelector('.jupyter-widgets.widget-vbox');
            const prog = out.querySelector('.jupyter-widgets.widget-hprogress');
            const slider = out.querySelector('.jupyter-widgets.widget-slider');
            const readout = slider && slider.querySelector('.widget-readout');
            const bar = prog && prog.querySelector('.progress-bar');
            if (!box || !prog || !slider || !readout || !bar) return null;
            return {text: out.innerText, readout: readout.innerText.trim(),
                    bar: bar.style.width || bar.style.height,
                    slider_px: slider.getBoundingClientRect().width};
        })()"""
        first = browser.wait_for(rendered, KERNEL_S, "the widgets to render")
        browser.screenshot(tmp_path / "widgets.png")
        assert "wb-progress" in first["text"] and "wb-slider" in first["text"], first
        assert "widgets-displayed" in first["text"], first
        assert first["readout"] == "3" and first["bar"] == "70%", first
        assert first["slider_px"] > 0, first
        _check_no_widget_errors(browser)

        run_cell(2)  # a kernel-side change must reach the rendered views over the comm
        updated = f"""(() => {{ const r = {rendered};
            return r && r.readout === '9' && r.bar === '100%' ? r : null; }})()"""
        browser.wait_for(updated, KERNEL_S, "the widgets to follow the kernel")
        _check_no_widget_errors(browser)
    except CDPError as e:
        browser.screenshot(tmp_path / "failed.png")
        raise AssertionError(
            f"{e}\nconsole: {browser.console_errors()}\n--- jupyterlab log ---\n{lab.log_tail()}"
        ) from e


NB01 = "notebooks/01_reproduce_corruption.ipynb"
NB01_VIEWS = "notebooks/01_views_through_sglang.ipynb"  # a new path: the render test opened NB01
NB01_S = 900  # the whole notebook on a busy 2-core machine
MONITOR_TICKS = """(() => {
    const p = document.querySelector('.jp-OutputArea .wb-monitor-panel[data-state="live"]');
    if (!p) return null;
    p.scrollIntoView({block: 'center'});  // run-all follows the running cell; show the monitor
    return Number(p.dataset.ticks); })()"""
NB_STATE = """(() => { const w = window.__wbPanel, cells = w.content.widgets;
    const code = cells.filter(c => c.model.type === 'code');
    const err = code.map(c => c.model.outputs.toJSON()).flat()
        .find(o => o.output_type === 'error');
    if (err) return {error: err.ename + ': ' + err.evalue};
    const k = w.sessionContext.session?.kernel;
    const done = code.every(c => c.model.executionCount !== null);
    return {done: done && k && k.status === 'idle', ran: code.filter(
        c => c.model.executionCount !== null).length, of: code.length}; })()"""
PICK_FLAGGED = """(() => {
    const sel = [...document.querySelectorAll('.jp-OutputArea .widget-select select')]
        .find(s => [...s.options].some(o => /^#\\d+\\ss\\d+\\st\\d+/.test(o.text)));
    if (!sel) return null;
    const opt = [...sel.options].find(o => /\\b(leaked|mismatched)\\b/.test(o.text));
    if (!opt) return {options: [...sel.options].map(o => o.text)};
    sel.selectedIndex = opt.index; sel.dispatchEvent(new Event('change', {bubbles: true}));
    return {picked: opt.text}; })()"""
HIGHLIGHT = """(() => {
    const el = document.querySelector('.jp-OutputArea .widget-html .wb-explorer #wb-first-diff');
    if (!el) return null;
    el.scrollIntoView({block: 'center'});
    return {text: el.textContent, cls: el.className, bg: getComputedStyle(el).backgroundColor};
    })()"""


MAP_AND_TIMELINE = [  # appended to the lab's copy: the other views, on notebook 01's own run
    "from workbench import sim\n"
    "from workbench.report.divergence import divergence_map\n"
    "from workbench.report.live import divergence_view, schedule_view\n"
    "from workbench.report.timeline import schedule_timeline\n"
    "caps = {p.name for p in buggy.captures}\n"
    "room = next(r for r in investigate.flagged_requests(buggy)['room'].to_list()\n"
    "            if {f'room-{r}-prefill.safetensors', f'room-{r}-decode.safetensors'} <= caps)\n"
    "divergence_view(divergence_map(buggy, room))",
    "schedule_view(schedule_timeline(sim.run(buggy_patches, 0, sim.Workload(sessions=2,\n"
    "                                                                       max_tokens=16))))",
]
CANVAS = """(() => { const c = [...document.querySelectorAll('.jp-OutputArea canvas')].pop();
    if (!c || !c.width) return null;
    c.scrollIntoView({block: 'center'}); const b = c.getBoundingClientRect();
    c.dispatchEvent(new MouseEvent('click', {clientX: b.left + 2, clientY: b.top + 2,
                                             bubbles: true}));
    return {w: c.width, h: c.height}; })()"""
CLICKED = """(() => { const t = [...document.querySelectorAll('.jp-OutputArea .widget-html')]
    .map(e => e.textContent).find(s => s.includes('max |diff|'));
    return t || null; })()"""
TIMELINE = """(() => { const i = [...document.querySelectorAll('.jp-OutputArea .widget-image')]
    .pop(); if (!i || !i.naturalWidth) return null;
    i.scrollIntoView({block: 'center'}); return {w: i.naturalWidth, h: i.naturalHeight}; })()"""


def _through_sglang(ipynb: Path, out: Path) -> None:
    """Notebook 01 (the lab's copy) with SGLang's Rust router in front of the same servers:
    the reproduction, the views and the report through real SGLang software in one run; then
    a divergence map of one of its flagged rooms and a simulated schedule's timeline."""
    nb = nbformat.read(ipynb, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert 'router = "embedded"' in cell.source
    cell.source = cell.source.replace('router = "embedded"', 'router = "sglang"')
    nb.cells += [nbformat.v4.new_code_cell(src) for src in MAP_AND_TIMELINE]
    import jupytext  # both sides of the jupytext pair, or JupyterLab refuses the newer one

    nbformat.write(nb, out)
    jupytext.write(nb, out.with_suffix(".py"), fmt="py:percent")


def _map_and_timeline(browser: Browser, shots: Path) -> None:
    """The divergence map renders as a canvas whose clicked cell shows its values, and the
    schedule timeline as an image (screenshots of both)."""
    grid = browser.wait_for(CANVAS, RENDER_S, "the divergence map's canvas")
    values = browser.wait_for(CLICKED, RENDER_S, "the clicked cell's values")
    print("map screenshot", browser.screenshot(shots / "divergence-map.png"), grid, values)
    timeline = browser.wait_for(TIMELINE, RENDER_S, "the schedule timeline's image")
    print("timeline screenshot", browser.screenshot(shots / "timeline.png"), timeline)
    assert grid["w"] > 0 and timeline["w"] > 0 and "max |diff|" in values


def _run_notebook_01(browser: Browser, shots: Path) -> list[int]:
    """Runs every cell; returns the monitor tick counts seen live (a screenshot at each)."""
    browser.evaluate(  # the render test may have shut this notebook's kernel down: start one
        "(async () => { const c = window.__wbPanel.sessionContext; await c.ready;"
        " if (!c.session?.kernel) await c.changeKernel({name: 'python3'});"
        " await c.ready; return c.session.kernel.name; })()", timeout=KERNEL_S)
    browser.evaluate("(() => { const app = window.jupyterapp;"
                     " app.shell.activateById(window.__wbPanel.id);"
                     " app.commands.execute('notebook:run-all-cells'); return true; })()")
    ticks: list[int] = []
    deadline = time.monotonic() + NB01_S
    while time.monotonic() < deadline:
        seen = browser.evaluate(MONITOR_TICKS)
        if seen is not None and (not ticks or seen != ticks[-1]):
            ticks.append(seen)
            print("monitor screenshot", browser.screenshot(shots / f"monitor-{len(ticks)}.png"))
        state = browser.evaluate(NB_STATE)
        assert "error" not in state, f"notebook 01 failed: {state['error']}"
        if state["done"]:
            return ticks
        time.sleep(0.5)
    raise AssertionError(f"notebook 01 not done in {NB01_S}s: {browser.evaluate(NB_STATE)}")


@pytest.mark.notebook
@pytest.mark.servers
@pytest.mark.nixl
@pytest.mark.sglang
@pytest.mark.timeout(NB01_S + 300)
def test_notebook_01_views_in_jupyterlab_and_its_report(lab, browser, tmp_path):
    from support.glyphs import marker_shape
    from test_notebooks import FINDINGS, RENDERED

    from workbench.judge import read_findings
    from workbench.report import export_html

    _through_sglang(lab.root / NB01, lab.root / NB01_VIEWS)
    try:
        _open(browser, NB01_VIEWS)
        ticks = _run_notebook_01(browser, tmp_path)
        assert len(ticks) >= 5, f"the monitor updated {ticks} while the load ran"
        picked = browser.wait_for(PICK_FLAGGED, RENDER_S, "the explorer's request list")
        assert "picked" in picked, f"no flagged request with a first difference: {picked}"
        hit = browser.wait_for(HIGHLIGHT, RENDER_S, "the highlighted first differing token")
        time.sleep(1.0)  # let the notebook's scroller settle on the highlight (a picture only)
        print("explorer screenshot", browser.screenshot(tmp_path / "explorer.png"), picked, hit)
        assert "wb-first-diff" in hit["cls"] and hit["text"], hit
        _map_and_timeline(browser, tmp_path)
        browser.evaluate("window.jupyterapp.commands.execute('docmanager:save').then(() => 1)",
                         timeout=RENDER_S)
    except CDPError as e:
        browser.screenshot(tmp_path / "failed.png")
        raise AssertionError(f"{e}\nconsole: {browser.console_errors()}\n"
                             f"--- jupyterlab log ---\n{lab.log_tail()}") from e
    name = "01_reproduce_corruption.py"
    ledger = read_findings(lab.root / "notebooks" / "runs" / "findings.jsonl")
    assert ledger.height == FINDINGS[name] and ledger["held"].all(), ledger
    assert all(json.loads(r)["router"] == "sglang" for r in ledger["replay"].to_list())
    html = export_html(lab.root / NB01_VIEWS, tmp_path / "01.html")
    text = html.read_text()
    assert RENDERED[name] in text and "Traceback" not in text
    assert 'data-state="stopped"' in text and 'alt="pair monitor"' in text  # static monitor
    assert 'id="wb-first-diff"' in text  # the explorer's static rendering
    shape, rect = marker_shape(browser, html, tmp_path / "marker.png")
    print("marker screenshot", tmp_path / "marker.png", rect, shape)
    assert shape.is_bar and not shape.is_box, (shape, rect)
