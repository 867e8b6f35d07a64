"""How the explorer draws a request and a table, as HTML (live pane and static report alike)."""

from __future__ import annotations

import html

import polars as pl

from workbench.report.explorer.table import Detail, Mark
from workbench.report.static import figure_png, png_img

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
