"""How the pair monitor's ``Panel`` is drawn: an HTML table per role (live and static) and a
matplotlib figure of the series (static)."""

from __future__ import annotations

import html

from workbench.report.monitor.data import Panel, RoleSeries
from workbench.report.static import figure_png


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))


def _role_rows(role: str, s: RoleSeries) -> str:
    last = s.latest
    queues = ", ".join(f"{k} {v}" for k, v in sorted(last.queues.items())) or "-"
    rooms = ", ".join(f"{k.lower()} {v}" for k, v in sorted(last.rooms.items())) or "-"
    cells = [role, queues, rooms, _fmt(last.pages_free), _fmt(last.pages_cached),
             _fmt(last.pages_quarantined), _fmt(last.kv_usage), _fmt(last.tokens_per_s)]
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


HEADER = ("role", "queue depths", "rooms by state", "pages free", "cached", "quarantined",
          "KV usage", "tokens/s")


def panel_html(p: Panel, live: bool) -> str:
    """The latest values per role; ``data-ticks`` carries the number of samples drawn."""
    state = "live" if live else "stopped"
    head = "".join(f"<th>{h}</th>" for h in HEADER)
    rows = "".join(_role_rows(role, s) for role, s in sorted(p.roles.items()))
    return (f'<div class="wb-monitor-panel" data-ticks="{p.ticks}" data-state="{state}">'
            f"<b>pair monitor ({state})</b>: {p.ticks} samples, "
            f'<span class="wb-flagged">{p.flagged} flagged so far</span>'
            f'<table style="border-collapse:collapse;font-size:12px"><tr>{head}</tr>{rows}'
            "</table></div>")


def panel_png(p: Panel) -> bytes:
    """Per role: queue depths, pages and tokens/s over time."""
    import matplotlib.pyplot as plt

    roles = sorted(p.roles)
    fig, axes = plt.subplots(len(roles), 3, figsize=(11, 2.2 * len(roles)), squeeze=False)
    for row, role in zip(axes, roles, strict=True):
        s = p.roles[role]
        for q, ys in s.queues.items():
            row[0].step(s.t_s, ys, where="post", label=q)
        for k, ys in s.pages.items():
            if any(y is not None for y in ys):
                row[1].plot(s.t_s, [float("nan") if y is None else y for y in ys], label=k)
        row[2].plot(s.t_s, [float("nan") if y is None else y for y in s.tokens_per_s])
        for ax, title in zip(row, ("queue depths", "pages", "tokens/s"), strict=True):
            ax.set_title(f"{role}: {title}", fontsize=8)
            ax.tick_params(labelsize=7)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
    axes[-1][1].set_xlabel(f"seconds ({p.flagged} requests flagged)", fontsize=8)
    fig.tight_layout()
    return figure_png(fig)
