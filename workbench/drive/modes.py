"""Engine modes: the configuration axes a sweep turns on besides load and fault shapes.

A bug that exists only in one mode (overlap scheduling, a small chunk size, bf16 index-K, HiCache
off, another page size, prompts ending exactly on a page or chunk boundary) is invisible to a
sweep that never enables it. A ``Mode`` is one value of one ``Axis``; ``with_modes(shape,
modes)`` is the shape run in those modes (its name joins them with ``+``); ``plan`` lays out the
sweep's cells: every shape as configured, then every single mode, then pairs of modes from
different axes in a seeded order.

Invariant: modes of one axis are exclusive (a cell never holds two), and a cell's name lists its
shape and modes, so a coverage table row says exactly what ran.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.patches import BF16_INDEX_K, OVERLAP
from engine.registry import Registry
from workbench.drive.shapes import Shape, shape_of


class Axis(enum.Enum):
    OVERLAP = "overlap schedule"
    INDEX_K = "index-K dtype"
    HICACHE = "HiCache"
    CHUNK = "chunk size"
    PAGE = "page size"
    ALIGN = "prompt alignment"


@dataclass(frozen=True)
class Mode:
    """One value of ``axis`` away from the default: engine settings, modifier patches, and
    ``align`` (prompts padded to end exactly on a multiple of that many tokens; ``"page"`` and
    ``"chunk"`` resolve to the cell's engine page or chunk size)."""

    name: str
    axis: Axis
    description: str
    engine: dict = field(default_factory=dict)
    patches: tuple[str, ...] = ()
    align: str | None = None


MODES: Registry[Mode] = Registry("engine mode")
for _m in (
    Mode("overlap", Axis.OVERLAP, "overlap scheduling (SGLang's default): the next batch is "
         "prepared while the previous forward runs", patches=(OVERLAP,)),
    Mode(BF16_INDEX_K, Axis.INDEX_K, "index-K stored in bf16 (twice fp8's bytes)",
         patches=(BF16_INDEX_K,)),
    Mode("hicache_off", Axis.HICACHE, "no host cache tier: prefixes stay in device pages",
         {"hicache": False, "hicache_offload_on_finish": False}),
    Mode("chunk_64", Axis.CHUNK, "prefill chunks of 64 tokens (every prompt crosses several)",
         {"chunk_size": 64}),
    Mode("page_32", Axis.PAGE, "pages of 32 tokens", {"page_size": 32}),
    Mode("page_aligned", Axis.ALIGN, "every prompt padded to end exactly on a page boundary",
         align="page"),
    Mode("chunk_aligned", Axis.ALIGN, "every prompt padded to end exactly on a chunk boundary",
         align="chunk"),
):
    MODES.register(_m.name, _m)

MODE_ORDER: tuple[str, ...] = ("overlap", "hicache_off", "chunk_aligned", "page_aligned",
                               "chunk_64", BF16_INDEX_K, "page_32")
"""Single modes in sweep order: SGLang's production defaults first (overlap scheduling on, no
HiCache host tier), then the workload-only axes, then other configuration changes."""

_DEFAULTS = {"page": EngineConfig.page_size, "chunk": EngineConfig.chunk_size}


def mode_of(mode: str | Mode) -> Mode:
    """A registered mode by name (unknown names list the valid ones), or ``mode`` itself."""
    return mode if isinstance(mode, Mode) else MODES.get(mode)


def align_tokens(modes: Sequence[Mode], engine: dict) -> int | None:
    """The prompt alignment (tokens) the modes ask for under ``engine``, or None."""
    kinds = [m.align for m in modes if m.align]
    if not kinds:
        return None
    key = {"page": "page_size", "chunk": "chunk_size"}[kinds[0]]
    return int(engine.get(key, _DEFAULTS[kinds[0]]))


def with_modes(shape: str | Shape, modes: Sequence[str | Mode]) -> Shape:
    """``shape`` run in ``modes`` (ValueError when two share an axis); unchanged for none."""
    ms = [mode_of(m) for m in modes]
    axes = [m.axis for m in ms]
    if len(set(axes)) != len(axes):
        raise ValueError(f"modes {[m.name for m in ms]} share an axis")
    sh = shape_of(shape)
    if not ms:
        return sh
    engine = {**sh.engine, **{k: v for m in ms for k, v in m.engine.items()}}
    return dataclasses.replace(
        sh, name="+".join([sh.name, *(m.name for m in ms)]), engine=engine,
        patches=tuple(dict.fromkeys([*sh.patches, *(p for m in ms for p in m.patches)])),
        align_to=align_tokens(ms, engine), modes=tuple(m.name for m in ms))


def plan(shapes: Sequence[str | Shape], modes: Sequence[str] = MODE_ORDER, *, seed: int = 0,
         base: str | Shape = "baseline", pairs: bool = True) -> tuple[Shape, ...]:
    """The sweep's cells, in order: ``shapes`` as they are; each of ``modes`` alone on
    ``base``; then (``pairs``) every pair of ``modes`` from different axes on ``base``, in an
    order seeded by ``seed``. A sweep runs them in turn and stops at the first that fires."""
    cells = [shape_of(s) for s in shapes]
    cells += [with_modes(base, [m]) for m in modes]
    if pairs:
        two = [p for p in itertools.combinations(modes, 2)
               if mode_of(p[0]).axis is not mode_of(p[1]).axis]
        random.Random(f"modes:{seed}").shuffle(two)
        cells += [with_modes(base, list(p)) for p in two]
    return tuple(cells)


def cell_of(cell: str | Shape) -> Shape:
    """A sweep cell by name: a shape, or a shape and its modes joined by ``+``
    (``"baseline+overlap"``), as ``with_modes`` names them; a ``Shape`` is returned as is."""
    if isinstance(cell, Shape):
        return cell
    shape, *modes = cell.split("+")
    return with_modes(shape, modes)
