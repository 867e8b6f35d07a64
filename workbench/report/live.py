"""Live views of divergence maps, schedules and running bisections, for notebook cells.

Each view is displayed with its static figure in the same output (``fallback.LiveView``), so an
exported report shows the picture without a kernel. A divergence map's panel is a clickable grid
(``heatgrid.CellGrid``); a cell is picked by clicking it, from the list of bad cells or by layer
and position, and both sides' values are shown beside it.
"""

from __future__ import annotations

import logging
import time

import ipywidgets as w

from workbench.report.divergence import (
    Cell,
    DivergenceMap,
    Panel,
    plot_divergence_map,
)
from workbench.report.fallback import LiveView, png_of
from workbench.report.heatgrid import CellGrid, panel_colours
from workbench.report.static import figure_png
from workbench.report.timeline import (
    BisectionLive,
    ScheduleTimeline,
    bisection_timeline,
    plot_bisection_timeline,
    plot_schedule_timeline,
)

log = logging.getLogger(__name__)
MAX_LISTED = 200  # bad cells listed per panel (the map still draws them all)


class DivergenceView(LiveView):
    """A divergence map's panels, one at a time, as a clickable grid. Invariant: ``values.value``
    describes ``self.cell``, and the grid's ``selected`` is that cell."""

    def __init__(self, m: DivergenceMap) -> None:
        self.map = m
        self.panel = w.Dropdown(description="panel", options=[
            (f"{p.stage.name.lower()}: {p.buffer}", i) for i, p in enumerate(m.panels)])
        self.cells = w.Select(description="bad cells", rows=8)
        self.layer = w.BoundedIntText(description="layer", min=0)
        self.position = w.BoundedIntText(description="position", min=0)
        self.grid, self.values = CellGrid(cached=m.num_cached, pages=list(m.page_boundaries)), \
            w.HTML()
        self._peak = max(float(p.grid.max()) for p in m.panels)
        self.caption = w.HTML()
        start = m.first or Cell(m.panels[0].stage, 0, m.panels[0].start, m.panels[0].buffer)
        self.cell = start
        self._busy = False
        self.select(start)
        self.panel.observe(lambda _: self._panel_changed(), "value")
        self.cells.observe(lambda ch: ch["new"] and self.select(ch["new"]), "value")
        for box in (self.layer, self.position):
            box.observe(lambda _: self._picked(self.layer.value, self.position.value), "value")
        self.grid.observe(lambda ch: self._picked(*ch["new"]), "selected")
        picker = w.HBox([w.VBox([self.panel, self.layer, self.position]), self.cells])
        super().__init__(w.VBox([w.HTML(f"<b>{m.describe()}</b>"), picker, self.caption,
                                 self.grid, self.values]), lambda: plot_divergence_map(m),
                         m.describe())

    def select(self, cell: Cell) -> None:
        """Shows ``cell``: its panel, the boxes, the circled map and both sides' values."""
        if self._busy:
            return
        self._busy = True
        try:
            p = self.map.panel(cell.stage, cell.buffer)
            values = self.map.values(cell)  # raises before anything changes for a bad cell
            if (p.stage, p.buffer) != (self.cell.stage, self.cell.buffer) or not \
                    self.grid.colours:
                self.panel.value = self.map.panels.index(p)
                self._fill(p)
                self.grid.colours, self.grid.start = panel_colours(p, self._peak), p.start
                self.caption.value = _caption(p)
            self.layer.max = p.grid.shape[0] - 1
            self.position.min = 0  # widen first: min may never pass max on the way
            self.position.max = p.positions.stop - 1
            self.position.min = p.start
            self.layer.value, self.position.value = cell.layer, cell.position
            self.grid.selected = [cell.layer, cell.position]
            self.cell = cell
            self.values.value = f"<pre>{values.describe()}</pre>"
        finally:
            self._busy = False

    def _fill(self, p: Panel) -> None:
        bad = p.cells()[:MAX_LISTED]
        self.cells.options = [(f"layer {c.layer} position {c.position} "
                               f"({p.grid[c.layer, c.position - p.start]:.3g})", c) for c in bad]
        self.cells.value = None

    def _panel_changed(self) -> None:
        p = self.map.panels[self.panel.value]
        cells = p.cells()
        self.select(cells[0] if cells else Cell(p.stage, 0, p.start, p.buffer))

    def _picked(self, layer: int, position: int) -> None:
        """A cell of the shown panel was clicked or typed (outside the panel: ignored)."""
        p = self.map.panels[self.panel.value]
        if 0 <= layer < p.grid.shape[0] and position in p.positions:
            self.select(Cell(p.stage, layer, position, p.buffer))


def _caption(p: Panel) -> str:
    return (f"<small>{p.stage.name.lower()} {p.buffer}: rows are layers 0..{p.grid.shape[0] - 1}"
            f", columns positions {p.start}..{p.positions.stop - 1}; green: beyond rtol; dashed:"
            " the cached prefix's end; ticks: page boundaries. Click a cell.</small>")


def divergence_view(m: DivergenceMap) -> DivergenceView:
    """The live view of ``m`` (displays as the map and a cell picker; exports as the map)."""
    if not m.panels:
        raise ValueError(f"room {m.room}: nothing was compared, no map to show")
    return DivergenceView(m)


class ScheduleView(LiveView):
    """A schedule timeline with a window over decisions and a jump list of its context
    switches. Invariant: the drawn window is ``self.window.value``."""

    def __init__(self, t: ScheduleTimeline, width: int = 400) -> None:
        self.timeline, self.width = t, width
        self.window = w.IntRangeSlider(description="decisions", min=0, max=max(t.decisions, 1),
                                       value=(0, min(width, t.decisions) or 1),
                                       layout=w.Layout(width="90%"))
        self.switches = w.Dropdown(description="switch", options=[("-", None)] + [
            (f"step {s.step}: {s.preempted} -> {s.runs} at {s.label}", s) for s in t.switches])
        self.image = w.Image(format="png")
        self.window.observe(lambda _: self._draw(), "value")
        self.switches.observe(lambda ch: ch["new"] and self.jump(ch["new"].step), "value")
        if t.switches:
            self.jump(t.switches[0].step)
        self._draw()
        super().__init__(w.VBox([self.window, self.switches, self.image]),
                         lambda: plot_schedule_timeline(t), t.title)

    def jump(self, step: int) -> None:
        """Centres the window on decision ``step``."""
        lo = max(0, min(step - self.width // 2, self.timeline.decisions - self.width))
        self.window.value = (lo, min(lo + self.width, self.timeline.decisions))

    def _draw(self) -> None:
        lo, hi = self.window.value
        self.image.value = figure_png(plot_schedule_timeline(self.timeline, lo, max(hi, lo + 1)))


def schedule_view(t: ScheduleTimeline, width: int = 400) -> ScheduleView:
    """The live view of ``t`` (exports as the whole schedule's static figure)."""
    return ScheduleView(t, width)


class LiveBisection(BisectionLive):
    """A ``BisectionLive`` that redraws its figure in place in the notebook output after each
    trial (at most one redraw per ``every_s`` seconds, the last always) and, on ``finish``,
    leaves the finished bisection's static figure there."""

    def __init__(self, candidates, target: float | None = None, every_s: float = 1.0) -> None:
        super().__init__(candidates, target, on_update=self._redraw)
        self.every_s, self._last = every_s, float("-inf")
        self._handle = None

    def show(self) -> LiveBisection:
        from IPython.display import display

        self._handle = display(self._bundle(self.timeline()), raw=True, display_id=True)
        return self

    def finish(self, result) -> None:
        if self._handle is not None:
            self._handle.update(self._bundle(bisection_timeline(result)), raw=True)

    def _redraw(self, timeline) -> None:
        now = time.monotonic()
        if self._handle is None or now - self._last < self.every_s:
            return
        self._last = now
        self._handle.update(self._bundle(timeline), raw=True)

    @staticmethod
    def _bundle(timeline) -> dict:
        return {"image/png": png_of(plot_bisection_timeline(timeline)),
                "text/plain": f"{len(timeline.trials)} trials"}


def live_bisection(candidates, target: float | None = None,
                   every_s: float = 1.0) -> LiveBisection:
    """A displayed live bisection view: pass its ``add`` as ``bisect(on_trial=...)``, then call
    ``finish(result)``."""
    return LiveBisection(candidates, target, every_s).show()
