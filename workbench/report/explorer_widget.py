"""The explorer's live ipywidgets: filters, the request list, the detail pane, replay."""

from __future__ import annotations

import html
import logging

from workbench.report.explorer import VERDICTS, ExplorerFilter, options, worst_first
from workbench.report.explorer_html import CSS, detail_html
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
    import ipywidgets as w

    rows = ex.rows
    verdict = _dropdown(w, "verdict", ["flagged", *[v for v in VERDICTS if v in
                                                    options(rows, "verdict")]])
    verdict.value = "flagged" if "flagged" in verdict.options else ANY
    session = _dropdown(w, "session", options(rows, "session"))
    shape = _dropdown(w, "shape", [s for s in options(rows, "shape") if s])
    finish = _dropdown(w, "finish", options(rows, "finish_reason"))
    pick = w.Select(options=[], rows=8, description="request",
                    layout=w.Layout(width="95%"))
    pane = w.HTML(layout=w.Layout(width="100%"))
    button = w.Button(description="replay alone", icon="play",
                      disabled=ex.target is None)
    outcome = w.HTML()

    def refilter(_=None) -> None:
        flt = ExplorerFilter(_value(verdict), _value(session, int), _value(shape),
                             _value(finish))
        df = worst_first(ex.filter(flt))  # leaks and mismatches first
        pick.options = [(f"#{r['request']} s{r['session']} t{r['turn']} {r['kind']} "
                         f"{r['verdict']} ({r['finish_reason']})", r["request"])
                        for r in df.iter_rows(named=True)]

    def show(_=None) -> None:
        outcome.value = ""
        if pick.value is None:
            pane.value = "<i>no request chosen</i>"
            return
        pane.value = (font_face_css() + CSS + '<div class="wb-view wb-explorer">'
                      + detail_html(ex.detail(pick.value)) + "</div>")

    def replay(_=None) -> None:
        if pick.value is None:
            return
        button.disabled, outcome.value = True, "replaying alone..."
        try:
            outcome.value = f"<b>{html.escape(ex.replay(pick.value).describe())}</b>"
        except Exception as exc:  # noqa: BLE001 - shown in the view, the kernel goes on
            log.warning("replay failed: %s", exc)
            outcome.value = f"<b>replay failed:</b> {html.escape(str(exc)[:300])}"
        finally:
            button.disabled = False

    for dd in (verdict, session, shape, finish):
        dd.observe(refilter, names="value")
    pick.observe(show, names="value")
    button.on_click(replay)
    refilter()
    show()
    return w.VBox([w.HBox([verdict, session, shape, finish]), pick, pane,
                   w.HBox([button, outcome])], layout=w.Layout(width="100%"))
