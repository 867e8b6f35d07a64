"""Kernel fault injection: a kernel set whose op misbehaves on a seeded, input-dependent
fraction of calls (a flaky culprit for ``bisect`` / ``ddmin`` over kernel variants)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import torch

from engine.kernels import KernelSet, QuantizedIndexK, TopK
from workbench.studies.kernels import OPS, resolve_kernels

_PERTURB = {
    "quantize_index_k": lambda out, eps: QuantizedIndexK(out.values, out.scale * (1 + eps)),
    "dequantize_index_k": lambda out, eps: out + eps,
    "indexer_topk": lambda out, eps: _drop_last(out),
    "sparse_attention": lambda out, eps: out + eps,
}


def _drop_last(out: TopK) -> TopK:
    """Forget each row's highest selected position (a valid TopK: in range, zero padded)."""
    length = (out.length - 1).clamp_min(0)
    keep = torch.arange(out.pos.shape[1])[None, :] < length[:, None]
    return TopK(torch.where(keep, out.pos, 0), length)


def _uniform(seed: int, op: str, args: tuple) -> float:
    """U[0, 1) from ``seed`` and the bytes of the call's arguments (deterministic per input)."""
    h = hashlib.blake2b(f"{seed}\x1f{op}".encode(), digest_size=8)
    for arg in args:
        for t in (arg.pos, arg.length) if isinstance(arg, TopK) else (arg,):
            if isinstance(t, torch.Tensor):
                h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
            else:
                h.update(repr(t).encode())
    return int.from_bytes(h.digest(), "big") / 2.0**64


def perturb_op(kernels: str | KernelSet, op: str, *, p: float = 1.0, seed: int = 0,
               eps: float = 1e-2, name: str | None = None) -> KernelSet:
    """Fault injection: ``kernels`` whose ``op`` output is perturbed with probability ``p``.

    Whether a call is perturbed is a pure function of ``(seed, op, argument bytes)``, so the
    fault is flaky across inputs but reproducible for a seeded comparison.  Perturbations:
    scale ``*(1+eps)`` (quantize), ``+eps`` (dequantize, attention), drop each row's last
    selected position (top-k).  Hashes the arguments when ``p < 1`` (cost grows with caches).
    """
    if op not in OPS:
        raise ValueError(f"unknown kernel op {op!r}; valid: {', '.join(OPS)}")
    base = resolve_kernels(kernels)
    fn = getattr(base, op)

    def perturbed(*args):
        out = fn(*args)
        return _PERTURB[op](out, eps) if p >= 1 or _uniform(seed, op, args) < p else out

    return replace(base, name=name or f"{base.name}~{op}@{p:g}", **{op: perturbed})
