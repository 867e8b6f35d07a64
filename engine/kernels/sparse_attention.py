"""Sparse paged attention over the key positions chosen by the indexer.

For query row ``n`` and head ``h``, with ``L = length[n]`` selected positions
``pos[n, :L]``::

    out[n, h] = sum_j softmax_j(scale * q[n, h] . k_j) * v_j,  j < L

where position ``p`` of row ``n`` lives at page ``page_table[n, p // S]``, slot ``p % S`` of
``k_cache``/``v_cache`` ``[P,S,H,D]``. Rows with ``L == 0`` give zeros.

Invariants callers must uphold (not checked, to avoid device syncs): selected positions and the
pages they map to are in range; entries of ``pos`` past ``length`` are never dereferenced.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.index_k_quant import kernel_view, load_f32, storage_kind
from engine.kernels.indexer import TopK

_KV_DTYPES = (torch.float32, torch.bfloat16)


def attend_selected(q: torch.Tensor, k_sel: torch.Tensor, v_sel: torch.Tensor,
                    valid: torch.Tensor, scale: float) -> torch.Tensor:
    """Contiguous masked attention: ``[N,H,D]`` fp32; rows with no valid key give zeros.

    ``q [N,H,D]``, ``k_sel``/``v_sel [N,K,H,D]`` fp32, ``valid [N,K]`` bool. Uses elementwise ops
    and reductions whose order depends only on K and D, so each row is bitwise independent of
    the batch it is computed in.
    """
    n, h, d = q.shape
    if k_sel.shape != v_sel.shape or k_sel.dim() != 4 or k_sel.shape[0] != n \
            or k_sel.shape[2:] != (h, d):
        raise ValueError(f"attend_selected shape mismatch: q {tuple(q.shape)}, "
                         f"k_sel {tuple(k_sel.shape)}, v_sel {tuple(v_sel.shape)}")
    if valid.shape != k_sel.shape[:2]:
        raise ValueError(f"valid must be {tuple(k_sel.shape[:2])}, got {tuple(valid.shape)}")
    logits = (k_sel * q[:, None]).sum(dim=-1) * scale  # [N,K,H]
    logits = logits.masked_fill(~valid[:, :, None], float("-inf"))
    m = logits.amax(dim=1, keepdim=True) if logits.shape[1] > 0 else logits[:, :1]  # [N,1,H]
    m = torch.where(torch.isfinite(m), m, 0.0)
    p = torch.exp(logits - m)  # [N,K,H], 0 where invalid
    denom = p.sum(dim=1)  # [N,H]
    acc = (p[..., None] * v_sel).sum(dim=1)  # [N,H,D]
    some = denom > 0  # [N,H]
    safe = torch.where(some, denom, 1.0)  # [N,H]
    return torch.where(some[..., None], acc / safe[..., None], 0.0)


def _check_inputs(q, k_cache, v_cache, page_table, topk, scale) -> None:
    if not isinstance(topk, TopK):
        raise ValueError(f"topk must be a TopK, got {type(topk).__name__}")
    dev = q.device
    named = {"k_cache": k_cache, "v_cache": v_cache, "page_table": page_table,
             "topk.pos": topk.pos, "topk.length": topk.length}
    for name, t in named.items():
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but q is on {dev}")
    if q.dim() != 3 or q.dtype != torch.float32:
        raise ValueError(f"q must be float32 [N,H,D], got {q.dtype} {tuple(q.shape)}")
    n, h, d = q.shape
    if k_cache.dim() != 4 or k_cache.shape[2:] != (h, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache/v_cache must both be [P,S,{h},{d}], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.dtype not in _KV_DTYPES or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"k_cache/v_cache must share a dtype in {_KV_DTYPES}, "
                         f"got {k_cache.dtype} and {v_cache.dtype}")
    if page_table.dim() != 2 or page_table.shape[0] != n or page_table.dtype != torch.int32:
        raise ValueError(f"page_table must be int32 [{n},max_pages], "
                         f"got {page_table.dtype} {tuple(page_table.shape)}")
    pos, length = topk.pos, topk.length
    if pos.dim() != 2 or pos.shape[0] != n or pos.dtype != torch.int32:
        raise ValueError(f"topk.pos must be int32 [{n},k], got {pos.dtype} {tuple(pos.shape)}")
    if length.shape != (n,) or length.dtype != torch.int32:
        raise ValueError(f"topk.length must be int32 [{n}], got {length.dtype} "
                         f"{tuple(length.shape)}")
    if not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a Python float, got {type(scale).__name__}")


def gather_selected(k_cache, v_cache, page_table, topk):
    """Selected K/V upcast to fp32 ``[N,K,H,D]`` each, and the valid mask ``[N,K]``.

    Entries past ``length`` read slot 0 of page 0 (never dereferenced by callers).
    """
    pos = topk.pos.long()  # [N,K]
    n, kk = pos.shape
    page_size = k_cache.shape[1]
    valid = torch.arange(kk, device=pos.device)[None, :] < topk.length[:, None]  # [N,K]
    pages = torch.gather(page_table.long(), 1, pos // page_size)  # [N,K]
    flat = torch.where(valid, pages * page_size + pos % page_size, 0).view(-1)  # [N*K]
    shape = (n, kk, *k_cache.shape[2:])

    def take(cache: torch.Tensor) -> torch.Tensor:
        rows = cache.reshape(-1, *cache.shape[2:])  # [P*S,H,D]
        return rows.index_select(0, flat).view(shape).float()  # [N,K,H,D]

    return take(k_cache), take(v_cache), valid


def sparse_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         page_table: torch.Tensor, topk: TopK, scale: float) -> torch.Tensor:
    """Torch reference: gather the selected K/V from pages, then ``attend_selected``."""
    _check_inputs(q, k_cache, v_cache, page_table, topk, scale)
    k_sel, v_sel, valid = gather_selected(k_cache, v_cache, page_table, topk)
    return attend_selected(q, k_sel, v_sel, valid, float(scale))


@triton.jit
def _sparse_attn_kernel(q_ptr, k_ptr, v_ptr, pt_ptr, pos_ptr, len_ptr, out_ptr,
                        D, S, scale,
                        sq_n, sq_h, sk_p, sk_s, sk_h, sv_p, sv_s, sv_h,
                        spt_n, spt_p, spos_n, so_n, so_h,
                        KIND: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q = tl.load(q_ptr + row * sq_n + head * sq_h + offs_d, mask=dmask, other=0.0)  # [BLOCK_D]
    length = tl.load(len_ptr + row)
    m_i = tl.full([], float("-inf"), tl.float32)
    l_i = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j0 in range(0, length, BLOCK_K):
        offs_j = j0 + tl.arange(0, BLOCK_K)  # [BLOCK_K]
        jmask = offs_j < length
        pos = tl.load(pos_ptr + row * spos_n + offs_j, mask=jmask, other=0)
        page = tl.load(pt_ptr + row * spt_n + (pos // S) * spt_p, mask=jmask, other=0)
        slot = pos % S
        kvmask = jmask[:, None] & dmask[None, :]  # [BLOCK_K,BLOCK_D]
        kptrs = k_ptr + page[:, None] * sk_p + slot[:, None] * sk_s + head * sk_h + offs_d[None, :]
        keys = load_f32(kptrs, kvmask, KIND)  # [BLOCK_K,BLOCK_D]
        s = tl.sum(keys * q[None, :], axis=1) * scale  # [BLOCK_K]
        s = tl.where(jmask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))  # finite: the block has a valid entry
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)  # [BLOCK_K]
        vptrs = v_ptr + page[:, None] * sv_p + slot[:, None] * sv_s + head * sv_h + offs_d[None, :]
        vals = load_f32(vptrs, kvmask, KIND)  # [BLOCK_K,BLOCK_D]
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * vals, axis=0)
        m_i = m_new
    denom = tl.where(l_i > 0.0, l_i, 1.0)
    out = tl.where(l_i > 0.0, acc / denom, 0.0)  # [BLOCK_D]
    tl.store(out_ptr + row * so_n + head * so_h + offs_d, out, mask=dmask)


def _check_strides(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} needs unit stride on its last dim, got strides {t.stride()}")


def sparse_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            page_table: torch.Tensor, topk: TopK, scale: float) -> torch.Tensor:
    """Triton sparse attention, same contract as ``sparse_attention_ref`` (fp32 rounding only).

    One program per (query row, head); it walks the selected positions in blocks, reads K/V
    through ``page_table`` and keeps an online softmax. bf16 caches are read as int16 bits.
    """
    _check_inputs(q, k_cache, v_cache, page_table, topk, scale)
    _check_strides(q=q, k_cache=k_cache, v_cache=v_cache, pos=topk.pos, length=topk.length)
    n, h, d = q.shape
    out = torch.empty((n, h, d), dtype=torch.float32, device=q.device)  # [N,H,D]
    if n == 0 or h == 0:
        return out
    kind = storage_kind(k_cache, "k_cache")  # fp32 or bf16 (checked above)
    block_k = min(32, triton.next_power_of_2(max(topk.pos.shape[1], 1)))
    _sparse_attn_kernel[(n, h)](
        q, kernel_view(k_cache), kernel_view(v_cache), page_table, topk.pos, topk.length, out,
        d, k_cache.shape[1], float(scale),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0), page_table.stride(1), topk.pos.stride(0), out.stride(0),
        out.stride(1),
        KIND=kind, BLOCK_K=block_k, BLOCK_D=triton.next_power_of_2(max(d, 1)))
    return out
