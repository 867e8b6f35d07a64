"""Per-token layer math shared by the serving runner and the reference oracle.

Everything here is row-independent: the value computed for a token never depends on which other
tokens share the call. With ``batch_invariant=True`` linears use a batched GEMV, which (unlike a
plain GEMM on CPU) gives bitwise-identical rows for any batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.model import Layer, TinyDeepSeek, apply_rope, rms_norm


def linear(x: torch.Tensor, w: torch.Tensor, batch_invariant: bool) -> torch.Tensor:
    """x [N,in], w [out,in] -> [N,out]."""
    if not batch_invariant:
        return F.linear(x, w)
    wt = w.T  # [in,out]
    return torch.bmm(x.unsqueeze(1), wt.expand(x.shape[0], -1, -1)).squeeze(1)


@dataclass(frozen=True)
class AttnInputs:
    """Projections of one layer for N tokens."""

    q: torch.Tensor  # [N,H,D]
    k: torch.Tensor  # [N,H,D]
    v: torch.Tensor  # [N,H,D]
    qi: torch.Tensor  # [N,Hi,Di] index queries
    ki: torch.Tensor  # [N,Di] index keys (fp32, before storage quantization)
    w: torch.Tensor  # [N,Hi] index head weights


@dataclass(frozen=True)
class Rope:
    """RoPE rows for N positions, gathered once per batch and shared by every layer."""

    cos: torch.Tensor  # [N,1,D/2]
    sin: torch.Tensor  # [N,1,D/2]
    icos: torch.Tensor  # [N,Di/2]
    isin: torch.Tensor  # [N,Di/2]


def rope_rows(model: TinyDeepSeek, positions: torch.Tensor) -> Rope:
    """positions [N] -> the cos/sin table rows of the attention and index heads."""
    def rows(table: torch.Tensor) -> torch.Tensor:
        return table.index_select(0, positions)

    return Rope(rows(model.cos)[:, None], rows(model.sin)[:, None], rows(model.icos),
                rows(model.isin))


def embed(model: TinyDeepSeek, tokens: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """tokens, prev [N] -> x [N,d]."""
    tok, prev_w = model.tok_emb.weight, model.prev_emb.weight
    return tok.index_select(0, tokens) + prev_w.index_select(0, prev)


def attn_inputs(model: TinyDeepSeek, layer: Layer, x: torch.Tensor,
                positions: torch.Tensor | Rope, batch_invariant: bool) -> AttnInputs:
    """x [N,d] at ``positions [N]`` (or their precomputed ``Rope`` rows) -> projections."""
    cfg = model.cfg
    n = x.shape[0]
    rope = positions if isinstance(positions, Rope) else rope_rows(model, positions)
    h = rms_norm(x, layer.attn_norm, cfg.norm_eps)
    qkv = linear(h, layer.wqkv.weight, batch_invariant).view(n, 3, cfg.n_heads, cfg.head_dim)
    qk = apply_rope(qkv[:, :2], rope.cos[:, None], rope.sin[:, None])  # [N,2,H,D]
    hi = cfg.index_heads
    qi = linear(h, layer.idx_q.weight, batch_invariant).view(n, hi, cfg.index_dim)
    ki = linear(h, layer.idx_k.weight, batch_invariant)  # [N,Di]
    qki = apply_rope(torch.cat([qi, ki[:, None]], 1), rope.icos[:, None], rope.isin[:, None])
    w = linear(h, layer.idx_w.weight, batch_invariant)
    return AttnInputs(q=qk[:, 0], k=qk[:, 1], v=qkv[:, 2].contiguous(), qi=qki[:, :hi],
                      ki=qki[:, hi], w=w)


def finish_layer(model: TinyDeepSeek, layer: Layer, x: torch.Tensor, o: torch.Tensor,
                 batch_invariant: bool) -> torch.Tensor:
    """Residual attention output and SwiGLU FFN: x [N,d], o [N,H,D] -> [N,d]."""
    cfg = model.cfg
    x = x + linear(o.reshape(x.shape[0], -1), layer.wo.weight, batch_invariant)
    gu = linear(rms_norm(x, layer.ffn_norm, cfg.norm_eps), layer.w13.weight, batch_invariant)
    g, u = gu.chunk(2, -1)
    return x + linear(F.silu(g) * u, layer.w2.weight, batch_invariant)


def logits(model: TinyDeepSeek, x: torch.Tensor, batch_invariant: bool) -> torch.Tensor:
    """x [N,d] -> [N,V] with the tied embedding."""
    h = rms_norm(x, model.final_norm, model.cfg.norm_eps)
    return linear(h, model.tok_emb.weight, batch_invariant)
