"""Triton-vs-reference, semantics, validation and batch-invariance tests for engine.kernels."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (via engine.kernels)

from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from engine.kernels import (  # noqa: E402
    INDEX_K_TORCH_DTYPES,
    KernelSet,
    TopK,
    attend_selected,
    dequantize_index_k_ref,
    dequantize_index_k_triton,
    get_kernels,
    index_scores,
    indexer_topk_ref,
    indexer_topk_triton,
    quantize_index_k_ref,
    quantize_index_k_triton,
    select_topk,
    sparse_attention_ref,
    sparse_attention_triton,
)
from engine.kernels.indexer import indexer_logits_triton  # noqa: E402
from engine.registry import UnknownVariantError  # noqa: E402

N, HI, DI, H, D, S, P, MAX_PAGES = 5, 3, 24, 3, 20, 7, 13, 4
SEQ_LENS = [1, 9, 28, 13, 0]  # odd lengths, a full table (28 = 4*7) and an empty row
DTYPES = sorted(INDEX_K_TORCH_DTYPES)


@dataclass(frozen=True)
class Paged:
    """A small paged problem: index-K cache, KV caches, queries and a shuffled page table."""

    q_idx: torch.Tensor  # [N,HI,DI]
    w: torch.Tensor  # [N,HI]
    index_k: torch.Tensor  # [P,S,DI] storage dtype
    index_k_scale: torch.Tensor  # [P,S]
    k_cache: torch.Tensor  # [P,S,H,D]
    v_cache: torch.Tensor  # [P,S,H,D]
    q: torch.Tensor  # [N,H,D]
    page_table: torch.Tensor  # [N,MAX_PAGES] int32
    seq_lens: torch.Tensor  # [N] int32


def make_paged(index_dtype: str = "fp32", kv_dtype=torch.float32, seq_lens=SEQ_LENS,
               seed: int = 0) -> Paged:
    g = torch.Generator().manual_seed(seed)
    n = len(seq_lens)
    quant = quantize_index_k_ref(torch.randn(P * S, DI, generator=g), index_dtype)
    page_table = torch.stack([torch.randperm(P, generator=g)[:MAX_PAGES] for _ in range(n)])
    return Paged(
        q_idx=torch.randn(n, HI, DI, generator=g), w=torch.randn(n, HI, generator=g),
        index_k=quant.values.view(P, S, DI), index_k_scale=quant.scale.view(P, S),
        k_cache=torch.randn(P, S, H, D, generator=g).to(kv_dtype),
        v_cache=torch.randn(P, S, H, D, generator=g).to(kv_dtype),
        q=torch.randn(n, H, D, generator=g), page_table=page_table.to(torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32))


def topk_of(pb: Paged, k: int, fn=indexer_topk_ref) -> TopK:
    return fn(pb.q_idx, pb.w, pb.index_k, pb.index_k_scale, pb.page_table, pb.seq_lens, k)


def fp8_edge_rows() -> torch.Tensor:
    """Rows holding every fp8 value, every midpoint (ties) and near-midpoints, plus 448."""
    codes = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # [127]
    mids = (codes[1:] + codes[:-1]) / 2
    vals = torch.cat([codes, mids, mids * (1 + 1e-7), mids * (1 - 1e-7)])
    vals = torch.cat([vals, -vals])
    rows = -(-vals.numel() // (DI - 1))
    flat = torch.zeros(rows * (DI - 1))
    flat[: vals.numel()] = vals
    return torch.cat([flat.view(rows, DI - 1), torch.full((rows, 1), 448.0)], dim=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_triton_matches_ref_bitwise(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(7, DI, generator=g) * 30, torch.zeros(1, DI), fp8_edge_rows()])
    ref, tri = quantize_index_k_ref(x, dtype), quantize_index_k_triton(x, dtype)
    assert ref.values.dtype == tri.values.dtype == INDEX_K_TORCH_DTYPES[dtype]
    assert torch.equal(ref.values.view(torch.uint8), tri.values.view(torch.uint8))
    assert torch.equal(ref.scale, tri.scale)
    assert torch.equal(dequantize_index_k_ref(ref.values, ref.scale),
                       dequantize_index_k_triton(ref.values, ref.scale))


def test_quantize_ref_semantics():
    x = torch.randn(5, DI, generator=torch.Generator().manual_seed(0)) * 3
    x[1] = 0.0
    fp8 = quantize_index_k_ref(x, "fp8")
    expected = (x.abs().amax(-1) / 448).clamp_min(1e-8)
    assert torch.equal(fp8.scale, expected) and fp8.scale[1].item() == pytest.approx(1e-8)
    deq = dequantize_index_k_ref(fp8.values, fp8.scale)
    # e4m3: 3 mantissa bits (relative error <= 2^-4) down to its subnormals, whose absolute
    # error is half their step, 2^-10 of the scale
    bound = x.abs() * 2 ** -4 + fp8.scale[:, None] * 2 ** -10
    assert ((deq - x).abs() <= bound).all()
    for name in ("bf16", "fp32"):
        quant = quantize_index_k_ref(x, name)
        assert torch.equal(quant.scale, torch.ones(5))
        assert torch.equal(quant.values, x.to(INDEX_K_TORCH_DTYPES[name]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [4, 40])
def test_indexer_triton_matches_ref(dtype, k):
    pb = make_paged(dtype, seed=2)
    ref, tri = topk_of(pb, k), topk_of(pb, k, indexer_topk_triton)
    assert ref.pos.shape == (N, k) and ref.pos.dtype == torch.int32
    assert ref.length.tolist() == [min(k, s) for s in SEQ_LENS]
    assert torch.equal(ref.pos, tri.pos) and torch.equal(ref.length, tri.length)


def test_indexer_logits_match_index_scores():
    pb = make_paged("fp8", seed=3)
    logits = indexer_logits_triton(pb.q_idx, pb.w, pb.index_k, pb.index_k_scale,
                                   pb.page_table, pb.seq_lens)
    scores = brute_force_scores(pb)
    assert torch.equal(torch.isinf(logits), torch.isinf(scores))
    finite = ~torch.isinf(scores)
    assert torch.allclose(logits[finite], scores[finite], rtol=1e-5, atol=1e-5)


def brute_force_scores(pb: Paged) -> torch.Tensor:
    """Scores from the definition, one position at a time: [N, MAX_PAGES*S]."""
    out = torch.full((N, MAX_PAGES * S), float("-inf"))
    for n in range(N):
        for p in range(int(pb.seq_lens[n])):
            page, slot = int(pb.page_table[n, p // S]), p % S
            key = pb.index_k[page, slot].float() * pb.index_k_scale[page, slot]  # [DI]
            out[n, p] = (pb.w[n] * torch.relu(pb.q_idx[n] @ key)).sum()
    return out


def test_indexer_ref_selects_best_positions():
    pb = make_paged("bf16", seed=4)
    scores, got = brute_force_scores(pb), topk_of(pb, 5)
    for n in range(N):
        length = int(got.length[n])
        chosen = got.pos[n, :length]
        assert torch.equal(chosen, chosen.sort().values)
        assert torch.equal(got.pos[n, length:], torch.zeros(5 - length, dtype=torch.int32))
        best = scores[n].topk(length).values.sort().values if length else torch.zeros(0)
        assert torch.allclose(scores[n, chosen.long()].sort().values, best, rtol=1e-5)


def test_select_topk_breaks_ties_toward_lower_positions():
    inf = float("-inf")
    scores = torch.tensor([
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],   # all equal -> lowest positions
        [0.0, 2.0, 1.0, 2.0, 1.0, 1.0],   # two 2s, then the lowest of the tied 1s
        [3.0, inf, 3.0, inf, inf, inf],   # fewer valid than k
        [inf, inf, inf, inf, inf, inf],   # nothing valid
    ])
    got = select_topk(scores, 3)
    assert got.pos.tolist() == [[0, 1, 2], [1, 2, 3], [0, 2, 0], [0, 0, 0]]
    assert got.length.tolist() == [3, 3, 2, 0]
    wide = select_topk(scores, 8)
    assert wide.pos.shape == (4, 8) and wide.length.tolist() == [6, 6, 2, 0]
    assert wide.pos[0].tolist() == [0, 1, 2, 3, 4, 5, 0, 0]


def test_indexer_ties_through_paged_path():
    pb = make_paged("fp32", seed=5)
    same = torch.ones(P, S, DI)  # every key identical -> every score identical
    for fn in (indexer_topk_ref, indexer_topk_triton):
        got = fn(pb.q_idx.abs(), pb.w.abs(), same, torch.ones(P, S), pb.page_table,
                 pb.seq_lens, 4)
        assert got.pos.tolist() == [[0, 0, 0, 0], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3],
                                    [0, 0, 0, 0]]


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [3, 40])
def test_sparse_attention_triton_matches_ref(kv_dtype, k):
    pb = make_paged("fp8", kv_dtype, seed=6)
    topk = topk_of(pb, k)
    args = (pb.q, pb.k_cache, pb.v_cache, pb.page_table, topk, 0.3)
    ref, tri = sparse_attention_ref(*args), sparse_attention_triton(*args)
    assert ref.shape == (N, H, D) and ref.dtype == torch.float32
    assert torch.allclose(ref, tri, rtol=1e-5, atol=1e-6)
    assert torch.equal(ref[4], torch.zeros(H, D)) and torch.equal(tri[4], torch.zeros(H, D))


def test_sparse_attention_ref_matches_dense_definition():
    pb = make_paged("fp32", seed=7)
    topk = topk_of(pb, 6)
    out = sparse_attention_ref(pb.q, pb.k_cache, pb.v_cache, pb.page_table, topk, 0.5)
    n = 2
    pos = topk.pos[n, : int(topk.length[n])].long()
    pages, slots = pb.page_table[n, pos // S].long(), pos % S
    keys, vals = pb.k_cache[pages, slots], pb.v_cache[pages, slots]  # [L,H,D]
    probs = torch.softmax(torch.einsum("hd,lhd->hl", pb.q[n], keys) * 0.5, dim=-1)  # [H,L]
    assert torch.allclose(out[n], torch.einsum("hl,lhd->hd", probs, vals), atol=1e-6)


def test_attend_selected_masks_invalid_keys():
    q, k_sel, v_sel = torch.randn(2, H, D), torch.randn(2, 4, H, D), torch.randn(2, 4, H, D)
    valid = torch.tensor([[True, True, False, False], [False] * 4])
    out = attend_selected(q, k_sel, v_sel, valid, 0.2)
    expect = attend_selected(q[:1], k_sel[:1, :2], v_sel[:1, :2], valid[:1, :2], 0.2)
    assert torch.allclose(out[:1], expect, atol=1e-7)
    assert torch.equal(out[1], torch.zeros(H, D))


def test_ref_paths_are_batch_invariant():
    seq_lens = [5, 9, 28, 13, 0, 1, 20, 9, 17]
    pb = make_paged("fp8", torch.bfloat16, seq_lens=seq_lens, seed=8)
    x = torch.randn(9, DI) * 5
    for row in (2, 6):
        one = slice(row, row + 1)
        quant_all, quant_one = quantize_index_k_ref(x, "fp8"), quantize_index_k_ref(x[one], "fp8")
        assert torch.equal(quant_all.values[one].view(torch.uint8),
                           quant_one.values.view(torch.uint8))
        args = (pb.index_k, pb.index_k_scale)
        tk_all = indexer_topk_ref(pb.q_idx, pb.w, *args, pb.page_table, pb.seq_lens, 6)
        tk_one = indexer_topk_ref(pb.q_idx[one], pb.w[one], *args, pb.page_table[one],
                                  pb.seq_lens[one], 6)
        assert torch.equal(tk_all.pos[one], tk_one.pos)
        out_all = sparse_attention_ref(pb.q, pb.k_cache, pb.v_cache, pb.page_table, tk_all, 0.3)
        out_one = sparse_attention_ref(pb.q[one], pb.k_cache, pb.v_cache, pb.page_table[one],
                                       tk_one, 0.3)
        assert torch.equal(out_all[one], out_one)


def test_contiguous_helpers_are_batch_invariant():
    g = torch.Generator().manual_seed(9)
    q_idx, w = torch.randn(9, HI, DI, generator=g), torch.randn(9, HI, generator=g)
    keys, valid = torch.randn(9, 31, DI, generator=g), torch.rand(9, 31, generator=g) > 0.3
    all_scores = index_scores(q_idx, w, keys, valid)
    assert torch.equal(all_scores[4:5], index_scores(q_idx[4:5], w[4:5], keys[4:5], valid[4:5]))


def test_indexer_validation_errors():
    pb = make_paged("fp8", seed=10)
    base = dict(q_idx=pb.q_idx, w=pb.w, index_k=pb.index_k, index_k_scale=pb.index_k_scale,
                page_table=pb.page_table, seq_lens=pb.seq_lens, k=4)
    bad = [
        (dict(q_idx=pb.q_idx.double()), "q_idx must be float32"),
        (dict(w=pb.w[:, :2]), "w must be"),
        (dict(index_k=pb.index_k[..., :5]), "index_k must be"),
        (dict(index_k=pb.index_k.view(torch.uint8)), "unsupported dtype"),
        (dict(index_k_scale=pb.index_k_scale.double()), "index_k_scale must be"),
        (dict(page_table=pb.page_table.long()), "page_table must be int32"),
        (dict(seq_lens=pb.seq_lens[:2]), "seq_lens must be"),
        (dict(k=0), "k must be a positive int"),
        (dict(w=pb.w.to("meta")), "is on meta"),
        (dict(q_idx=pb.q_idx.transpose(0, 2).contiguous().transpose(0, 2)), "unit stride"),
    ]
    for fn in (indexer_topk_ref, indexer_topk_triton):
        for change, message in bad:
            if message == "unit stride" and fn is indexer_topk_ref:
                continue  # the reference handles any layout
            with pytest.raises(ValueError, match=message):
                fn(**{**base, **change})


def test_quant_and_attention_validation_errors():
    with pytest.raises(ValueError, match="unknown index-K dtype 'int4'; valid: bf16, fp32, fp8"):
        quantize_index_k_triton(torch.randn(3, DI), "int4")
    with pytest.raises(ValueError, match="x must be float32"):
        quantize_index_k_ref(torch.randn(3, DI).double(), "fp8")
    with pytest.raises(ValueError, match="scale must be float32"):
        dequantize_index_k_triton(torch.randn(3, DI), torch.ones(4))
    pb = make_paged("fp8", seed=11)
    topk = topk_of(pb, 4)
    base = (pb.q, pb.k_cache, pb.v_cache, pb.page_table, topk, 0.3)
    bad = [
        ((pb.q[:, :, :7],) + base[1:], "k_cache/v_cache must both be"),
        ((pb.q, pb.k_cache, pb.v_cache.bfloat16()) + base[3:], "share a dtype"),
        (base[:4] + (TopK(topk.pos.long(), topk.length), 0.3), "topk.pos must be int32"),
        (base[:4] + ((topk.pos, topk.length),) + (0.3,), "topk must be a TopK"),
        ((pb.q.to("meta"),) + base[1:], "but q is on meta"),
    ]
    for fn in (sparse_attention_ref, sparse_attention_triton):
        for args, message in bad:
            with pytest.raises(ValueError, match=message):
                fn(*args)


def test_registry_lookup_and_unknown_name():
    assert isinstance(get_kernels("torch"), KernelSet)
    assert get_kernels("torch").indexer_topk is indexer_topk_ref
    assert get_kernels("triton").sparse_attention is sparse_attention_triton
    with pytest.raises(UnknownVariantError, match="valid: torch, triton"):
        get_kernels("cuda")
