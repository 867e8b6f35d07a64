"""Divergence maps: where in (layer, position) each buffer of a room departs from what it should be.

``divergence_map(source, room)`` reads both sides' dumps of ``room`` the way ``localize`` does
(a live ``PDPair``, a ``Reproduction``'s captures, or a ``DumpSource``) and computes, per stage
and buffer, a layer x position grid of max |diff|: prefill against the reference, transfer (the
decode's copy of the prompt) against the prefill, decode against the reference. The map holds the
cached-prefix length, the page boundaries and the first divergence in ``localize``'s causal
order; ``values(cell)`` gives the two sides' values behind one cell (what a click shows).
``plot_divergence_map`` draws it (static, for exports); ``divergence_view`` is the live view.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import torch

from engine.core.dump import DumpKey
from workbench.deploy import PDPair
from workbench.observe.buffers import BufferDump, ReferenceBuffers, dump_buffers, load_dump
from workbench.observe.localize import COMPARED, DumpSource, Stage

SCALE = "index_k_scale"  # compared across the transfer only: the reference keeps no scales
BUFFERS = (*COMPARED, SCALE)
WHAT = ("kv", "index_k", "index_k_read", "scale")
_AGAINST = {Stage.PREFILL: ("prefill", "reference"), Stage.TRANSFER: ("decode", "prefill"),
            Stage.DECODE: ("decode", "reference")}


@dataclass(frozen=True, order=True)
class Cell:
    """One (stage, buffer, layer, position) of a map; ordered like ``localize``'s divergences."""

    stage: Stage
    layer: int
    position: int
    buffer: str


@dataclass(frozen=True)
class Panel:
    """One stage's comparison of one buffer: ``grid[layer, p - start]`` is the max |diff| at
    position ``p``; ``bad`` marks where the relative error exceeds the map's ``rtol`` (the
    positions ``localize`` counts)."""

    stage: Stage
    buffer: str
    start: int
    grid: np.ndarray = field(repr=False, compare=False)
    bad: np.ndarray = field(repr=False, compare=False)

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.grid.shape[1])

    def cells(self) -> list[Cell]:
        """The bad cells, in causal order (layer, then position)."""
        return [Cell(self.stage, int(i), self.start + int(p), self.buffer)
                for i, p in zip(*np.nonzero(self.bad), strict=True)]


@dataclass(frozen=True)
class CellValues:
    """What one cell holds on both sides: ``got`` (``got_side``) and ``want`` (``want_side``),
    flattened, and the max |got - want| over them."""

    cell: Cell
    got_side: str
    want_side: str
    got: tuple[float, ...]
    want: tuple[float, ...]
    max_abs: float

    def describe(self, limit: int = 8) -> str:
        def fmt(xs):
            return ", ".join(f"{x:.4g}" for x in xs[:limit]) + (" ..." if len(xs) > limit else "")
        c = self.cell
        return (f"{c.stage.name.lower()} {c.buffer} layer {c.layer} position {c.position}: "
                f"max |diff| {self.max_abs:.3g}\n  {self.got_side}: [{fmt(self.got)}]\n"
                f"  {self.want_side}: [{fmt(self.want)}]")


@dataclass(frozen=True)
class DivergenceMap:
    """Every compared (stage, buffer) of one room. Invariants: ``first`` is the causally earliest
    bad cell of the buffers ``localize`` compares (None: none differs; a scale panel is drawn
    but, as in ``localize``, not ordered: its index-K differs where it matters);
    ``page_boundaries`` are the multiples of ``page_size`` inside the room's positions; the
    tensors behind the grids stay in ``_sides`` so ``values`` can answer for any cell."""

    room: int
    prompt_len: int
    num_cached: int
    page_size: int
    rtol: float
    panels: tuple[Panel, ...]
    _sides: dict = field(repr=False, compare=False)

    @property
    def positions(self) -> int:
        return max((p.positions.stop for p in self.panels), default=self.prompt_len)

    @property
    def page_boundaries(self) -> tuple[int, ...]:
        return tuple(range(self.page_size, self.positions, self.page_size))

    @property
    def first(self) -> Cell | None:
        return min((c for p in self.panels if p.buffer in COMPARED for c in p.cells()[:1]),
                   default=None)

    def panel(self, stage: Stage, buffer: str) -> Panel:
        for p in self.panels:
            if (p.stage, p.buffer) == (stage, buffer):
                return p
        raise KeyError(f"no {stage.name.lower()} panel for {buffer!r}; have "
                       f"{[(p.stage.name.lower(), p.buffer) for p in self.panels]}")

    def values(self, cell: Cell) -> CellValues:
        """The values behind ``cell`` (KeyError: no such panel; IndexError: outside it)."""
        panel = self.panel(cell.stage, cell.buffer)
        if cell.position not in panel.positions or not 0 <= cell.layer < panel.grid.shape[0]:
            raise IndexError(f"{cell} lies outside the panel (layers 0..{panel.grid.shape[0] - 1}"
                             f", positions {panel.positions.start}..{panel.positions.stop - 1})")
        got, want = self._sides[cell.stage]
        key = str(DumpKey(cell.layer, cell.buffer))
        g = got[key][cell.position].float().flatten()
        w = want[key][cell.position].to(got[key].dtype).float().flatten()
        names = _AGAINST[cell.stage]
        return CellValues(cell, names[0], names[1], tuple(g.tolist()), tuple(w.tolist()),
                          float((g - w).abs().max()) if len(g) else 0.0)

    def describe(self) -> str:
        first = self.first
        where = "nothing differs" if first is None else (
            f"first divergence: {first.stage.name.lower()} {first.buffer} layer {first.layer} "
            f"position {first.position}")
        return (f"room {self.room}: {self.prompt_len} prompt tokens ({self.num_cached} cached), "
                f"{len(self.panels)} panels; {where}")


def room_dumps(source, room: int) -> tuple[BufferDump, BufferDump]:
    """(prefill, decode) dumps of ``room``, with index-K scales where the source keeps them."""
    if isinstance(source, DumpSource):
        return source.room_dumps(room)
    if isinstance(source, PDPair):
        return (dump_buffers(source, room=room, what=WHAT, role="prefill"),
                dump_buffers(source, room=room, what=WHAT, role="decode"))
    return (load_dump(source.capture_of(room, "prefill"), WHAT),
            load_dump(source.capture_of(room, "decode"), WHAT))


def divergence_map(source, room: int, reference: ReferenceBuffers | None = None,
                   rtol: float = 1e-5) -> DivergenceMap:
    """The divergence map of ``room`` (sources as ``localize``; ``reference`` reuses a loaded
    reference model). Its ``first`` is ``localize``'s first buffer divergence of the room."""
    pre, dec = room_dumps(source, room)
    cfg = source.spec.engine_config() if isinstance(source, PDPair) else source.engine_config()
    refb = reference or ReferenceBuffers(cfg)
    prompt_len = len(pre.tokens)
    sides = {Stage.PREFILL: (pre.tensors, refb.buffers(pre.tokens)),
             Stage.TRANSFER: (dec.tensors, pre.tensors),
             Stage.DECODE: (dec.tensors, refb.buffers(dec.tokens))}
    spans = {Stage.PREFILL: (0, prompt_len), Stage.TRANSFER: (0, prompt_len),
             Stage.DECODE: (prompt_len, len(dec.tokens))}
    panels = tuple(p for stage, (got, want) in sides.items() for buffer in BUFFERS
                   if (p := _panel(stage, buffer, got, want, spans[stage], rtol)) is not None)
    return DivergenceMap(room, prompt_len, pre.num_cached, cfg.page_size, rtol, panels, sides)


def _panel(stage: Stage, buffer: str, got: dict, want: dict, span: tuple[int, int],
           rtol: float) -> Panel | None:
    """The panel of ``buffer`` over positions ``[lo, hi)``; None when a side lacks it there."""
    layers = sorted(k.layer for k in map(DumpKey.parse, set(got) & set(want))
                    if k is not None and k.name == buffer)
    lo, hi = span
    keys = [str(DumpKey(i, buffer)) for i in layers]
    if not keys:
        return None
    hi = min(hi, *(len(got[k]) for k in keys), *(len(want[k]) for k in keys))
    if hi <= lo or layers != list(range(len(layers))):
        return None
    errs, rels = zip(*(_errors(got[k][lo:hi], want[k][lo:hi]) for k in keys), strict=True)
    return Panel(stage, buffer, lo, torch.stack(errs).numpy(), (torch.stack(rels) > rtol).numpy())


def _errors(g: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T] max |diff| per position, and that over the position's max |reference| (as
    ``localize``: the reference is first cast to the dump's dtype)."""
    g, w = g.float().reshape(len(g), -1), w.to(g.dtype).float().reshape(len(w), -1)
    err = (g - w).abs().amax(1)
    return err, err / w.abs().amax(1).clamp_min(1e-6)


def plot_divergence_map(m: DivergenceMap, buffers: tuple[str, ...] | None = None,
                        mark: Cell | None = None):
    """Static rendering: a row per stage, a column per buffer; log10 max |diff| per (layer,
    position), bad cells outlined by the colour scale's top, the cached prefix shaded, page
    boundaries as minor ticks, the first divergence (or ``mark``) circled. Returns the Figure."""
    names = [b for b in BUFFERS if b in (buffers or BUFFERS)]
    stages = list(_AGAINST)
    fig, axes = plt.subplots(len(stages), len(names), figsize=(3.2 * len(names) + 1, 6.5),
                             squeeze=False, sharex=True, layout="constrained")
    peak = max((float(p.grid.max()) for p in m.panels), default=0.0)
    image = None
    for (r, stage), (c, buffer) in ((rs, cb) for rs in enumerate(stages)
                                    for cb in enumerate(names)):
        ax = axes[r, c]
        try:
            image = _draw_panel(ax, m, m.panel(stage, buffer), peak)
        except KeyError:
            ax.text(0.5, 0.5, "not compared", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
            ax.set_yticks([])
        ax.set_title(f"{stage.name.lower()}: {buffer}", fontsize=8)
        if c == 0:
            ax.set_ylabel("layer", fontsize=8)
    target = mark or m.first
    if target is not None and target.buffer in names:
        ax = axes[stages.index(target.stage), names.index(target.buffer)]
        ax.plot(target.position, target.layer, "o", mfc="none", mec="cyan", ms=10, mew=2)
    if image is not None:
        fig.colorbar(image, ax=axes, label="log10 max |diff| (green: beyond rtol)", shrink=0.8)
    fig.suptitle(m.describe(), fontsize=9)
    return fig


def _draw_panel(ax, m: DivergenceMap, p: Panel, peak: float):
    logs = np.log10(np.maximum(p.grid, 1e-12))
    image = ax.imshow(logs, aspect="auto", cmap="magma", interpolation="nearest", vmin=-12,
              vmax=np.log10(max(peak, 1e-12)) if peak > 0 else 0,
              extent=(p.start - 0.5, p.positions.stop - 0.5, p.grid.shape[0] - 0.5, -0.5))
    ys, xs = np.nonzero(p.bad)
    ax.scatter(xs + p.start, ys, s=2, c="lime", marker="s", linewidths=0)
    if m.num_cached:  # the prefix reused from the cache
        ax.axvspan(-0.5, m.num_cached - 0.5, color="white", alpha=0.15, lw=0)
        ax.axvline(m.num_cached - 0.5, color="deepskyblue", lw=1, ls="--")
    ax.set_xticks(list(m.page_boundaries), minor=True)
    ax.tick_params(axis="x", which="minor", length=3, color="gray")
    ax.set_yticks(range(p.grid.shape[0]))
    ax.tick_params(labelsize=7)
    return image
