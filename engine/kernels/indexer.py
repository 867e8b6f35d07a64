"""Lightning indexer: per-position logits over a paged index-K cache, then top-k selection.

Score of key position ``p`` for query row ``n``::

    score[n, p] = sum_h w[n, h] * relu(dot(q_idx[n, h], dequant(index_k at p)))

where position ``p`` of row ``n`` lives at page ``page_table[n, p // S]``, slot ``p % S``, and
row ``n`` sees positions ``0 .. seq_lens[n]-1``. Heads are accumulated in order ``h = 0, 1, ...``.

Invariants callers must uphold (not checked, to avoid device syncs): ``0 <= seq_lens[n] <=
max_pages * S`` and every page id a row uses is in ``[0, P)``; page-table entries past a row's
length are never dereferenced and may hold anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.kernels.index_k_quant import kernel_view, load_f32, storage_kind, upcast_f32


@dataclass(frozen=True)
class TopK:
    """Selected key positions: ``pos [N,k] int32``, ``length [N] int32``.

    ``pos[n, :length[n]]`` holds the ``length[n] = min(k, #valid)`` best positions sorted by
    position ascending; ``pos[n, length[n]:]`` is 0.
    """

    pos: torch.Tensor
    length: torch.Tensor


def index_scores(q_idx: torch.Tensor, w: torch.Tensor, keys: torch.Tensor,
                 valid: torch.Tensor) -> torch.Tensor:
    """Contiguous indexer logits: ``[N,S]`` fp32, ``-inf`` where ``valid`` is False.

    ``q_idx [N,Hi,Di]``, ``w [N,Hi]``, ``keys [N,S,Di]`` fp32, ``valid [N,S]`` bool. Built from
    elementwise ops and last-dim reductions only, so each row's result is bitwise independent
    of the other rows in the batch.
    """
    n, hi, di = q_idx.shape
    if w.shape != (n, hi) or keys.dim() != 3 or keys.shape[0] != n or keys.shape[2] != di:
        raise ValueError(f"index_scores shape mismatch: q_idx {tuple(q_idx.shape)}, "
                         f"w {tuple(w.shape)}, keys {tuple(keys.shape)}")
    if valid.shape != keys.shape[:2]:
        raise ValueError(f"valid must be {tuple(keys.shape[:2])}, got {tuple(valid.shape)}")
    scores = torch.zeros(keys.shape[:2], dtype=torch.float32, device=keys.device)  # [N,S]
    for h in range(hi):
        dots = (keys * q_idx[:, h, None, :]).sum(dim=-1)  # [N,S]
        scores = scores + w[:, h, None] * torch.relu(dots)
    return scores.masked_fill(~valid, float("-inf"))


def select_topk(scores: torch.Tensor, k: int) -> TopK:
    """Top-``k`` of ``scores [N,S]`` (``-inf`` marks invalid; valid scores must be > -inf).

    Picks the ``min(k, #valid)`` highest scores per row, ties broken toward the lower position
    (stable descending sort), then returns them sorted by position ascending, zero padded.
    """
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be [N,S], got shape {tuple(scores.shape)}")
    n, s = scores.shape
    kk = min(k, s)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :kk]  # [N,kk]
    length = (scores > float("-inf")).sum(dim=-1).clamp_max(kk)  # [N]
    keep = torch.arange(kk, device=scores.device)[None, :] < length[:, None]  # [N,kk]
    chosen = torch.sort(torch.where(keep, order, s), dim=-1).values  # [N,kk]
    pos = torch.where(keep, chosen, 0).to(torch.int32)  # [N,kk]
    if kk < k:
        pos = torch.cat([pos, pos.new_zeros((n, k - kk))], dim=1)  # [N,k]
    return TopK(pos=pos, length=length.to(torch.int32))


def _check_inputs(q_idx, w, index_k, index_k_scale, page_table, seq_lens, k) -> None:
    dev = q_idx.device
    named = {"q_idx": q_idx, "w": w, "index_k": index_k, "index_k_scale": index_k_scale,
             "page_table": page_table, "seq_lens": seq_lens}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but q_idx is on {dev}")
    if q_idx.dim() != 3 or q_idx.dtype != torch.float32:
        raise ValueError(f"q_idx must be float32 [N,Hi,Di], got {q_idx.dtype} {tuple(q_idx.shape)}")
    n, hi, di = q_idx.shape
    if w.shape != (n, hi) or w.dtype != torch.float32:
        raise ValueError(f"w must be float32 [{n},{hi}], got {w.dtype} {tuple(w.shape)}")
    if index_k.dim() != 3 or index_k.shape[2] != di:
        raise ValueError(f"index_k must be [P,S,{di}], got {tuple(index_k.shape)}")
    storage_kind(index_k, "index_k")
    if index_k_scale.shape != index_k.shape[:2] or index_k_scale.dtype != torch.float32:
        raise ValueError(f"index_k_scale must be float32 {tuple(index_k.shape[:2])}, "
                         f"got {index_k_scale.dtype} {tuple(index_k_scale.shape)}")
    if page_table.dim() != 2 or page_table.shape[0] != n or page_table.dtype != torch.int32:
        raise ValueError(f"page_table must be int32 [{n},max_pages], "
                         f"got {page_table.dtype} {tuple(page_table.shape)}")
    if seq_lens.shape != (n,) or seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32 [{n}], got {seq_lens.dtype} "
                         f"{tuple(seq_lens.shape)}")
    if not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")


def _check_strides(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} needs unit stride on its last dim, got strides {t.stride()}")


def _row_groups(page_table: torch.Tensor, seq_lens: torch.Tensor):
    """Runs of consecutive rows with identical page-table rows (a sequence's tokens).

    Returns ``first [G]`` (each group's first row), ``group [N]`` (each row's group; None when
    ``N <= 1``) and ``group_len [G]`` (the longest ``seq_lens`` in the group). Reads ``G`` on
    the host.
    """
    n = page_table.shape[0]
    if n <= 1:
        return torch.arange(n, device=page_table.device), None, seq_lens
    starts = torch.ones(n, dtype=torch.bool, device=page_table.device)  # [N]
    starts[1:] = (page_table[1:] != page_table[:-1]).any(dim=1)
    group = torch.cumsum(starts, 0) - 1  # [N]
    first = torch.nonzero(starts).view(-1)  # [G]
    group_len = torch.zeros(first.shape[0], dtype=seq_lens.dtype, device=seq_lens.device)
    group_len.scatter_reduce_(0, group, seq_lens, "amax")  # [G]
    return first, group, group_len


def gather_index_keys(index_k, index_k_scale, page_table, seq_lens):
    """Dequantized keys ``[N,S_max,Di]`` fp32 and valid mask ``[N,S_max]``; S_max = max_pages*S.

    Rows that share a page table (consecutive rows of one sequence) share one dequantized copy:
    the result is an expanded view when every row does. Keys at invalid positions are
    arbitrary (callers mask them); valid ones are ``dequant(index_k)`` bit for bit.
    """
    n, width = page_table.shape
    page_size, di = index_k.shape[1], index_k.shape[2]
    s_max = width * page_size
    p = torch.arange(s_max, device=page_table.device)  # [S_max]
    valid = p[None, :] < seq_lens[:, None].long()  # [N,S_max]
    first, group, group_len = _row_groups(page_table, seq_lens)
    col = torch.arange(width, device=page_table.device) * page_size  # [W]
    used = col[None, :] < group_len[:, None].long()  # [G,W] pages holding a visible position
    pages = torch.where(used, page_table.index_select(0, first), 0).long().view(-1)  # [G*W]
    values = upcast_f32(index_k.index_select(0, pages))  # [G*W,S,Di]
    scale = index_k_scale.index_select(0, pages)  # [G*W,S]
    keys = (values * scale[..., None]).view(first.shape[0], s_max, di)  # [G,S_max,Di]
    if keys.shape[0] == n:
        return keys, valid
    if keys.shape[0] == 1:
        return keys.expand(n, s_max, di), valid
    return keys.index_select(0, group), valid


def indexer_topk_ref(q_idx: torch.Tensor, w: torch.Tensor, index_k: torch.Tensor,
                     index_k_scale: torch.Tensor, page_table: torch.Tensor,
                     seq_lens: torch.Tensor, k: int) -> TopK:
    """Torch reference: gather + dequantize keys, then ``index_scores`` and ``select_topk``."""
    _check_inputs(q_idx, w, index_k, index_k_scale, page_table, seq_lens, k)
    keys, valid = gather_index_keys(index_k, index_k_scale, page_table, seq_lens)
    return select_topk(index_scores(q_idx, w, keys, valid), k)


@triton.jit
def _logits_kernel(q_ptr, w_ptr, k_ptr, ks_ptr, pt_ptr, len_ptr, out_ptr,
                   Hi, Di, S, s_max,
                   sq_n, sq_h, sw_n, sk_p, sk_s, sks_p, sks_s, spt_n, spt_p, so_n,
                   KIND: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)  # [BLOCK_P]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    seq_len = tl.load(len_ptr + row)
    valid = offs_p < seq_len  # [BLOCK_P]
    page = tl.load(pt_ptr + row * spt_n + (offs_p // S) * spt_p, mask=valid, other=0)
    slot = offs_p % S
    kmask = valid[:, None] & (offs_d[None, :] < Di)  # [BLOCK_P,BLOCK_D]
    kptrs = k_ptr + page[:, None] * sk_p + slot[:, None] * sk_s + offs_d[None, :]
    kscale = tl.load(ks_ptr + page * sks_p + slot * sks_s, mask=valid, other=0.0)  # [BLOCK_P]
    keys = load_f32(kptrs, kmask, KIND) * kscale[:, None]  # [BLOCK_P,BLOCK_D]
    score = tl.zeros([BLOCK_P], dtype=tl.float32)
    for h in range(Hi):
        q = tl.load(q_ptr + row * sq_n + h * sq_h + offs_d, mask=offs_d < Di, other=0.0)
        dots = tl.sum(keys * q[None, :], axis=1)  # [BLOCK_P]
        score += tl.load(w_ptr + row * sw_n + h) * tl.maximum(dots, 0.0)
    score = tl.where(valid, score, float("-inf"))
    tl.store(out_ptr + row * so_n + offs_p, score, mask=offs_p < s_max)


def indexer_logits_triton(q_idx: torch.Tensor, w: torch.Tensor, index_k: torch.Tensor,
                          index_k_scale: torch.Tensor, page_table: torch.Tensor,
                          seq_lens: torch.Tensor) -> torch.Tensor:
    """Triton indexer logits ``[N, max_pages*S]`` fp32 read straight from the paged cache.

    Dequantizes in-kernel; ``-inf`` at positions ``>= seq_lens[n]``. Matches ``index_scores`` on
    the gathered keys up to fp32 summation order (not bitwise).
    """
    _check_inputs(q_idx, w, index_k, index_k_scale, page_table, seq_lens, 1)
    _check_strides(q_idx=q_idx, w=w, index_k=index_k, seq_lens=seq_lens)
    n, hi, di = q_idx.shape
    s = index_k.shape[1]
    s_max = page_table.shape[1] * s
    out = torch.empty((n, s_max), dtype=torch.float32, device=q_idx.device)  # [N,S_max]
    if n == 0 or s_max == 0:
        return out
    block_p = min(64, triton.next_power_of_2(s_max))
    grid = (n, triton.cdiv(s_max, block_p))
    _logits_kernel[grid](
        q_idx, w, kernel_view(index_k), index_k_scale, page_table, seq_lens, out,
        hi, di, s, s_max,
        q_idx.stride(0), q_idx.stride(1), w.stride(0), index_k.stride(0), index_k.stride(1),
        index_k_scale.stride(0), index_k_scale.stride(1), page_table.stride(0),
        page_table.stride(1), out.stride(0),
        KIND=storage_kind(index_k, "index_k"), BLOCK_P=block_p,
        BLOCK_D=triton.next_power_of_2(max(di, 1)))
    return out


def indexer_topk_triton(q_idx: torch.Tensor, w: torch.Tensor, index_k: torch.Tensor,
                        index_k_scale: torch.Tensor, page_table: torch.Tensor,
                        seq_lens: torch.Tensor, k: int) -> TopK:
    """Triton indexer: logits via ``indexer_logits_triton``, then top-k via torch ``select_topk``.

    Same contract as ``indexer_topk_ref``; the selection step is the shared torch function, so
    results differ from the reference only where logits tie within fp32 rounding.
    """
    _check_inputs(q_idx, w, index_k, index_k_scale, page_table, seq_lens, k)
    logits = indexer_logits_triton(q_idx, w, index_k, index_k_scale, page_table, seq_lens)
    return select_topk(logits, k)
