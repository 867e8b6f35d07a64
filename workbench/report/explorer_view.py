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

from workbench.report.explorer import (
    VERDICTS,
    Detail,
    ExplorerFilter,
    Mark,
    detail,
    filter_requests,
    requests_table,
)
from workbench.report.replay import Replay, ReplayTarget, replay_alone
from workbench.report.static import View, figure_png, png_img, wrap

log = logging.getLogger(__name__)
TABLE_COLUMNS = ("request", "variant", "seed", "session", "turn", "kind", "verdict",
                 "finish_reason", "v_first_diff")
STATIC_DETAILS = 3  # flagged requests whose detail a static rendering carries
CSS = """<style>
.wb-explorer .wb-tok { white-space: pre-wrap; word-break: break-all; }
.wb-explorer .wb-special { color: #0b5cad; }
.wb-explorer .wb-first-diff { background: #ffd400; outline: 2px solid #d40000; }
.wb-explorer .wb-after { color: #a33; }
.wb-explorer .wb-side { display: flex; gap: 12px; }
.wb-explorer .wb-side > div { flex: 1; border: 1px solid #ccc; padding: 4px; min-width: 0; }
.wb-explorer .wb-msg { border-left: 3px solid #999; margin: 2px 0; padding-left: 4px;
  white-space: pre-wrap; word-break: break-all; }
.wb-explorer table { border-collapse: collapse; font-size: 12px; }
.wb-explorer td, .wb-explorer th { border: 1px solid #ddd; padding: 1px 4px; }
</style>"""


def tokens_html(toks) -> str:
    """Tokens verbatim (escaped), specials and the first differing token marked by class."""
    out = []
    for t in toks:
        cls = ["wb-tok"] + (["wb-special"] if t.special else [])
        if t.mark is not Mark.SAME:
            cls.append(f"wb-{t.mark.value}")
        extra = ' id="wb-first-diff"' if t.mark is Mark.FIRST_DIFF else ""
        out.append(f'<span class="{" ".join(cls)}"{extra}>{html.escape(t.text)}</span>')
    return "".join(out)


def drift_png(d: Detail) -> bytes | None:
    """|server - reference| logprob per agreeing position (None: no logprobs to compare)."""
    if not d.drift:
        return None
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 1.4))
    ax.plot([p.position for p in d.drift], [p.drift for p in d.drift], marker=".", lw=0.8)
    if d.first_diff is not None:
        ax.axvline(d.first_diff, color="#d40000", ls="--", lw=0.8, label="first diff")
        ax.legend(fontsize=7)
    ax.set_xlabel("token position", fontsize=7)
    ax.set_ylabel("|Δ logprob|", fontsize=7)
    ax.tick_params(labelsize=7)
    return figure_png(fig)


def _messages_html(messages) -> str:
    rows = []
    for m in messages:
        body = m.get("content") or ""
        if m.get("tool_calls"):
            body += " ".join(f"{c['function']['name']}({c['function']['arguments']})"
                             for c in m["tool_calls"])
        rows.append(f'<div class="wb-msg"><b>{html.escape(m.get("role", ""))}</b>: '
                    f"{html.escape(body)}</div>")
    return "".join(rows)


def detail_html(d: Detail) -> str:
    """One request: conversation, response | reference, drift plot."""
    ref = tokens_html(d.reference) if d.reference is not None else "<i>no reference</i>"
    png = drift_png(d)
    where = ("identical to the reference" if d.first_diff is None
             else f"first differing token at position {d.first_diff}")
    return (f"<h4>{html.escape(d.title)}</h4><p>{where}</p>"
            f"<details><summary>conversation ({len(d.messages)} messages)</summary>"
            f"{_messages_html(d.messages)}</details>"
            f'<div class="wb-side"><div><b>response</b><br>{tokens_html(d.response)}</div>'
            f"<div><b>reference</b><br>{ref}</div></div>"
            + (png_img(png, "logprob drift") if png else "<p>no logprobs to compare</p>"))


def table_html(df: pl.DataFrame, limit: int = 40) -> str:
    cols = [c for c in TABLE_COLUMNS if c in df.columns]
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in cols) + "</tr>"
                   for r in df.head(limit).iter_rows(named=True))
    more = f"<p>{len(df) - limit} more</p>" if len(df) > limit else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def worst_first(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` ordered by verdict as ``VERDICTS`` ranks them (leaks first), then by request."""
    rank = pl.col("verdict").replace_strict(VERDICTS, list(range(len(VERDICTS))), default=99)
    return df.sort(rank, pl.col("request"))


class Explorer(View):
    """``explore(result)``'s object; ``rows`` is ``requests_table(result)``. ``replay(i)``
    replays request ``i`` alone on ``target`` (see ``workbench.report.replay``)."""

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
        from workbench.drive.progress import in_notebook

        if self._widget is None and in_notebook():
            from workbench.report.explorer_widget import build

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
