"""Live views that export as their static figure.

A ``LiveView`` is displayed with two renderings in one output: the ipywidgets view (what a live
JupyterLab renders) and the static matplotlib figure as a PNG (what nbconvert renders: without a
saved widget state it skips the widget view, and ``export_html`` drops a widget view with a
static rendering beside it: a shared report shows the picture the investigator saw, no kernel).
"""

from __future__ import annotations

import base64
from collections.abc import Callable

from workbench.report.static import figure_png


def png_of(fig) -> str:
    """``fig`` as base64 PNG text (the figure is closed: it lives on only as the image)."""
    return base64.b64encode(figure_png(fig)).decode("ascii")


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
