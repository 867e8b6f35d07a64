"""The explorer's live ipywidgets: filters, the request list, the detail pane, replay."""

from __future__ import annotations

import html
import logging

from workbench.report.explorer.html import CSS, detail_html
from workbench.report.explorer.table import VERDICTS, ExplorerFilter, options, worst_first
from workbench.report.fonts import font_face_css

log = logging.getLogger(__name__)
ANY = "any"


def _dropdown(w, label: str, values) -> object:
    return w.Dropdown(options=[ANY, *[str(v) for v in values]], value=ANY, description=label,
                      layout=w.Layout(width="220px"))


def _value(dd, cast=str):
    return None if dd.value == ANY else cast(dd.value)


def build(ex):
    """A VBox driving ``ex`` (an ``Explorer``): choosing a request shows its detail."""
    return ExplorerWidget(ex).box


class ExplorerWidget:
    """Filters, the request list (worst first), the detail pane and the replay button of one
    ``Explorer``; ``box`` is what a notebook shows. A failed replay is shown, never raised."""

    def __init__(self, ex) -> None:
        import ipywidgets as w

        self.ex, rows = ex, ex.rows
        verdicts = ["flagged", *[v for v in VERDICTS if v in options(rows, "verdict")]]
        self.verdict = _dropdown(w, "verdict", verdicts)
        self.verdict.value = "flagged" if "flagged" in self.verdict.options else ANY
        self.session = _dropdown(w, "session", options(rows, "session"))
        self.shape = _dropdown(w, "shape", [s for s in options(rows, "shape") if s])
        self.finish = _dropdown(w, "finish", options(rows, "finish_reason"))
        self.pick = w.Select(options=[], rows=8, description="request",
                             layout=w.Layout(width="95%"))
        self.pane, self.outcome = w.HTML(layout=w.Layout(width="100%")), w.HTML()
        self.button = w.Button(description="replay alone", icon="play",
                               disabled=ex.target is None)
        self._wire()
        self.box = w.VBox([w.HBox([self.verdict, self.session, self.shape, self.finish]),
                           self.pick, self.pane, w.HBox([self.button, self.outcome])],
                          layout=w.Layout(width="100%"))

    def _wire(self) -> None:
        for dd in (self.verdict, self.session, self.shape, self.finish):
            dd.observe(self.refilter, names="value")
        self.pick.observe(self.show, names="value")
        self.button.on_click(self.replay)
        self.refilter()
        self.show()

    def refilter(self, _=None) -> None:
        flt = ExplorerFilter(_value(self.verdict), _value(self.session, int),
                             _value(self.shape), _value(self.finish))
        df = worst_first(self.ex.filter(flt))  # leaks and mismatches first
        self.pick.options = [(f"#{r['request']} s{r['session']} t{r['turn']} {r['kind']} "
                              f"{r['verdict']} ({r['finish_reason']})", r["request"])
                             for r in df.iter_rows(named=True)]

    def show(self, _=None) -> None:
        self.outcome.value = ""
        if self.pick.value is None:
            self.pane.value = "<i>no request chosen</i>"
            return
        self.pane.value = (font_face_css() + CSS + '<div class="wb-view wb-explorer">'
                           + detail_html(self.ex.detail(self.pick.value)) + "</div>")

    def replay(self, _=None) -> None:
        if self.pick.value is None:
            return
        self.button.disabled, self.outcome.value = True, "replaying alone..."
        try:
            got = self.ex.replay(self.pick.value).describe()
            self.outcome.value = f"<b>{html.escape(got)}</b>"
        except Exception as exc:  # noqa: BLE001 - shown in the view, the kernel goes on
            log.warning("replay failed: %s", exc)
            self.outcome.value = f"<b>replay failed:</b> {html.escape(str(exc)[:300])}"
        finally:
            self.button.disabled = False
