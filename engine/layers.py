"""Per-token layer math shared by the serving runner and the reference oracle.

Everything here is row-independent: the value computed for a token never depends on which other
tokens share the call. With ``batch_invariant=True`` linears use a batched GEMV, which (unlike a
plain GEMM on CPU) gives bitwise-identical rows for any batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model import Layer, TinyDeepSeek, apply_rope, rms_norm


def linear(x: torch.Tensor, w: torch.Tensor, batch_invariant: bool) -> torch.Tensor:
    """x [N,in], w [out,in] -> [N,out]."""
    if not batch_invariant:
        return F.linear(x, w)
    n = x.shape[0]
    return torch.bmm(x[:, None, :], w.T.expand(n, *w.T.shape)).squeeze(1)


@dataclass(frozen=True)
class AttnInputs:
    """Projections of one layer for N tokens."""

    q: torch.Tensor  # [N,H,D]
    k: torch.Tensor  # [N,H,D]
    v: torch.Tensor  # [N,H,D]
    qi: torch.Tensor  # [N,Hi,Di] index queries
    ki: torch.Tensor  # [N,Di] index keys (fp32, before storage quantization)
    w: torch.Tensor  # [N,Hi] index head weights


def embed(model: TinyDeepSeek, tokens: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """tokens, prev [N] -> x [N,d]."""
    return model.tok_emb.weight[tokens] + model.prev_emb.weight[prev]


def attn_inputs(model: TinyDeepSeek, layer: Layer, x: torch.Tensor, positions: torch.Tensor,
                batch_invariant: bool) -> AttnInputs:
    cfg = model.cfg
    n = x.shape[0]
    h = rms_norm(x, layer.attn_norm, cfg.norm_eps)
    qkv = linear(h, layer.wqkv.weight, batch_invariant).view(n, 3, cfg.n_heads, cfg.head_dim)
    cos, sin = model.cos[positions, None], model.sin[positions, None]
    q = apply_rope(qkv[:, 0], cos, sin)
    k = apply_rope(qkv[:, 1], cos, sin)
    icos, isin = model.icos[positions], model.isin[positions]
    qi = linear(h, layer.idx_q.weight, batch_invariant).view(n, cfg.index_heads, cfg.index_dim)
    qi = apply_rope(qi, icos[:, None], isin[:, None])
    ki = apply_rope(linear(h, layer.idx_k.weight, batch_invariant), icos, isin)
    w = linear(h, layer.idx_w.weight, batch_invariant)
    return AttnInputs(q=q, k=k, v=qkv[:, 2].contiguous(), qi=qi, ki=ki, w=w)


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
