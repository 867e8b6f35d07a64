"""Engine core: pages, prefix cache, scheduler, batch invariance, and equality with the oracle."""

from __future__ import annotations

import random

import pytest
import torch

from engine.cache import OutOfPagesError, PageAllocator, RadixCache
from engine.config import ConfigError, EngineConfig, ModelConfig
from engine.core import Engine, PromptTooLongError, SamplingParams, Sequence
from engine.model import Reference, TinyDeepSeek
from engine.model.layers import linear

SMALL = ModelConfig(n_layers=2, d_model=64, n_heads=2, d_ff=96, index_topk=8, max_seq_len=256)


def small_engine(**kw) -> Engine:
    torch.manual_seed(0)
    model = TinyDeepSeek(SMALL).eval()
    for p in model.parameters():  # larger weights make the random model's choices less tied
        p.data.mul_(8.0 if p.dim() == 2 else 1.0)
    opts = {"page_size": 4, "num_pages": 256, "max_batch_tokens": 48, "chunk_size": 16, **kw}
    cfg = EngineConfig(**opts)
    return Engine(cfg, model=model)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(10, 120) for _ in range(9)]
    return [shared + [rng.randrange(10, 120) for _ in range(rng.randint(3, 40))] for _ in range(n)]


def test_allocator_refcounts_and_errors():
    a = PageAllocator(4)
    pages = a.alloc(3)
    a.share(pages[:1])
    a.free(pages)
    assert a.num_free == 3
    with pytest.raises(OutOfPagesError):
        a.alloc(4)
    a.free(pages[:1])
    with pytest.raises(ValueError, match="double free"):
        a.free(pages[:1])


def test_radix_cache_match_insert_evict():
    a = PageAllocator(8)
    cache = RadixCache(a, page_size=2)
    pages = a.alloc(3)
    assert cache.insert([1, 2, 3, 4, 5, 6, 7], pages) == 3
    a.free(pages)
    m = cache.match([1, 2, 3, 4, 9, 9])
    assert m.pages == tuple(pages[:2]) and m.num_tokens == 4
    assert cache.evict(8) == 1  # only the unshared leaf [5, 6]
    a.free(list(m.pages))
    assert cache.evict(8) == 2 and a.num_free == 8


def test_batch_invariant_linear_rows_are_bitwise_equal():
    torch.manual_seed(1)
    w, x = torch.randn(96, 64), torch.randn(33, 64)
    alone = torch.cat([linear(x[i:i + 1], w, True) for i in range(33)])
    assert torch.equal(linear(x, w, True), alone)


def test_engine_matches_reference_under_concurrency():
    eng = small_engine()
    ref = Reference(eng.model, eng.cfg)
    ps = prompts(6)
    seqs = [eng.submit(Sequence("r0", ps[0], SamplingParams(max_tokens=12)))]
    eng.run_until_idle()  # r0's pages enter the prefix cache; the rest share its prefix
    seqs += [eng.submit(Sequence(f"r{i}", p, SamplingParams(max_tokens=12)))
             for i, p in enumerate(ps[1:], 1)]
    eng.run_until_idle()
    for p, seq in zip(ps, seqs, strict=True):
        assert seq.output == ref.generate(p, 12, eng.tokenizer.eos_id)[: len(seq.output)]
        assert len(seq.output) == 12 or seq.output[-1] == eng.tokenizer.eos_id
    assert sum(s.num_cached for s in seqs) > 0, "shared prefix should hit the radix cache"
    assert eng.allocator.num_free + eng.cache.num_pages == eng.allocator.num_pages


def test_output_independent_of_batching():
    solo, busy = small_engine(), small_engine()
    target = prompts(1, seed=5)[0]
    alone = solo.generate(target, SamplingParams(max_tokens=10))
    for i, p in enumerate(prompts(7, seed=9)):
        busy.submit(Sequence(f"x{i}", p, SamplingParams(max_tokens=10)))
    seq = busy.submit(Sequence("t", target, SamplingParams(max_tokens=10)))
    busy.run_until_idle()
    assert seq.output == alone


def test_seeded_sampling_replays():
    outs = []
    for _ in range(2):
        eng = small_engine()
        outs.append(eng.generate(prompts(1)[0], SamplingParams(12, temperature=1.0, seed=7)))
    assert outs[0] == outs[1]


def test_abort_frees_pages():
    eng = small_engine()
    eng.submit(Sequence("a", prompts(1)[0], SamplingParams(max_tokens=50)))
    eng.step()
    eng.abort("a")
    eng.run_until_idle()
    assert eng.allocator.num_free + eng.cache.num_pages == eng.allocator.num_pages
    assert eng.stats.finished["abort"] == 1


def test_prompt_limits_and_config_validation():
    eng = small_engine()
    with pytest.raises(PromptTooLongError):
        eng.submit(Sequence("big", [5] * 2000, SamplingParams(max_tokens=4)))
    with pytest.raises(ConfigError, match="valid: fp8, bf16, fp32"):
        EngineConfig(index_k_dtype="int4")
    with pytest.raises(ConfigError, match="unknown EngineConfig options"):
        EngineConfig.from_dict({"pagesize": 3})


@pytest.mark.parametrize("dtypes", [("bf16", "bf16"), ("fp32", "fp32")])
def test_storage_dtypes_match_reference(dtypes):
    eng = small_engine(kv_dtype=dtypes[0], index_k_dtype=dtypes[1])
    ref = Reference(eng.model, eng.cfg)
    p = prompts(1, seed=3)[0]
    assert eng.generate(p, SamplingParams(max_tokens=8)) == ref.generate(p, 8, eng.tokenizer.eos_id)


def hicache_engine(patches: str = "", **faults) -> Engine:
    return small_engine(hicache=True, hicache_offload_on_finish=True, patches=patches,
                        num_pages=40, faults={"seed": 1, **faults})


def two_turns(eng: Engine, seed: int = 11) -> tuple[list[int], list[int]]:
    """Turn 1, then turn 2 extending turn 1's tokens (its prefix comes back from host memory)."""
    first = prompts(1, seed=seed)[0]
    out1 = eng.generate(first, SamplingParams(max_tokens=6))
    second = first + out1 + [7, 8, 9, 10, 11, 12, 13]
    for p in prompts(4, seed=seed + 1):  # churn pages so stale data is foreign
        eng.generate(p, SamplingParams(max_tokens=3))
    return second, eng.generate(second, SamplingParams(max_tokens=8))


def test_hicache_load_back_matches_reference():
    eng = hicache_engine(hicache_ns_per_byte=200.0)
    second, out = two_turns(eng)
    assert eng.cache.loads >= 1
    assert out == Reference(eng.model, eng.cfg).generate(second, 8, eng.tokenizer.eos_id)


def test_a_full_host_tier_never_wedges_the_device_pool():
    """Found by 50 real bursts: once the host tier was full, eviction freed no device page and
    a PD prefill stopped admitting at burst 37 (its 512 device pages all cached)."""
    eng = small_engine(hicache=True, hicache_offload_on_finish=True, num_pages=40,
                       hicache_host_pages=6, faults={"seed": 1})
    ref = Reference(eng.model, eng.cfg)
    for i, p in enumerate(prompts(16, seed=5)):
        p = p + [7] * (12 + i)  # several pages each: far more than the host tier holds
        assert eng.generate(p, SamplingParams(max_tokens=4)) == \
            ref.generate(p, 4, eng.tokenizer.eos_id)
    assert eng.cache.host.alloc.num_free <= 6
    assert eng.allocator.num_free + eng.cache.num_pages == eng.allocator.num_pages
    second, out = two_turns(eng)  # load-back still works beside a full host tier
    assert out == ref.generate(second, 8, eng.tokenizer.eos_id)


@pytest.mark.parametrize("patches", ["", "hicache_index_k_no_wait"])
def test_hicache_index_k_reads_before_load_only_with_the_patch(patches):
    eng = hicache_engine(patches, hicache_ns_per_byte=20000.0)
    second, out = two_turns(eng)
    jobs = list(eng.cache.loader.history)
    assert jobs and all(j.wait_done(10.0) for j in jobs)  # the patch lands index-K late
    stale = [layer for j in jobs for layer in j.stale_reads]
    assert (len(stale) > 0) == bool(patches)
    if not patches:
        assert out == Reference(eng.model, eng.cfg).generate(second, 8, eng.tokenizer.eos_id)


@pytest.mark.slow
def test_shipped_model_hicache_race_corrupts_outputs_only_with_the_patch(make_engine):
    """Real weights, multi-turn sessions whose prefixes come back from host memory."""
    from engine.text import render_prompt
    from engine.training import make_transcript

    def run(patches: str) -> int:
        eng = make_engine(hicache=True, hicache_offload_on_finish=True, num_pages=400,
                          patches=patches, faults={"seed": 7, "hicache_ns_per_byte": 2000.0})
        ref, mismatches = make_engine(index_k_dtype=eng.cfg.index_k_dtype), 0
        for s in range(3):
            tr = make_transcript(777 + s)
            msgs = tr.messages(upto_round=0)
            ids = eng.tokenizer.encode(render_prompt(msgs, list(tr.tools)))
            eng.generate(ids, SamplingParams(100))
            msgs = tr.messages()[:4]  # system, ask, call, tool result: the answer's prompt
            ids = eng.tokenizer.encode(render_prompt(msgs, list(tr.tools)))
            mismatches += eng.generate(ids, SamplingParams(40)) != ref.generate(
                ids, SamplingParams(40))
        return mismatches

    assert run("") == 0
    assert run("hicache_index_k_no_wait,bf16_index_k") > 0
