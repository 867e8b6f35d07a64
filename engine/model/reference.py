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
    topk_pos: torch.Tensor  # [T,K] selected positions per query (ascending)
    topk_len: torch.Tensor  # [T]


@dataclass(frozen=True)
class ReferenceResult:
    logits: torch.Tensor  # [T,V]
    layers: tuple[LayerBuffers, ...]


class Reference:
    def __init__(self, model: TinyDeepSeek, cfg: EngineConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.kv_dtype = KV_TORCH_DTYPES[cfg.kv_dtype]
        self.quant = get_kernels("torch")

    @torch.no_grad()
    def forward(self, tokens: list[int]) -> ReferenceResult:
        m, bi = self.model, self.cfg.batch_invariant
        dev = torch.device(self.cfg.device)
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        T = len(tokens)
        prev = torch.cat([ids.new_zeros(1), ids[:-1]])
        pos = torch.arange(T, device=dev)
        valid = pos[None, :] <= pos[:, None]  # [T,S] causal
        x = layers.embed(m, ids, prev)
        out = []
        for layer in m.layers:
            a = layers.attn_inputs(m, layer, x, pos, bi)
            qk = self.quant.quantize_index_k(a.ki, self.cfg.index_k_dtype)
            keys = self.quant.dequantize_index_k(qk.values, qk.scale)  # [T,Di]
            scores = index_scores(a.qi, a.w, keys[None].expand(T, *keys.shape), valid)
            topk = select_topk(scores, m.cfg.index_topk)
            k = a.k.to(self.kv_dtype).float()
            v = a.v.to(self.kv_dtype).float()
            sel = topk.pos.long()
            ok = torch.arange(sel.shape[1], device=dev)[None, :] < topk.length[:, None]
            o = attend_selected(a.q, k[sel], v[sel], ok, m.cfg.head_dim ** -0.5)
            x = layers.finish_layer(m, layer, x, o, bi)
            out.append(LayerBuffers(k, v, keys, topk.pos, topk.length))
        return ReferenceResult(layers.logits(m, x, bi), tuple(out))

    def generate(self, prompt: list[int], max_tokens: int, eos_id: int) -> list[int]:
        """Greedy tokens by full recompute each step."""
        tokens, output = list(prompt), []
        for _ in range(max_tokens):
            nxt = int(torch.argmax(self.forward(tokens).logits[-1]).item())
            output.append(nxt)
            tokens.append(nxt)
            if nxt == eos_id:
                break
        return output
