"""Paged KV pool and index-K pool, one tensor per kind holding every layer.

Layout (page-major inside each layer, so one layer's page is one contiguous byte range):
  k, v           [L, P, S, H, D]   kv dtype
  index_k        [L, P, S, Di]     index-K storage dtype (fp8 e4m3 / bf16 / fp32)
  index_k_scale  [L, P, S]         fp32 per-token dequantization scale
A token at logical position p of a request lives at page ``page_table[p // S]``, slot ``p % S``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from engine.config import EngineConfig, ModelConfig
from engine.kernels import INDEX_K_TORCH_DTYPES, KV_TORCH_DTYPES


class OutOfPagesError(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""


class PageAllocator:
    """FIFO free list with reference counts; page ids are ``0..num_pages-1``.

    Invariant: a page is free iff its refcount is 0; ``free`` of a page at refcount 0 raises.
    FIFO reuse (oldest freed first) is what a busy server sees: a new owner's pages hold some
    earlier request's data, so a read-before-write reads plausible but wrong values.
    """

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self.refcount = [0] * num_pages
        self._free: deque[int] = deque(range(num_pages))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPagesError(f"need {n} pages, {len(self._free)} free")
        pages = [self._free.popleft() for _ in range(n)]
        for p in pages:
            self.refcount[p] = 1
        return pages

    def share(self, pages: list[int]) -> None:
        for p in pages:
            if self.refcount[p] <= 0:
                raise ValueError(f"share of free page {p}")
            self.refcount[p] += 1

    def free(self, pages: list[int]) -> None:
        for p in pages:
            if self.refcount[p] <= 0:
                raise ValueError(f"double free of page {p}")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self._free.append(p)


@dataclass
class KVPool:
    """The device buffers. Build with ``KVPool.create``."""

    k: torch.Tensor
    v: torch.Tensor
    index_k: torch.Tensor
    index_k_scale: torch.Tensor
    page_size: int

    @classmethod
    def create(cls, mcfg: ModelConfig, ecfg: EngineConfig) -> KVPool:
        L, P, S = mcfg.n_layers, ecfg.num_pages, ecfg.page_size
        dev, kvd = torch.device(ecfg.device), KV_TORCH_DTYPES[ecfg.kv_dtype]
        shape = (L, P, S, mcfg.n_heads, mcfg.head_dim)
        idx_dtype = INDEX_K_TORCH_DTYPES[ecfg.index_k_dtype]
        return cls(
            k=torch.zeros(shape, dtype=kvd, device=dev),
            v=torch.zeros(shape, dtype=kvd, device=dev),
            index_k=torch.zeros((L, P, S, mcfg.index_dim), dtype=idx_dtype, device=dev),
            index_k_scale=torch.ones((L, P, S), dtype=torch.float32, device=dev),
            page_size=S,
        )

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"k": self.k, "v": self.v, "index_k": self.index_k,
                "index_k_scale": self.index_k_scale}

    def write_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [N] flat (page * S + offset); k, v [N,H,D]."""
        kl = self.k[layer].view(-1, *self.k.shape[-2:])
        vl = self.v[layer].view(-1, *self.v.shape[-2:])
        kl[slots] = k.to(kl.dtype)
        vl[slots] = v.to(vl.dtype)

    def write_index_k(self, layer: int, slots: torch.Tensor, values: torch.Tensor,
                      scale: torch.Tensor) -> None:
        """slots [N]; values [N,Di] storage dtype; scale [N]."""
        self.index_k[layer].view(-1, self.index_k.shape[-1])[slots] = values
        self.index_k_scale[layer].view(-1)[slots] = scale

    def page_bytes(self) -> dict[str, int]:
        """Bytes of one page of one layer, per buffer."""
        return {name: t[0, 0].numel() * t.element_size() for name, t in self.buffers().items()}
