"""A Llama decoder with Hugging Face parameter names, for serving by real engines (vLLM).

Same sizes as the shipped tiny DeepSeek minus what Llama lacks (indexer, previous-token
embedding): RMSNorm, RoPE in HF's half-split layout, SwiGLU, tied embeddings. ``from_deepseek``
warm-starts it from a ``TinyDeepSeek`` (q/k rows permuted from interleaved to half-split RoPE, so
dense attention scores are unchanged); ``state_dict()`` keys are exactly ``LlamaForCausalLM``'s.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.model.model import TinyDeepSeek, rms_norm


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def half_split_rope(dim: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, dim] in HF's layout (frequencies repeated over both halves)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos().float(), ang.sin().float()


class Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)


class Mlp(nn.Module):
    def __init__(self, d: int, ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.Parameter(torch.ones(cfg.d_model))
        self.self_attn = Attention(cfg.d_model)
        self.post_attention_layernorm = nn.Parameter(torch.ones(cfg.d_model))
        self.mlp = Mlp(cfg.d_model, cfg.d_ff)


class Body(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.Parameter(torch.ones(cfg.d_model))


class TinyLlama(nn.Module):
    """``forward(tokens [B,T]) -> (logits [B,T,V], zero)``: the trainer's model interface (the
    second value is the auxiliary loss, which Llama does not have)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        cos, sin = half_split_rope(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens: torch.Tensor, **_) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, (B, T) = self.cfg, tokens.shape
        x = self.model.embed_tokens(tokens)
        cos, sin = self.cos[:T], self.sin[:T]  # [T,Dh]
        for blk in self.model.layers:
            h = _norm(x, blk.input_layernorm, cfg)
            a = blk.self_attn
            q, k, v = (p(h).view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
                       for p in (a.q_proj, a.k_proj, a.v_proj))  # [B,H,T,Dh]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, -1))
            m = blk.mlp
            h = _norm(x, blk.post_attention_layernorm, cfg)
            x = x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))
        logits = _norm(x, self.model.norm, cfg) @ self.model.embed_tokens.weight.T
        return logits, x.new_zeros(())


def _norm(x: torch.Tensor, w: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    return rms_norm(x, w, cfg.norm_eps)


def interleaved_to_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows [H*Dh, in] of a q/k projection: per head, (x0,x1,x2,x3,..) -> (x0,x2,..,x1,x3,..)."""
    out, inp = w.shape
    dh = out // n_heads
    perm = torch.cat((torch.arange(0, dh, 2), torch.arange(1, dh, 2)))
    return w.view(n_heads, dh, inp)[:, perm].reshape(out, inp)


@torch.no_grad()
def from_deepseek(src: TinyDeepSeek) -> TinyLlama:
    """A Llama holding ``src``'s shared weights (the indexer and prev-token embedding dropped)."""
    cfg = src.cfg
    dst = TinyLlama(cfg)
    dst.model.embed_tokens.weight.copy_(src.tok_emb.weight)
    dst.model.norm.copy_(src.final_norm)
    for s, d in zip(src.layers, dst.model.layers, strict=True):
        q, k, v = s.wqkv.weight.chunk(3, 0)
        d.self_attn.q_proj.weight.copy_(interleaved_to_half(q, cfg.n_heads))
        d.self_attn.k_proj.weight.copy_(interleaved_to_half(k, cfg.n_heads))
        d.self_attn.v_proj.weight.copy_(v)
        d.self_attn.o_proj.weight.copy_(s.wo.weight)
        gate, up = s.w13.weight.chunk(2, 0)
        d.mlp.gate_proj.weight.copy_(gate)
        d.mlp.up_proj.weight.copy_(up)
        d.mlp.down_proj.weight.copy_(s.w2.weight)
        d.input_layernorm.copy_(s.attn_norm)
        d.post_attention_layernorm.copy_(s.ffn_norm)
    return dst


def hf_state_dict(model: TinyLlama) -> dict[str, torch.Tensor]:
    """``LlamaForCausalLM`` names (norm weights gain ``.weight``; lm_head is tied, not saved)."""
    out = {}
    for name, t in model.state_dict().items():
        if name.endswith("layernorm") or name == "model.norm":
            name += ".weight"
        out[name] = t.contiguous()
    return out
