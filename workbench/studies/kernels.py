"""Kernel-variant comparison: run two kernel sets on the same seeded inputs, report divergence.

:func:`compare_kernels` feeds every op of the ``KernelSet`` contract the *same* inputs (odd
token counts and head sizes, odd page sizes, shuffled page tables, sequence lengths that are
never a whole number of pages) made with the torch references only, so a divergence in one op
never leaks into another op's row.  :func:`model_divergence` runs the shipped model end to end
with each set.  :func:`kernel_trial` turns the comparison into a ``trial(candidate, seed)`` for
``workbench.search.bisect`` / ``ddmin``; :func:`mixed_kernel_set` builds candidates (temporary
registrations; fault injection is ``workbench.studies.kernel_faults.perturb_op``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import polars as pl
import torch

from engine.kernels import (
    KERNELS,
    KernelSet,
    QuantizedIndexK,
    TopK,
    get_kernels,
    indexer_topk_ref,
    quantize_index_k_ref,
)
from workbench.search.trials import TrialFn, derive_seed

log = logging.getLogger(__name__)

OPS = ("quantize_index_k", "dequantize_index_k", "indexer_topk", "sparse_attention")
DTYPES = ("fp8", "bf16", "fp32")
RTOL, ATOL = 1e-5, 1e-6
"""Documented torch-vs-triton tolerance for float outputs (fp32 summation order only);
quantization and top-k selection must match exactly."""
_KV_DTYPE = {"fp8": torch.bfloat16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class KernelCase:
    """Seeded inputs for every op: ``x [N,Di]``; an index-K cache ``[P,S,Di]`` in ``dtype``
    storage with ``scale [P,S]``; KV caches ``[P,S,H,D]``; ``page_table [N,W]`` int32 and
    ``seq_lens [N]`` int32 with ``0 <= seq_lens < W*S`` never a multiple of ``S`` unless 0;
    ``topk`` from the torch reference indexer (the sparse-attention input).  KV caches are
    bf16 for the fp8 and bf16 cases (the engine has no fp8 KV) and fp32 for fp32."""

    dtype: str
    case: int
    x: torch.Tensor
    q_idx: torch.Tensor
    w: torch.Tensor
    index_k: QuantizedIndexK
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    k: int
    topk: TopK

    def args(self, op: str) -> tuple:
        """The positional arguments of ``op`` (the same objects for every kernel set)."""
        p, s, di = self.index_k.values.shape
        return {
            "quantize_index_k": (self.x, self.dtype),
            "dequantize_index_k": (self.index_k.values.view(p * s, di),
                                   self.index_k.scale.view(p * s)),
            "indexer_topk": (self.q_idx, self.w, self.index_k.values, self.index_k.scale,
                             self.page_table, self.seq_lens, self.k),
            "sparse_attention": (self.q, self.k_cache, self.v_cache, self.page_table,
                                 self.topk, self.q.shape[2] ** -0.5),
        }[op]


def make_case(seed: int, dtype: str, case: int) -> KernelCase:
    """Inputs of one case; a pure function of ``(seed, dtype, case)``."""
    key = derive_seed(f"kernels:seed={seed}", dtype, case)
    rng, g = random.Random(key), torch.Generator().manual_seed(key)
    n, s, w = rng.choice((1, 3, 5, 7, 9)), rng.choice((3, 5, 7)), rng.choice((1, 3, 5))
    hi, di = rng.choice((1, 3)), rng.randrange(5, 34, 2)
    h, d = rng.choice((1, 3)), rng.randrange(3, 22, 2)
    pages = w + rng.randrange(1, 7)
    lens = [rng.randint(1, w * s) for _ in range(n)]
    lens = [x - 1 if x % s == 0 else x for x in lens]  # never a whole number of pages
    tables = [torch.randperm(pages, generator=g)[:w] for _ in range(n)]
    if rng.random() < 0.5:  # rows of one sequence share a table (the engine's prefill layout)
        tables = tables[:1] * n
    mag = 10.0 ** (torch.rand(pages * s, 1, generator=g) * 4 - 2)  # per-token magnitude
    index_k = quantize_index_k_ref(torch.randn(pages * s, di, generator=g) * mag, dtype)
    index_k = QuantizedIndexK(index_k.values.view(pages, s, di), index_k.scale.view(pages, s))
    page_table = torch.stack(tables).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q_idx, wts = torch.randn(n, hi, di, generator=g), torch.randn(n, hi, generator=g)
    k = rng.randint(1, w * s + 2)
    topk = indexer_topk_ref(q_idx, wts, index_k.values, index_k.scale, page_table, seq_lens, k)
    kv = [torch.randn(pages, s, h, d, generator=g).to(_KV_DTYPE[dtype]) for _ in range(2)]
    x = torch.randn(n, di, generator=g) * 10.0 ** (torch.rand(n, 1, generator=g) * 4 - 2)
    return KernelCase(dtype, case, x, q_idx, wts, index_k, torch.randn(n, h, d, generator=g),
                      kv[0], kv[1], page_table, seq_lens, k, topk)


def _flat(op: str, out) -> torch.Tensor:
    """An op's output as one flat fp32 vector (quantized values are upcast, not rescaled)."""
    if op == "quantize_index_k":
        return torch.cat([out.values.float().reshape(-1), out.scale.reshape(-1)])
    if op == "indexer_topk":
        return torch.cat([out.pos.reshape(-1), out.length]).float()
    return out.float().reshape(-1)


def _index_diff(a: TopK, b: TopK) -> int:
    """Selected positions that differ: per row ``max(|A - B|, |B - A|)``, summed."""
    total = 0
    for pa, la, pb, lb in zip(a.pos.tolist(), a.length.tolist(), b.pos.tolist(),
                              b.length.tolist(), strict=True):
        sa, sb = set(pa[:la]), set(pb[:lb])
        total += max(len(sa - sb), len(sb - sa))
    return total


def _diff_row(op: str, out_a, out_b, rtol: float, atol: float) -> dict:
    fa, fb = _flat(op, out_a), _flat(op, out_b)
    row = {"index_diff": _index_diff(out_a, out_b) if op == "indexer_topk" else None}
    if fa.shape != fb.shape:  # a broken kernel: every element counts as a mismatch
        n = max(fa.numel(), fb.numel())
        return {**row, "elements": n, "mismatches": n, "max_abs": float("inf"),
                "max_rel": float("inf"), "ok": False}
    same = (fa == fb) | (fa.isnan() & fb.isnan())
    err = torch.where(same, 0.0, (fa - fb).abs().nan_to_num(float("inf")))
    rel = err / torch.maximum(fa.abs(), fb.abs()).clamp_min(torch.finfo(torch.float32).tiny)
    tol = 0.0 if op in ("quantize_index_k", "indexer_topk") else 1.0
    ok = bool((err <= tol * (atol + rtol * fa.abs())).all())
    return {**row, "elements": fa.numel(), "mismatches": int((~same).sum()),
            "max_abs": float(err.max()) if err.numel() else 0.0,
            "max_rel": float(rel.max()) if rel.numel() else 0.0, "ok": ok}


@dataclass(frozen=True)
class KernelComparison:
    """Divergence of kernel set ``b`` from ``a``; ``table`` has one row per (op, dtype, case):
    ``op, dtype, case, tokens, elements, mismatches, max_abs, max_rel, index_diff, ok``.

    Invariants: ``mismatches`` counts elements not bitwise equal (NaN equals NaN); ``ok`` means
    within ``RTOL``/``ATOL`` for float ops and exact for quantization and top-k;
    ``index_diff`` is set only for ``indexer_topk``; ``identical`` iff no element differs.
    """

    a: str
    b: str
    table: pl.DataFrame

    @property
    def max_abs(self) -> dict[str, float]:
        """Largest absolute difference per op over all dtypes and cases."""
        agg = self.table.group_by("op", maintain_order=True).agg(pl.col("max_abs").max())
        return {r["op"]: r["max_abs"] for r in agg.iter_rows(named=True)}

    @property
    def identical(self) -> bool:
        return int(self.table["mismatches"].sum()) == 0

    @property
    def within_tolerance(self) -> bool:
        return bool(self.table["ok"].all())

    @property
    def divergent_ops(self) -> list[str]:
        """Ops with at least one mismatching element, in contract order."""
        bad = set(self.table.filter(pl.col("mismatches") > 0)["op"].to_list())
        return [op for op in OPS if op in bad]


def resolve_kernels(kernels: str | KernelSet) -> KernelSet:
    """A ``KernelSet`` as is, or the registered set of that name (``UnknownVariantError``)."""
    return kernels if isinstance(kernels, KernelSet) else get_kernels(kernels)


def compare_kernels(a: str | KernelSet = "torch", b: str | KernelSet = "triton", *,
                    seed: int = 0, cases: int = 8, dtypes: Sequence[str] = DTYPES,
                    ops: Sequence[str] = OPS, rtol: float = RTOL,
                    atol: float = ATOL) -> KernelComparison:
    """Run sets ``a`` and ``b`` on the same seeded inputs (:func:`make_case`) and diff them.

    Names resolve through the kernel registry (unknown ones raise ``UnknownVariantError``
    listing the valid names); ``KernelSet`` objects are used as given.
    """
    ka, kb = resolve_kernels(a), resolve_kernels(b)
    rows = []
    for dtype in dtypes:
        for i in range(cases):
            c = make_case(seed, dtype, i)
            for op in ops:
                out_a, out_b = getattr(ka, op)(*c.args(op)), getattr(kb, op)(*c.args(op))
                rows.append({"op": op, "dtype": dtype, "case": i, "tokens": c.x.shape[0],
                             **_diff_row(op, out_a, out_b, rtol, atol)})
    cmp = KernelComparison(ka.name, kb.name, pl.DataFrame(rows, schema_overrides={
        "index_diff": pl.Int64, "max_abs": pl.Float64, "max_rel": pl.Float64}))
    log.debug("kernels %s vs %s (seed %d): identical=%s within_tolerance=%s divergent=%s",
             ka.name, kb.name, seed, cmp.identical, cmp.within_tolerance, cmp.divergent_ops)
    return cmp


def mixed_kernel_set(name: str, base: str | KernelSet = "torch",
                     **ops: str | KernelSet | Callable) -> KernelSet:
    """``base`` renamed ``name`` with some ops taken from other sets (by name or object) or
    given as callables; not registered (see :func:`temporary_kernel_sets`)."""
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise ValueError(f"unknown kernel ops {unknown}; valid: {', '.join(OPS)}")
    fns = {op: src if callable(src) else getattr(resolve_kernels(src), op)
           for op, src in ops.items()}
    return replace(resolve_kernels(base), name=name, **fns)


@contextmanager
def temporary_kernel_sets(*sets: KernelSet) -> Iterator[list[str]]:
    """Register ``sets`` under their names for the block (so ``get_kernels`` and
    ``EngineConfig(kernels=name)`` see them); yields the names; removes them on exit, even on
    error.  A name already registered raises ``ValueError`` and nothing stays registered."""
    names: list[str] = []
    try:
        for ks in sets:
            KERNELS.register(ks.name, ks)
            names.append(ks.name)
        yield names
    finally:
        for name in names:  # the registry has no public removal; these entries are ours
            del KERNELS._items[name]


def kernel_trial(reference: str | KernelSet = "torch", *, donor: str | KernelSet = "triton",
                 cases: int = 1, dtypes: Sequence[str] = DTYPES, rtol: float = RTOL,
                 atol: float = ATOL) -> TrialFn:
    """``trial(candidate, seed) -> failed`` for ``bisect`` / ``fixed_repeat_bisect`` / ``ddmin``.

    ``candidate`` is a registered kernel-set name, or (ddmin) a set of op names taken from
    ``donor`` with the rest from ``reference``.  It fails when the candidate is not within
    tolerance of ``reference`` on ``compare_kernels(seed=seed, cases=cases)``.
    """
    def trial(candidate, seed: int) -> bool:
        if isinstance(candidate, str):
            ks = get_kernels(candidate)
        else:
            ops = sorted(candidate)
            ks = mixed_kernel_set(f"{resolve_kernels(reference).name}+{'+'.join(ops)}", reference,
                                  **dict.fromkeys(ops, resolve_kernels(donor)))
        cmp = compare_kernels(reference, ks, seed=seed, cases=cases, dtypes=dtypes,
                              rtol=rtol, atol=atol)
        return not cmp.within_tolerance
    return trial


def _at(tokens: list[int], i: int | None) -> int | None:
    return tokens[i] if i is not None and i < len(tokens) else None


def model_divergence(a: str = "torch", b: str = "triton", *, prompts: int = 2,
                     max_tokens: int = 16, seed: int = 0, **engine) -> pl.DataFrame:
    """Greedy generations of the shipped model with kernel sets ``a`` and ``b``.

    One row per prompt (``make_transcript(seed + i)``'s first ask): ``prompt, prompt_tokens,
    first_diff`` (index of the first differing generated token, None when identical),
    ``token_a, token_b`` (at that index) and both token lists.  ``engine``: EngineConfig
    overrides.  Names must be registered (see :func:`temporary_kernel_sets`).  Slow for
    triton under ``TRITON_INTERPRET`` (about 4 minutes per 259-token prompt on 2 CPU cores).
    """
    from engine.config import EngineConfig
    from engine.core import Engine, SamplingParams
    from engine.text import render_prompt
    from engine.training.datagen import make_transcript
    from workbench.judge.oracle import first_difference

    get_kernels(a), get_kernels(b)  # fail fast (UnknownVariantError) before loading the model
    eng_a = Engine(EngineConfig(**{**engine, "kernels": a}))
    eng_b = Engine(EngineConfig(**{**engine, "kernels": b}), model=eng_a.model)
    rows = []
    for i in range(prompts):
        tr = make_transcript(seed + i)
        ids = eng_a.tokenizer.encode(render_prompt(tr.messages(upto_round=0), list(tr.tools)))
        out_a, out_b = (e.generate(ids, SamplingParams(max_tokens)) for e in (eng_a, eng_b))
        diff = first_difference(out_a, out_b)
        rows.append({"prompt": seed + i, "prompt_tokens": len(ids), "first_diff": diff,
                     "token_a": _at(out_a, diff), "token_b": _at(out_b, diff), "tokens_a": out_a,
                     "tokens_b": out_b})
        log.info("prompt %d (%d tokens): first differing token %s", seed + i, len(ids), diff)
    return pl.DataFrame(rows, schema_overrides={"first_diff": pl.Int64, "token_a": pl.Int64,
                                                "token_b": pl.Int64})
