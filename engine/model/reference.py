"""Correctness oracle: no cache, no pages, full recompute of the whole sequence for every token.

It emulates only the engine's *storage* rounding (index-K quantization and the KV dtype), so that
with ``batch_invariant=True`` and the torch kernels the engine's greedy tokens must equal these
exactly; any difference points at caching, paging, transfer or scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.kernels import (
    KV_TORCH_DTYPES,
    attend_selected,
    get_kernels,
    index_scores,
    select_topk,
)
from engine.model import layers
from engine.model.model import TinyDeepSeek


@dataclass(frozen=True)
class LayerBuffers:
    """What the engine would hold in its pools for one layer, for every position."""

    k: torch.Tensor  # [T,H,D] fp32 (after KV-dtype rounding)
    v: torch.Tensor  # [T,H,D]
    index_k: torch.Tensor  # [T,Di] fp32 dequantized index keys
    topk_pos: torch.Tensor | None  # [T,K] selected positions per query (ascending)
    topk_len: torch.Tensor | None  # [T] (None in a Prefix, which keeps keys only)


@dataclass(frozen=True)
class ReferenceResult:
    logits: torch.Tensor  # [T,V]
    layers: tuple[LayerBuffers, ...]


@dataclass(frozen=True)
class Scored:
    """Greedy tokens and the log-probability of each (``tokens[i]``'s, fp32)."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class Prefix:
    """Per-layer buffers of every token so far, contiguous (position = row): what an incremental
    step attends to. No pages, no slots, no sharing."""

    layers: tuple[LayerBuffers, ...]

    @property
    def length(self) -> int:
        return self.layers[0].k.shape[0]


class Reference:
    """The engine's math without the engine: ``forward`` recomputes every position; ``extend``
    computes only new positions over a ``Prefix`` of contiguous per-layer buffers. Every row is
    computed by the same row-independent functions either way, so both give identical bits."""

    def __init__(self, model: TinyDeepSeek, cfg: EngineConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.kv_dtype = KV_TORCH_DTYPES[cfg.kv_dtype]
        self.quant = get_kernels("torch")

    def forward(self, tokens: list[int]) -> ReferenceResult:
        """Full recompute: logits [T,V] and every layer's buffers for all T positions."""
        return self.extend(tokens, None)[0]

    @torch.no_grad()
    def extend(self, tokens: list[int], prefix: Prefix | None) -> tuple[ReferenceResult, Prefix]:
        """Positions ``prefix.length .. len(tokens)-1`` of ``tokens`` over ``prefix`` (None: from
        0): their logits [R,V], their buffers, and the prefix grown to ``len(tokens)``."""
        m, bi = self.model, self.cfg.batch_invariant
        dev = torch.device(self.cfg.device)
        start = prefix.length if prefix is not None else 0
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        prev = torch.cat([ids.new_zeros(1), ids[:-1]])[start:]  # [R]
        rows = torch.arange(start, len(tokens), device=dev)  # [R] query positions
        valid = torch.arange(len(tokens), device=dev)[None, :] <= rows[:, None]  # [R,T] causal
        x = layers.embed(m, ids[start:], prev)
        out, grown = [], []
        for i, layer in enumerate(m.layers):
            a = layers.attn_inputs(m, layer, x, rows, bi)
            qk = self.quant.quantize_index_k(a.ki, self.cfg.index_k_dtype)
            new = LayerBuffers(a.k.to(self.kv_dtype).float(), a.v.to(self.kv_dtype).float(),
                               self.quant.dequantize_index_k(qk.values, qk.scale), None, None)
            full = new if prefix is None else _cat(prefix.layers[i], new)
            R, keys = len(rows), full.index_k  # keys [T,Di]
            scores = index_scores(a.qi, a.w, keys[None].expand(R, *keys.shape), valid)
            topk = select_topk(scores, m.cfg.index_topk)
            sel = topk.pos.long()
            ok = torch.arange(sel.shape[1], device=dev)[None, :] < topk.length[:, None]
            o = attend_selected(a.q, full.k[sel], full.v[sel], ok, m.cfg.head_dim ** -0.5)
            x = layers.finish_layer(m, layer, x, o, bi)
            out.append(LayerBuffers(new.k, new.v, new.index_k, topk.pos, topk.length))
            grown.append(LayerBuffers(full.k, full.v, full.index_k, None, None))
        return ReferenceResult(layers.logits(m, x, bi), tuple(out)), Prefix(tuple(grown))

    def generate(self, prompt: list[int], max_tokens: int, eos_id: int,
                 recompute: bool = False) -> list[int]:
        """Greedy tokens: the prompt in one pass, then one position per step over the contiguous
        prefix (``recompute=True``: the whole sequence again for every token)."""
        return list(self.generate_scored(prompt, max_tokens, eos_id, recompute).tokens)

    def generate_scored(self, prompt: list[int], max_tokens: int, eos_id: int,
                        recompute: bool = False) -> Scored:
        """``generate``'s greedy tokens with each one's log-probability, computed as the server
        computes the one it returns: ``log_softmax`` of the fp32 logits at that position.
        Invariant: ``len(tokens) == len(logprobs)``."""
        tokens, output, lps = list(prompt), [], []
        result, prefix = self.extend(tokens, None)
        for _ in range(max_tokens):
            nxt = int(torch.argmax(result.logits[-1]).item())
            output.append(nxt)
            lps.append(float(torch.log_softmax(result.logits[-1].float(), dim=-1)[nxt]))
            tokens.append(nxt)
            if nxt == eos_id or len(output) == max_tokens:
                break
            if recompute:
                result = self.forward(tokens)
            else:
                result, prefix = self.extend(tokens, prefix)
        return Scored(tuple(output), tuple(lps))


def _cat(a: LayerBuffers, b: LayerBuffers) -> LayerBuffers:
    return LayerBuffers(torch.cat([a.k, b.k]), torch.cat([a.v, b.v]),
                        torch.cat([a.index_k, b.index_k]), None, None)
