"""The flagged-request explorer: ``explore(result)`` in a notebook.

Live (JupyterLab): filters (verdict, session, shape, finish reason), the matching requests, and
for the one chosen the conversation, the response and the reference side by side (the first
differing token highlighted, DSML markup verbatim in the embedded font), the per-token logprob
drift as a small plot, and a button replaying that exact request alone. Static (nbconvert, a
shared report): the table and the detail of the first flagged requests, as HTML.
"""

from __future__ import annotations

import html
import logging

import polars as pl

from workbench.drive.replay import Replay, ReplayTarget, replay_alone
from workbench.report.explorer.html import CSS, STATIC_DETAILS, detail_html, table_html
from workbench.report.explorer.table import (
    VERDICTS,
    Detail,
    ExplorerFilter,
    detail,
    filter_requests,
    requests_table,
    worst_first,
)
from workbench.report.static import View, wrap

log = logging.getLogger(__name__)


class Explorer(View):
    """``explore(result)``'s object; ``rows`` is ``requests_table(result)``. ``replay(i)``
    replays request ``i`` alone on ``target`` (see ``workbench.drive.replay``)."""

    kind = "explorer"

    def __init__(self, result, target: ReplayTarget | None = None) -> None:
        self.rows = requests_table(result)
        self.target = target
        self._widget = None

    def __repr__(self) -> str:
        flagged = int((self.rows["verdict"] != "clean").sum()) if len(self.rows) else 0
        return f"Explorer({len(self.rows)} requests, {flagged} flagged)"

    def row(self, request: int) -> dict:
        hit = self.rows.filter(pl.col("request") == request)
        if not len(hit):
            raise KeyError(f"no request #{request} (0..{len(self.rows) - 1})")
        return hit.row(0, named=True)

    def detail(self, request: int) -> Detail:
        return detail(self.row(request))

    def filter(self, flt: ExplorerFilter) -> pl.DataFrame:
        return filter_requests(self.rows, flt)

    def replay(self, request: int) -> Replay:
        if self.target is None:
            raise ValueError("no replay target: explore(result, target=pair or launch spec)")
        return replay_alone(self.row(request), self.target)

    def static_html(self) -> str:
        flagged = worst_first(filter_requests(self.rows, ExplorerFilter(verdict="flagged")))
        shown = [detail_html(self.detail(r)) for r in flagged["request"][:STATIC_DETAILS]]
        return wrap(CSS + f"<h3>{html.escape(repr(self))}</h3>" + table_html(flagged)
                    + "".join(shown), self.kind)

    def widget(self):
        from workbench.scale import in_notebook

        if self._widget is None and in_notebook():
            from workbench.report.explorer.widget import build

            self._widget = build(self)
        return self._widget


def explore(result, target: ReplayTarget | None = None) -> Explorer:
    """The explorer over ``result``'s judged requests (a ``Reproduction``, ``LoadResult``, a list
    of them, or a requests frame). ``target``: where "replay" sends a request (a live ``PDPair``,
    a URL, or a ``LaunchSpec``-like dict to launch a fresh pair per replay; default for a
    ``Reproduction``: its own patches, engine and faults)."""
    if target is None and hasattr(result, "patches") and hasattr(result, "engine"):
        target = {"patches": list(result.patches), "engine": dict(result.engine),
                  "faults": dict(getattr(result, "faults", {}))}
    return Explorer(result, target)


__all__ = ["VERDICTS", "Explorer", "explore"]
