"""Attention-path kernels (index-K quantization, lightning indexer, sparse attention).

Each kernel has a torch reference (``*_ref``) and a Triton version. Pick a whole set by name
with ``get_kernels("torch" | "triton")``; unknown names raise ``UnknownVariantError`` listing
the valid ones. The Triton variant runs on CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.kernels.index_k_quant import (
    INDEX_K_TORCH_DTYPES,
    KV_TORCH_DTYPES,
    QuantizedIndexK,
    dequantize_index_k_ref,
    dequantize_index_k_triton,
    quantize_index_k_ref,
    quantize_index_k_triton,
)
from engine.kernels.indexer import (
    TopK,
    index_scores,
    indexer_topk_ref,
    indexer_topk_triton,
    select_topk,
)
from engine.kernels.sparse_attention import (
    attend_selected,
    sparse_attention_ref,
    sparse_attention_triton,
)
from engine.registry import Registry


@dataclass(frozen=True)
class KernelSet:
    """One implementation of every attention-path kernel; all members share one contract.

    ``quantize_index_k(x [N,Di] fp32, dtype) -> QuantizedIndexK``,
    ``dequantize_index_k(values, scale) -> [N,Di] fp32``,
    ``indexer_topk(q_idx, w, index_k, index_k_scale, page_table, seq_lens, k) -> TopK``,
    ``sparse_attention(q, k_cache, v_cache, page_table, topk, scale) -> [N,H,D] fp32``.
    """

    name: str
    quantize_index_k: Callable[..., QuantizedIndexK]
    dequantize_index_k: Callable[..., torch.Tensor]
    indexer_topk: Callable[..., TopK]
    sparse_attention: Callable[..., torch.Tensor]


KERNELS: Registry[KernelSet] = Registry("kernel set")
KERNELS.register("torch", KernelSet(
    name="torch",
    quantize_index_k=quantize_index_k_ref,
    dequantize_index_k=dequantize_index_k_ref,
    indexer_topk=indexer_topk_ref,
    sparse_attention=sparse_attention_ref,
))
KERNELS.register("triton", KernelSet(
    name="triton",
    quantize_index_k=quantize_index_k_triton,
    dequantize_index_k=dequantize_index_k_triton,
    indexer_topk=indexer_topk_triton,
    sparse_attention=sparse_attention_triton,
))


def get_kernels(name: str) -> KernelSet:
    """The kernel set registered as ``name``; raises ``UnknownVariantError`` listing valid ones."""
    return KERNELS.get(name)


__all__ = [
    "INDEX_K_TORCH_DTYPES",
    "KV_TORCH_DTYPES",
    "KERNELS",
    "KernelSet",
    "QuantizedIndexK",
    "TopK",
    "attend_selected",
    "dequantize_index_k_ref",
    "dequantize_index_k_triton",
    "get_kernels",
    "index_scores",
    "indexer_topk_ref",
    "indexer_topk_triton",
    "quantize_index_k_ref",
    "quantize_index_k_triton",
    "select_topk",
    "sparse_attention_ref",
    "sparse_attention_triton",
]
