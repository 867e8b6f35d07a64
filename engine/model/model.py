"""Tiny DeepSeek-style decoder: RoPE attention restricted to indexer-selected top-k positions.

Per layer a lightning indexer scores every causal key position s for query t as
``sum_h w_h(t) * relu(q_h(t) . k(s))`` with one shared index key per token; attention then runs
over the top-k positions (ties broken toward the lower position). Inputs are the token embedding
plus a previous-token embedding (what makes copying learnable at this size). Embeddings are tied.

``TinyDeepSeek.forward`` is the full-sequence training path; serving uses ``engine.model_runner``
with the same weights and the same math.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.config import ModelConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_len, dim // 2] in fp32."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates pairs (x[2i], x[2i+1]); cos/sin broadcast to x[..., D/2] (e.g. [T,1,D/2])."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


def stable_topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the top-k entries along the last axis; ties prefer the lower index.

    Entries equal to -inf are never selected.
    """
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, order, True)
    return mask & torch.isfinite(scores)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, hi, di = cfg.d_model, cfg.index_heads, cfg.index_dim
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.idx_q = nn.Linear(d, hi * di, bias=False)
        self.idx_k = nn.Linear(d, di, bias=False)
        self.idx_w = nn.Linear(d, hi, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.w13 = nn.Linear(d, 2 * cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, d, bias=False)


class TinyDeepSeek(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.prev_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.Parameter(torch.ones(cfg.d_model))
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        icos, isin = rope_tables(cfg.index_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("icos", icos, persistent=False)
        self.register_buffer("isin", isin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def embed(self, tokens: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return self.tok_emb(tokens) + self.prev_emb(prev)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.final_norm, self.cfg.norm_eps) @ self.tok_emb.weight.T

    def index_scores(self, layer: Layer, h: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """h [B,T,d], query positions rows [R] -> causal index scores [B,R,T] (-inf if s > t)."""
        cfg = self.cfg
        B, T, _ = h.shape
        hq = h[:, rows]
        qi = layer.idx_q(hq).view(B, len(rows), cfg.index_heads, cfg.index_dim)
        qi = apply_rope(qi, self.icos[rows, None], self.isin[rows, None])
        ki = apply_rope(layer.idx_k(h), self.icos[:T], self.isin[:T])  # [B,T,Di]
        w = layer.idx_w(hq)  # [B,R,Hi]
        s = torch.relu(torch.einsum("brhd,bsd->brhs", qi, ki))
        s = (s * w[..., None]).sum(2)
        future = torch.arange(T, device=h.device)[None, :] > rows[:, None]
        return s.masked_fill(future, float("-inf"))

    def forward(self, tokens: torch.Tensor, sparse: bool = True, kl_rows: int = 64):
        """tokens [B,T] -> (logits [B,T,V], indexer KL loss on ``kl_rows`` sampled queries)."""
        cfg = self.cfg
        B, T = tokens.shape
        prev = F.pad(tokens[:, :-1], (1, 0), value=0)
        x = self.embed(tokens, prev)
        all_rows = torch.arange(T, device=tokens.device)
        rows = torch.randperm(T, device=tokens.device)[: min(kl_rows, T)].sort().values
        cos, sin = self.cos[:T, None], self.sin[:T, None]
        kl_total = x.new_zeros(())
        for layer in self.layers:
            h = rms_norm(x, layer.attn_norm, cfg.norm_eps)
            q, k, v = layer.wqkv(h).view(B, T, 3, cfg.n_heads, cfg.head_dim).unbind(2)
            q = apply_rope(q, cos, sin).transpose(1, 2)  # [B,H,T,Dh]
            k = apply_rope(k, cos, sin).transpose(1, 2)
            v = v.transpose(1, 2)
            if sparse:
                with torch.no_grad():
                    keep = stable_topk_mask(self.index_scores(layer, h, all_rows), cfg.index_topk)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None])
            else:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            kl_total = kl_total + self._indexer_kl(layer, h.detach(), q, k, rows)
            x = x + layer.wo(o.transpose(1, 2).reshape(B, T, -1))
            g, u = layer.w13(rms_norm(x, layer.ffn_norm, cfg.norm_eps)).chunk(2, -1)
            x = x + layer.w2(F.silu(g) * u)
        return self.logits(x), kl_total / cfg.n_layers

    def _indexer_kl(self, layer: Layer, h, q, k, rows) -> torch.Tensor:
        """KL(dense attention averaged over heads, detached || indexer distribution) on rows."""
        with torch.no_grad():
            att = (q[:, :, rows] @ k.transpose(-1, -2)) * self.cfg.head_dim ** -0.5
            future = torch.arange(k.shape[2], device=q.device)[None, :] > rows[:, None]
            target = att.masked_fill(future, float("-inf")).softmax(-1).mean(1)  # [B,R,T]
        logq = self.index_scores(layer, h, rows).log_softmax(-1)
        kl = target * (target.clamp_min(1e-9).log() - logq)
        return kl.masked_fill(future, 0.0).sum(-1).mean()


def load_model(weights: str | Path, config: str | Path | None = None) -> TinyDeepSeek:
    """Loads safetensors weights with their config.json (defaults to the weights' folder)."""
    from safetensors.torch import load_file

    weights = Path(weights)
    cfg = ModelConfig.load(config or weights.with_name("config.json"))
    model = TinyDeepSeek(cfg)
    model.load_state_dict(load_file(str(weights)))
    return model.eval()
