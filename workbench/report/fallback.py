"""Live views that export as their static figure.

A ``LiveView`` is displayed with two renderings in one output: the ipywidgets view (what a live
JupyterLab renders) and the static matplotlib figure as a PNG (what nbconvert renders: without a
saved widget state it skips the widget view, and ``run_report`` ranks images above widget views
anyway, so a shared report shows the picture the investigator saw, with no kernel behind it).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable

import matplotlib.pyplot as plt

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def png_of(fig) -> str:
    """``fig`` as base64 PNG text (the figure is closed: it lives on only as the image)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


class LiveView:
    """An ipywidgets ``widget`` displayed with the PNG of ``static()`` in the same bundle.

    Invariant: every display carries both renderings; ``summary`` is the plain-text one."""

    def __init__(self, widget, static: Callable[[], object], summary: str) -> None:
        self.widget, self.static, self.summary = widget, static, summary

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        bundle["image/png"] = png_of(self.static())
        bundle["text/plain"] = self.summary
        return bundle


def static_first(priority: list[str]) -> list[str]:
    """A display priority with the widget view moved after every image (just before plain
    text): an export shows a ``LiveView``'s static figure, and a widget with nothing else."""
    rest = [m for m in priority if m != WIDGET_VIEW]
    cut = rest.index("text/plain") if "text/plain" in rest else len(rest)
    return [*rest[:cut], WIDGET_VIEW, *rest[cut:]]
