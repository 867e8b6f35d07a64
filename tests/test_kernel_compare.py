"""Kernel-variant comparison, fault injection and bisection over kernel sets
(workbench.studies.kernels)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (via engine.kernels)

import pytest  # noqa: E402

from engine.kernels import KERNELS, get_kernels  # noqa: E402
from engine.registry import UnknownVariantError  # noqa: E402
from workbench.search import (  # noqa: E402
    bisect,
    ddmin,  # noqa: E402
    fixed_repeat_bisect,
)
from workbench.studies.kernel_faults import perturb_op  # noqa: E402
from workbench.studies.kernels import (  # noqa: E402
    OPS,
    compare_kernels,
    kernel_trial,
    make_case,
    mixed_kernel_set,
    model_divergence,
    temporary_kernel_sets,
)


def test_torch_and_triton_agree_on_odd_seeded_cases():
    cmp = compare_kernels("torch", "triton", seed=0, cases=8)
    assert cmp.table.height == 3 * 8 * len(OPS) and cmp.within_tolerance
    assert set(cmp.divergent_ops) <= {"sparse_attention"}  # fp32 summation order only
    assert cmp.max_abs["quantize_index_k"] == cmp.max_abs["dequantize_index_k"] == 0.0
    assert cmp.max_abs["indexer_topk"] == 0.0 and cmp.max_abs["sparse_attention"] < 1e-5
    topk = cmp.table.filter(op="indexer_topk")
    assert topk["index_diff"].sum() == 0 and topk["mismatches"].sum() == 0
    assert cmp.table.filter(op="sparse_attention")["index_diff"].null_count() == 8 * 3
    case = make_case(0, "fp8", 3)
    s = case.index_k.values.shape[1]
    assert case.x.shape[0] % 2 == 1 and case.page_table.shape[1] % 2 == 1
    assert all(n == 0 or n % s for n in case.seq_lens.tolist())
    assert make_case(0, "fp8", 3).x.equal(case.x)  # a pure function of (seed, dtype, case)


@pytest.mark.parametrize("op", OPS)
def test_perturbed_op_is_reported_at_exactly_that_op(op):
    cmp = compare_kernels("torch", perturb_op("torch", op), cases=2)
    assert cmp.divergent_ops == [op] and not cmp.within_tolerance and not cmp.identical
    if op == "indexer_topk":
        assert cmp.table.filter(op=op)["index_diff"].min() > 0


def test_mixed_set_with_perturbed_op_diverges_only_there():
    broken = perturb_op("triton", "sparse_attention", eps=1e-3)
    mix = mixed_kernel_set("mix", "torch", indexer_topk="triton", sparse_attention=broken)
    assert mix.quantize_index_k is get_kernels("torch").quantize_index_k
    cmp = compare_kernels("triton", mix, cases=2, dtypes=("bf16",))
    assert cmp.divergent_ops == ["sparse_attention"] and cmp.b == "mix"
    assert cmp.max_abs["sparse_attention"] == pytest.approx(1e-3, rel=1e-3)
    with pytest.raises(ValueError, match="unknown kernel ops"):
        mixed_kernel_set("bad", attention="triton")


@pytest.mark.slow
def test_bayesian_bisect_names_the_flaky_kernel_culprit():
    flaky = perturb_op("triton", "sparse_attention", p=0.3, seed=5)
    steps = [{}, {"quantize_index_k": "triton"}, {"dequantize_index_k": "triton"},
             {"indexer_topk": "triton"}, {"sparse_attention": "triton"},
             {"sparse_attention": flaky}, {"indexer_topk": "torch"}, {"quantize_index_k": "torch"}]
    series, ops = [], {}
    for i, step in enumerate(steps):  # cumulative: candidate i applies steps 0..i
        ops.update(step)
        series.append(mixed_kernel_set(f"k{i}", "torch", **ops))
    with temporary_kernel_sets(*series) as names:
        trial = kernel_trial(dtypes=("fp32",))
        result = bisect(names, trial, confidence=0.95, seed=0)
        classic = fixed_repeat_bisect(names, trial, assumed_fail_rate=0.3, alpha=0.01)
    assert result.culprit == "k5" and result.converged
    assert 0.1 < result.estimated_fail_rate_bad < 0.7
    assert classic.culprit == "k5" and classic.method == "fixed-repeat"
    assert "k5" not in KERNELS  # temporary registrations are gone


def test_ddmin_over_ops_finds_the_broken_op():
    donor = perturb_op("triton", "indexer_topk")
    result = ddmin(list(OPS), kernel_trial(donor=donor, dtypes=("fp32",)), repeats=1)
    assert result.minimal == ("indexer_topk",) and result.complete


@pytest.mark.slow
def test_model_divergence_reports_first_differing_token():
    noisy = mixed_kernel_set("noisy", quantize_index_k="triton",
                             sparse_attention=perturb_op("torch", "sparse_attention", eps=1.0))
    with temporary_kernel_sets(noisy, mixed_kernel_set("tq", quantize_index_k="triton")):
        same = model_divergence("torch", "tq", prompts=2, max_tokens=6)
        diff = model_divergence("torch", "noisy", prompts=1, max_tokens=6, seed=3)
    assert same["first_diff"].null_count() == 2 and same["token_a"].null_count() == 2
    assert same["tokens_a"].to_list() == same["tokens_b"].to_list()
    row = diff.row(0, named=True)
    first = row["first_diff"]
    assert first is not None and row["token_a"] != row["token_b"]
    assert row["tokens_a"][:first] == row["tokens_b"][:first] and row["prompt"] == 3


def test_unknown_and_duplicate_names():
    for call in (lambda: compare_kernels("torch", "cuda"), lambda: kernel_trial()("cuda", 0),
                 lambda: model_divergence("cuda"), lambda: perturb_op("cuda", "indexer_topk")):
        with pytest.raises(UnknownVariantError, match="valid: torch, triton"):
            call()
    with pytest.raises(ValueError, match="registered twice"):
        with temporary_kernel_sets(mixed_kernel_set("dup"), get_kernels("torch")):
            pass
    assert "dup" not in KERNELS and "torch" in KERNELS
