"""A clickable heatmap widget (anywidget): a canvas of coloured cells that reports the clicked
(layer, position) back to Python, for the live divergence map.

The colours are computed in Python (``panel_colours``), so the front end only paints rectangles
and turns a click into ``selected = [row, start + column]``; everything that decides what a cell
means stays in Python, where it is tested.
"""

from __future__ import annotations

import anywidget
import matplotlib.colors as mcolors
import numpy as np
import traitlets
from matplotlib import colormaps

from workbench.report.divergence import Panel

BAD = "#00ff00"  # a cell beyond rtol, whatever its size
FLOOR = -12.0  # log10 |diff| drawn as the colour scale's bottom (exact equality)

_ESM = """
function render({ model, el }) {
  const canvas = document.createElement("canvas");
  canvas.style.cursor = "crosshair";
  canvas.style.maxWidth = "100%";
  el.appendChild(canvas);
  const size = () => {
    const colours = model.get("colours");
    const cols = colours.length ? colours[0].length : 0;
    return [Math.max(2, Math.min(14, Math.floor(760 / Math.max(cols, 1)))), 22];
  };
  const line = (ctx, x0, y0, x1, y1) => {
    ctx.beginPath(); ctx.moveTo(x0, y0); ctx.lineTo(x1, y1); ctx.stroke();
  };
  const draw = () => {
    const colours = model.get("colours"), start = model.get("start");
    const rows = colours.length, cols = rows ? colours[0].length : 0;
    const [cw, ch] = size();
    canvas.width = cols * cw; canvas.height = rows * ch;
    const ctx = canvas.getContext("2d");
    colours.forEach((row, r) => row.forEach((c, p) => {
      ctx.fillStyle = c; ctx.fillRect(p * cw, r * ch, cw, ch);
    }));
    ctx.strokeStyle = "deepskyblue"; ctx.setLineDash([4, 3]);
    const cached = model.get("cached") - start;
    if (cached > 0 && cached < cols) line(ctx, cached * cw, 0, cached * cw, rows * ch);
    ctx.setLineDash([]); ctx.strokeStyle = "#999";
    for (const b of model.get("pages")) {
      const x = (b - start) * cw;
      if (x > 0 && x < cols * cw) line(ctx, x, rows * ch - 5, x, rows * ch);
    }
    const [layer, pos] = model.get("selected");
    ctx.strokeStyle = "cyan"; ctx.lineWidth = 2;
    ctx.strokeRect((pos - start) * cw, layer * ch, cw, ch); ctx.lineWidth = 1;
  };
  canvas.addEventListener("click", (e) => {
    const box = canvas.getBoundingClientRect(), [cw, ch] = size();
    const x = (e.clientX - box.left) * canvas.width / box.width;
    const y = (e.clientY - box.top) * canvas.height / box.height;
    model.set("selected", [Math.floor(y / ch), model.get("start") + Math.floor(x / cw)]);
    model.save_changes();
  });
  model.on("change", draw);
  draw();
}
export default { render };
"""


class CellGrid(anywidget.AnyWidget):
    """``colours[layer][p - start]`` painted as a grid; a click sets ``selected`` to
    ``[layer, position]`` (positions counted from ``start``); the cached prefix's edge
    (``cached``) dashed and page boundaries (``pages``) ticked."""

    _esm = _ESM
    colours = traitlets.List(traitlets.List(traitlets.Unicode())).tag(sync=True)
    start = traitlets.Int(0).tag(sync=True)
    cached = traitlets.Int(0).tag(sync=True)
    pages = traitlets.List(traitlets.Int()).tag(sync=True)
    selected = traitlets.List(traitlets.Int(), [0, 0], minlen=2, maxlen=2).tag(sync=True)


def panel_colours(panel: Panel, peak: float) -> list[list[str]]:
    """The colour of every cell of ``panel``: log10 max |diff| on magma from ``FLOOR`` to the
    map's ``peak``, cells beyond rtol in ``BAD``."""
    top = np.log10(max(peak, 10 ** FLOOR)) if peak > 0 else 0.0
    scale = (np.log10(np.maximum(panel.grid, 10 ** FLOOR)) - FLOOR) / max(top - FLOOR, 1e-9)
    rgba = colormaps["magma"](np.clip(scale, 0.0, 1.0))
    return [[BAD if bad else mcolors.to_hex(c) for c, bad in zip(row, bad_row, strict=True)]
            for row, bad_row in zip(rgba, panel.bad, strict=True)]
