"""Divergence maps and timelines (issue 28): what each view would draw, checked against real
localizations, simulated schedules and bisections, without a browser."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from workbench.observe import BufferDump, ReferenceBuffers, Stage, localize
from workbench.report.divergence import Cell, divergence_map, plot_divergence_map
from workbench.report.static import WIDGET_VIEW
from workbench.report.timeline import (
    BisectionLive,
    _label,
    bisection_timeline,
    plot_bisection_timeline,
    plot_schedule_timeline,
    schedule_timeline,
)


class _Room:
    """A ``DumpSource`` whose room holds the reference's own buffers of one request on both
    sides, with the corruptions a test plants."""

    def __init__(self, refb: ReferenceBuffers, prompt: int, total: int, cached: int) -> None:
        tokens = list(range(3, 3 + total))
        pre = {k: v[:prompt].clone() for k, v in refb.buffers(tokens).items()}
        dec = {k: v.clone() for k, v in refb.buffers(tokens).items()}
        for side in (pre, dec):  # the transfer carries index-K scales; no reference has them
            for layer in range(4):
                side[f"layer{layer}.index_k_scale"] = torch.ones(len(side["layer0.k"]))
        self.pre = BufferDump("prefill:5", tokens[:prompt], pre, cached, (tokens[prompt],))
        self.dec = BufferDump("decode:5", tokens, dec, cached, tuple(tokens[prompt:]))

    def engine_config(self) -> EngineConfig:
        return EngineConfig()  # the reference's (the fixture's) configuration

    def room_dumps(self, room: int):
        return self.pre, self.dec


@pytest.fixture(scope="module")
def refb():
    return ReferenceBuffers(EngineConfig())


def test_the_divergence_map_draws_what_localize_finds(refb):
    room = _Room(refb, prompt=40, total=48, cached=16)
    room.dec.tensors["layer1.k"][20:23] += 0.5  # the transfer corrupts three positions
    room.dec.tensors["layer2.v"][44] += 0.25  # the decode computes one position wrong
    room.dec.tensors["layer2.index_k_scale"][30] *= 2  # and carries one wrong scale
    m = divergence_map(room, 5, refb)
    loc = localize(room, 5, refb)
    assert (m.first.stage, m.first.layer, m.first.position, m.first.buffer) == (
        loc.first.stage, loc.first.layer, loc.first.position, loc.first.buffer)
    for d in loc.divergences:  # every divergence localize reports is the map's bad cells
        bad = m.panel(d.stage, d.buffer).cells()
        assert [c.position for c in bad if c.layer == d.layer][0] == d.position
        assert sum(c.layer == d.layer for c in bad) == d.positions
    assert m.panel(Stage.TRANSFER, "index_k_scale").cells() == [
        Cell(Stage.TRANSFER, 2, 30, "index_k_scale")]
    with pytest.raises(KeyError, match="no prefill panel"):
        m.panel(Stage.PREFILL, "index_k_scale")
    assert not any(p.bad.any() for p in m.panels if p.stage is Stage.PREFILL)
    decode = m.panel(Stage.DECODE, "v")
    assert decode.positions == range(40, 48) and decode.grid.shape == (4, 8)
    assert m.page_boundaries == (16, 32) and m.num_cached == 16
    vals = m.values(Cell(Stage.TRANSFER, 1, 21, "k"))  # what clicking that cell shows
    assert (vals.got_side, vals.want_side) == ("decode", "prefill")
    assert np.allclose(np.subtract(vals.got, vals.want), 0.5) and vals.max_abs == pytest.approx(0.5)
    assert m.values(Cell(Stage.DECODE, 0, 41, "k")).max_abs == 0.0
    with pytest.raises(IndexError, match="outside"):
        m.values(Cell(Stage.DECODE, 0, 12, "k"))
    fig = plot_divergence_map(m)
    assert len(fig.axes) == 3 * 5 + 1  # stages x buffers, and the colour bar


def test_the_live_divergence_view_shows_the_clicked_cell_and_exports_its_figure(refb):
    from workbench.report.heatgrid import BAD
    from workbench.report.live import divergence_view

    room = _Room(refb, prompt=24, total=30, cached=0)
    room.pre.tensors["layer3.index_k_f32"][7] -= 1.0
    view = divergence_view(divergence_map(room, 5, refb))
    assert view.cell == Cell(Stage.PREFILL, 3, 7, "index_k_f32") and "position 7" in \
        view.values.value
    colours = view.grid.colours  # what the grid paints: the bad cell, and only it, in BAD
    assert len(colours) == 4 and len(colours[0]) == 24 and colours[3][7] == BAD
    assert sum(c == BAD for row in colours for c in row) == 1
    view.grid.selected = [3, 9]  # what a click on that cell sends back
    assert view.cell == Cell(Stage.PREFILL, 3, 9, "index_k_f32")
    assert "max |diff| 0" in view.values.value and view.position.value == 9
    view.grid.selected = [7, 9]  # a click outside the panel changes nothing
    assert view.cell.layer == 3
    view.position.value = 7  # typed into the boxes
    assert view.grid.selected == [3, 7] and "max |diff| 1" in view.values.value
    transfer = [i for i, p in enumerate(view.map.panels) if p.stage is Stage.TRANSFER
                and p.buffer == "index_k_f32"][0]
    view.panel.value = transfer  # the decode holds the right index-K: it differs from the prefill
    assert view.cell == Cell(Stage.TRANSFER, 3, 7, "index_k_f32") and len(view.cells.options) == 1
    decode = [i for i, p in enumerate(view.map.panels) if p.stage is Stage.DECODE][0]
    view.panel.value = decode
    assert view.cell.position == 24 == view.grid.start and view.position.min == 24
    bundle = view._repr_mimebundle_()
    assert {WIDGET_VIEW, "image/png", "text/plain"} <= set(bundle)


def test_a_schedule_timeline_tiles_the_decisions_and_marks_the_switches():
    from workbench import sim
    from workbench.report.live import schedule_view

    w = sim.Workload(sessions=2, turns=1, max_tokens=4)
    run = sim.run((), 0, w)
    t = schedule_timeline(run)
    assert t.decisions == len(run.trace) and t.guided is None and t.lanes[0] == "engine"
    assert set(t.lanes) == {d.thread for d in run.trace}
    assert t.spans[0].start == 0 and t.spans[-1].stop == t.decisions
    assert all(a.stop == b.start and a.thread != b.thread
               for a, b in zip(t.spans, t.spans[1:], strict=False))
    assert [s.step for s in t.switches] == [d.step for d in run.preemptions] != []
    for s in t.switches:  # a switch leaves one lane's span for another's at that decision
        assert any(x.start == s.step and x.thread == s.runs for x in t.spans)
        assert any(x.stop == s.step and x.thread == s.preempted for x in t.spans)
    part = t.window(5, 20)
    assert min(s.start for s in part.spans) == 5 and max(s.stop for s in part.spans) == 20
    assert plot_schedule_timeline(t, 0, 10).axes[0].get_xlim() == (0, 10)
    # the schedule as shrink_schedule tries it: guided by the run, its first switch dropped
    step = t.switches[0].step
    guide = tuple(d.thread for d in run.trace[:step]) + (None,)
    shrunk = schedule_timeline(sim.run((), 0, w, "random", True, guide))
    assert shrunk.guided == step + 1 and step not in [s.step for s in shrunk.switches]
    view = schedule_view(t, width=10)
    view.jump(t.decisions - 1)
    assert view.window.value == (t.decisions - 10, t.decisions) and view.image.value


def test_a_live_bisection_sees_every_trial_the_result_records():
    from workbench.search import bisect

    cands = [f"c{i}" for i in range(6)]

    def trial(candidate: str, seed: int) -> bool:  # c3 on: fails half the time, seeded
        return cands.index(candidate) >= 3 and np.random.default_rng(seed).random() < 0.5

    frames = []
    live = BisectionLive(cands, 0.9, on_update=frames.append)
    res = bisect(cands, trial, confidence=0.9, seed=1, on_trial=live.add)
    t = bisection_timeline(res)
    assert res.culprit == "c3" and len(frames) == res.trials_spent == len(t.trials)
    assert np.allclose(live.timeline().posteriors, t.posteriors)
    assert live.timeline().trials == t.trials == tuple(
        zip(res.history["candidate"], res.history["failed"], strict=True))
    assert np.allclose(t.posteriors[0], 1 / 6) and t.leader == ("c3", pytest.approx(
        res.confidence))
    assert np.allclose(t.posteriors[1:].max(1), res.history["max_posterior"].to_numpy())
    assert len(plot_bisection_timeline(t).axes) == 3
    assert [_label(c) for c in ("+bf16_index_k+hicache_index_k_no_wait", "c3", "f" * 40)] == [
        "+hicache_index_k_no_wait", "c3", "f" * 12]  # a series' candidate: the patch it adds
    with pytest.raises(ValueError, match="not one of the candidates"):
        live.add(_update("c9"))


def _update(candidate: str):
    from workbench.search.result import TrialUpdate

    return TrialUpdate(1, candidate, True, (1.0,))


def test_an_exported_report_shows_a_live_view_as_its_static_figure(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from workbench.report.static import export_html

    nb = nbformat.v4.new_notebook()
    view = {"version_major": 2, "version_minor": 0, "model_id": "m1"}
    nb.cells = [nbformat.v4.new_code_cell("view", outputs=[nbformat.v4.new_output(
        "display_data", data={WIDGET_VIEW: view, "image/png": "iVBORw0KGgo=", "text/plain": "v"})])]
    # papermill saves the widget state, with which a stock HTMLExporter renders the widget view
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {"m1": {"model_name": "CellGridModel", "state": {}}},
        "version_major": 2, "version_minor": 0}}
    src = tmp_path / "view.ipynb"
    nbformat.write(nb, src)
    ours = export_html(src).read_text()
    block = f'<script type="{WIDGET_VIEW}">'  # an output rendered as the widget view
    assert block not in ours and "data:image/png;base64,iVBORw0KGgo=" in ours
