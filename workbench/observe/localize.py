"""Localization that does not know the answer: where does a request's state first go wrong?

``localize(source, room)`` takes both sides' dumps of one room (live from a pair, or captured by
a reproduction), diffs every buffer of every layer against the reference and the decode's
transferred prompt against the prefill's, and orders the divergences causally: stage (prefill,
then transfer, then decode), then layer, then position. The first is the localization; every
divergence carries its evidence (buffer, layer, first position, size, whether the position lies
in the prefix reused from the cache or at a chunk boundary).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import polars as pl
import torch

from engine.config import EngineConfig
from engine.core.dump import DumpKey
from workbench.deploy import PDPair
from workbench.observe.attribution import OffGreedy, off_greedy, room_conflict, stream_departure
from workbench.observe.buffers import (
    BufferDump,
    ReferenceBuffers,
    dump_buffers,
    load_dump,
)
from workbench.observe.inputs import InputMixup, input_mixups

COMPARED = ("k", "v", "index_k_f32", "index_k_read_f32")
AUX_FIRST_TOKEN = "aux_first_token"


class Stage(enum.IntEnum):
    """Where an anomaly arises (the component), in causal order along a request's path."""

    ROUTER = 0  # the router / control plane: room assignment, bootstrap, preallocs, aborts
    PREFILL = 1  # the prefill's own buffers differ from the reference
    TRANSFER = 2  # the decode's copy of the prompt differs from the prefill's
    DECODE = 3  # positions the decode computed differ from the reference
    SAMPLING = 4  # right buffers (so right logits), a chosen token that is not their argmax
    ENGINE_LOOP = 5  # right tokens sampled, handed to the wrong request (batch bookkeeping)
    SERVING = 6  # right tokens, an answer that misstates them (stop, length, usage, content)


@dataclass(frozen=True, order=True)
class Divergence:
    """One (stage, layer, buffer) that differs; ordered causally by its fields' order."""

    stage: Stage
    layer: int
    position: int  # the first differing position
    buffer: str
    positions: int  # how many positions differ
    max_abs: float
    in_cached_prefix: bool  # position < the room's num_cached (prefix reused from the cache)
    chunk_boundary: bool  # position is a multiple of the engine's chunk size

    def describe(self) -> str:
        where = ("in the prefix reused from the cache" if self.in_cached_prefix else
                 "outside the cached prefix")
        edge = ", at a chunk boundary" if self.chunk_boundary else ""
        return (f"{self.stage.name.lower()}: {self.buffer} of layer {self.layer} first differs "
                f"at position {self.position} ({self.positions} positions, max |diff| "
                f"{self.max_abs:.3g}; {where}{edge})")


@dataclass(frozen=True)
class Localization:
    """``first`` is the causally earliest divergence (None: both sides equal the reference and
    each other, which for a flagged room means the corruption is not in these buffers)."""

    room: int
    prompt_len: int
    num_cached: int
    divergences: tuple[Divergence, ...]
    compared: int  # (side, layer, buffer) tensors compared
    conflict: str = ""  # "room R carried two requests: ..." (then nothing was compared)
    off_greedy: OffGreedy | None = None  # buffers right, a generated token not the greedy one
    stream: str = ""  # the client received tokens the decode's request did not produce
    mixups: tuple[InputMixup, ...] = ()  # decode positions computed from another token

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame([{**d.__dict__, "stage": d.stage.name.lower()}
                             for d in self.divergences])

    def describe(self) -> str:
        if self.conflict:
            return self.conflict
        if self.first is None and self.off_greedy is not None:
            return (f"room {self.room}: every compared buffer ({self.compared}) equals the "
                    f"reference; {self.off_greedy.describe().split(': ', 1)[1]}")
        if self.first is None:
            return (f"room {self.room}: every compared buffer ({self.compared}) equals the "
                    "reference on both sides and the transfer")
        return f"room {self.room}: first divergence {self.first.describe()}"


@runtime_checkable
class DumpSource(Protocol):
    """Holds both sides' buffers of its rooms in process (``workbench.sim``'s PD pair)."""

    def engine_config(self) -> EngineConfig: ...

    def room_dumps(self, room: int) -> tuple[BufferDump, BufferDump]:
        """(prefill, decode) buffers of ``room``; KeyError when either is gone."""
        ...


def _dumps(source, room: int) -> tuple[BufferDump, BufferDump]:
    if isinstance(source, DumpSource):
        return source.room_dumps(room)
    if isinstance(source, PDPair):
        return (dump_buffers(source, room=room, role="prefill"),
                dump_buffers(source, room=room, role="decode"))
    return (load_dump(source.capture_of(room, "prefill")),
            load_dump(source.capture_of(room, "decode")))


def _config(source):
    return source.spec.engine_config() if isinstance(source, PDPair) else source.engine_config()


def _relative_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """[T] max abs difference per position over the position's max abs reference value."""
    err = (got.float() - want.float()).abs().flatten(1).amax(1)
    return err / want.float().abs().flatten(1).amax(1).clamp_min(1e-6)


def _divergences(stage: Stage, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
                 lo: int, hi: int, ctx: tuple[int, int], rtol: float) -> list[Divergence]:
    """Divergences of ``got`` from ``want`` over positions ``[lo, hi)`` of every compared key
    both hold."""
    num_cached, chunk = ctx
    out = []
    for key in sorted(set(got) & set(want)):
        dk = DumpKey.parse(key)
        if dk is None or dk.name not in COMPARED:
            continue
        n = min(hi, len(got[key]), len(want[key]))
        if n <= lo:
            continue
        g, w = got[key][lo:n], want[key][lo:n].to(got[key].dtype)
        rel = _relative_errors(g, w)
        idx = (rel > rtol).nonzero().flatten()
        if len(idx):
            p = lo + int(idx[0])
            size = float((g.float() - w.float()).abs().max())
            out.append(Divergence(stage, dk.layer, p, dk.name, len(idx), size, p < num_cached,
                                  p > 0 and p % chunk == 0))
    return out


def _first_token(pre: BufferDump, dec: BufferDump, prompt_len: int) -> list[Divergence]:
    """The aux row's first token: what the decode started from vs what the prefill sampled
    (reported at layer 0, position ``prompt_len``, buffer ``AUX_FIRST_TOKEN``)."""
    if not pre.output or not dec.output or pre.output[0] == dec.output[0]:
        return []
    return [Divergence(Stage.TRANSFER, 0, prompt_len, AUX_FIRST_TOKEN, 1,
                       float(abs(pre.output[0] - dec.output[0])), False, False)]


def localize(source, room: int, reference: ReferenceBuffers | None = None,
             rtol: float = 1e-5, sent: str | None = None,
             received: Sequence[int] | None = None) -> Localization:
    """Dumps ``room`` on both sides of a live ``PDPair`` (or loads a ``Reproduction``'s captures
    of it, or takes a ``DumpSource``'s) and orders every divergence causally; ``reference``
    reuses a loaded reference model across calls. Dumps that carry two requests
    (``attribution.room_conflict``; ``sent``: the prompt hash the client sent) are not compared:
    the localization holds the conflict. With no divergence, the decode's generated tokens are
    checked against the reference's greedy choices (``attribution.off_greedy``); ``received``
    (the tokens the client got) against the decode's output (``attribution.stream_departure``)."""
    pre, dec = _dumps(source, room)
    prompt_len = len(pre.tokens)
    conflict = room_conflict(room, pre.identity, dec.identity, sent)
    if conflict:
        return Localization(room, prompt_len, pre.num_cached, (), 0, conflict)
    cfg = _config(source)
    refb = reference or ReferenceBuffers(cfg)
    ctx = (pre.num_cached, cfg.chunk_size)
    divs = _divergences(Stage.PREFILL, pre.tensors, refb.buffers(pre.tokens), 0, prompt_len,
                        ctx, rtol)
    divs += _divergences(Stage.TRANSFER, dec.tensors, pre.tensors, 0, prompt_len, ctx, rtol)
    divs += _first_token(pre, dec, prompt_len)
    divs += _divergences(Stage.DECODE, dec.tensors, refb.buffers(dec.tokens), prompt_len,
                         len(dec.tokens), ctx, rtol)
    compared = sum(DumpKey.parse(k) is not None and DumpKey.parse(k).name in COMPARED
                   for d in (pre, dec) for k in d.tensors)
    off = None if divs else off_greedy(room, dec.tokens[:prompt_len], dec.output, refb.greedy)
    mix = _mixups(room, dec, refb, prompt_len, rtol) if divs else ()
    return Localization(room, prompt_len, pre.num_cached, tuple(sorted(divs)), compared,
                        off_greedy=off, stream=stream_departure(room, received, dec.output),
                        mixups=mix)


def _mixups(room: int, dec: BufferDump, refb: ReferenceBuffers, lo: int,
            rtol: float) -> tuple[InputMixup, ...]:
    """Decode positions whose layer-0 K differs from the reference and reads back as computed
    from a token the request does not hold there (``workbench.observe.inputs``)."""
    key = str(DumpKey(0, "k"))
    got, want = dec.tensors.get(key), refb.buffers(dec.tokens).get(key)
    if got is None or want is None:
        return ()
    n = min(len(got), len(want), len(dec.tokens))
    if n <= lo:
        return ()
    bad = (_relative_errors(got[lo:n], want[lo:n].to(got.dtype)) > rtol).nonzero().flatten()
    return tuple(input_mixups(refb.ref.model, room, dec.tokens, dec.tensors,
                              [lo + int(i) for i in bad[:16]]))
