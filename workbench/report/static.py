"""Static renderings: what a view shows when no kernel is live (nbconvert, a shared report).

Every view is a ``View``: ``_repr_mimebundle_`` carries its live ipywidget (when in a notebook
frontend) and a static ``text/html`` of what it shows now. ``export_html(ipynb)`` writes a
notebook to HTML the way a report is shared: outputs holding both a widget view and a static
rendering keep the static one (no widget state is saved, so a widget view would show nothing),
and the page carries the embedded DSML font (``workbench.report.fonts``).
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from workbench.report.fonts import embed_fonts, font_face_css

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def figure_png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def png_img(data: bytes, alt: str) -> str:
    """An ``<img>`` carrying ``data`` inline (a report needs no files beside it)."""
    b64 = base64.b64encode(data).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}"/>'


def wrap(body: str, kind: str) -> str:
    """A view's static HTML: its body in a ``wb-view`` box, with the embedded font."""
    return f'{font_face_css()}<div class="wb-view wb-{kind}">{body}</div>'


class View:
    """A view object: ``static_html()`` (what it shows now) and, in a notebook frontend, a
    widget (``widget()``; None outside Jupyter). Displaying it gives both."""

    kind = "view"

    def static_html(self) -> str:
        raise NotImplementedError

    def widget(self):
        return None

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = {"text/html": self.static_html(), "text/plain": repr(self)}
        w = self.widget()
        if w is not None:
            bundle[WIDGET_VIEW] = {"version_major": 2, "version_minor": 0, "model_id": w.model_id}
        return bundle


def static_notebook(nb):
    """``nb`` (nbformat) with every output holding a static rendering stripped of its widget
    view, so an exporter with no widget state shows the static picture."""
    for cell in nb.cells:
        for out in cell.get("outputs", ()):
            data = out.get("data", {})
            if WIDGET_VIEW in data and ("text/html" in data or "image/png" in data):
                del data[WIDGET_VIEW]
    return nb


def export_html(ipynb: str | Path, html_path: str | Path | None = None) -> Path:
    """Writes the saved notebook ``ipynb`` as a shareable HTML report (static views, embedded
    font); returns its path (default: beside it, ``.html``)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = static_notebook(nbformat.read(str(ipynb), as_version=4))
    body, _ = HTMLExporter().from_notebook_node(nb)
    out = Path(html_path) if html_path else Path(ipynb).with_suffix(".html")
    out.write_text(embed_fonts(body))
    return out
