"""The oracle is independent of the code under test (issue 11): a bug planted in the engine's
scheduling path is flagged, because the reference shares no scheduler, pool or cache with it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.core import Engine, SamplingParams, Sequence
from engine.core.model_runner import ModelRunner
from engine.model import Reference
from engine.text import render_prompt
from engine.training import make_transcript
from workbench.judge import LOGPROB_TOLERANCE, ReferenceOracle, judge


def _prompts(n: int, tk, min_len: int) -> list[list[int]]:
    out = []
    for seed in range(500):
        tr = make_transcript(seed)
        ids = tk.encode(render_prompt(tr.messages(upto_round=len(tr.rounds) - 1), list(tr.tools)))
        if len(ids) > min_len:
            out.append(ids)
        if len(out) == n:
            return out
    raise AssertionError("not enough long transcripts")


def _chunk_start_bug(monkeypatch, chunk: int) -> None:
    """Plants an unconditional scheduling bug: the first token of every later prefill chunk
    loses its previous-token input (as if chunks were prepared independently)."""
    original = ModelRunner.prepare

    def prepare(self, batch, future=None):
        inp = original(self, batch, future)
        cut = (inp.positions % chunk == 0) & (inp.positions > 0)
        return dataclasses.replace(inp, prev=torch.where(cut, 0, inp.prev))

    monkeypatch.setattr(ModelRunner, "prepare", prepare)


def _serve(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    seqs = [engine.submit(Sequence(f"r{i}", p, SamplingParams(max_tokens=max_tokens)))
            for i, p in enumerate(prompts)]
    engine.run_until_idle()
    return [list(s.output) for s in seqs]


@pytest.mark.slow
def test_reference_incremental_equals_full_recompute(shipped_model, make_engine):
    eng = make_engine(batch_invariant=True)
    ref = Reference(shipped_model, eng.cfg)
    for prompt in _prompts(3, eng.tokenizer, 100):
        fast = ref.generate(prompt, 24, eng.tokenizer.eos_id)
        assert fast == ref.generate(prompt, 24, eng.tokenizer.eos_id, recompute=True)


def test_oracle_flags_a_scheduler_bug_the_engine_would_share(monkeypatch, make_engine):
    chunk, max_tokens = 64, 24
    eng = make_engine(batch_invariant=True, chunk_size=chunk, prefix_cache=False)
    prompts = _prompts(6, eng.tokenizer, 3 * chunk)
    oracle = ReferenceOracle(eng.cfg)
    want = [oracle.expected(p, max_tokens) for p in prompts]
    assert _serve(eng, prompts, max_tokens) == want  # the correct engine agrees exactly

    _chunk_start_bug(monkeypatch, chunk)
    buggy = _serve(make_engine(batch_invariant=True, chunk_size=chunk, prefix_cache=False),
                   prompts, max_tokens)
    verdicts = [judge("", [], False, None, got, oracle.expected(p, max_tokens))
                for p, got in zip(prompts, buggy, strict=True)]
    assert sum(v.flagged for v in verdicts) >= 1, "the planted scheduling bug went unflagged"
    # an engine-built oracle (the old design) shares the bug and certifies it
    shared = _serve(make_engine(batch_invariant=True, chunk_size=chunk, prefix_cache=False),
                    prompts, max_tokens)
    assert shared == buggy


def test_oracle_failure_is_a_per_request_flag():
    v = judge("hi", [], False, None, [1, 2], None, oracle_error="RuntimeError: boom")
    assert v.flagged and v.ref_match is None


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp32"])
def test_oracle_matches_engine_storage_dtypes(make_engine, kv_dtype):
    """Tokens equal, and so are their logprobs, bit for bit (the drift tolerance's basis)."""
    eng = make_engine(batch_invariant=True, kv_dtype=kv_dtype)
    prompts = _prompts(2, eng.tokenizer, 50)
    oracle = ReferenceOracle(eng.cfg)
    seqs = [eng.submit(Sequence(f"r{i}", p, SamplingParams(max_tokens=16, logprobs=0)))
            for i, p in enumerate(prompts)]
    eng.run_until_idle()
    for seq, prompt in zip(seqs, prompts, strict=True):
        want = oracle.scored(prompt, 16)
        assert list(seq.output) == list(want.tokens)
        assert [lp.logprob for lp in seq.logprobs] == list(want.logprobs)
    assert oracle.drift_tolerance == LOGPROB_TOLERANCE


def test_logprob_drift_is_judged_over_agreeing_tokens_only():
    ref, lps = [5, 6, 7], [-0.1, -0.2, -0.3]
    small = LOGPROB_TOLERANCE / 2
    ok = judge("", [], False, None, [5, 6, 7], ref, logprobs=[-0.1, None, -0.3 + small],
               ref_logprobs=lps, tolerance=LOGPROB_TOLERANCE)
    assert ok.ref_match and ok.logprob_drift == pytest.approx(small) and not ok.flagged
    drift = LOGPROB_TOLERANCE * 10  # under the token: greedy tokens agree, logprobs moved
    bad = judge("", [], False, None, [5, 6, 7], ref, logprobs=[-0.1, -0.2 - drift, -0.3],
                ref_logprobs=lps, tolerance=LOGPROB_TOLERANCE)
    assert bad.ref_match and bad.drifted and bad.flagged
    assert bad.logprob_drift == pytest.approx(drift)
    # past the first differing token nothing is comparable; no tolerance: reported, not flagged
    cut = judge("", [], False, None, [5, 9, 7], ref, logprobs=[-0.1, -5.0, -9.0],
                ref_logprobs=lps, tolerance=None)
    assert cut.first_diff == 1 and cut.logprob_drift == 0.0 and not cut.drifted
    loose = judge("", [], False, None, [5, 6, 7], ref, logprobs=[-0.1, -0.2 - drift, -0.3],
                  ref_logprobs=lps, tolerance=None)
    assert loose.logprob_drift == pytest.approx(drift) and not loose.flagged
    assert judge("", [], False, None, [5], [5], logprobs=[None], ref_logprobs=[-0.1],
                 tolerance=LOGPROB_TOLERANCE).logprob_drift is None


def test_the_drift_tolerance_applies_only_to_batch_invariant_torch_servers(make_engine):
    cfg = make_engine(batch_invariant=True).cfg
    assert ReferenceOracle(cfg.replace(batch_invariant=False)).drift_tolerance is None
    assert ReferenceOracle(cfg, tolerance=1e-3).drift_tolerance == 1e-3


def test_an_abort_is_reported_as_an_abort_not_a_mismatch():
    from engine.text import ToolCall

    v = judge("", [], False, ToolCall("f", {}), [5, 6], [5, 7, 8], finish_reason="abort")
    assert v.aborted and v.flagged
    assert v.ref_match is None and v.well_formed is None and not v.dropped


def test_a_call_cut_by_max_tokens_is_judged_by_its_tokens_not_as_a_leak():
    from engine.text import ToolCall
    from engine.text import tokenizer as T

    cut = f"Let me look.{T.FC_OPEN}\n{T.INVOKE_OPEN}"
    v = judge(cut, [], True, ToolCall("f", {}), [5, 6], [5, 6], finish_reason="length")
    assert not v.leaked and not v.dropped and v.well_formed is None and not v.flagged
    assert judge(cut, [], True, None, [5, 6], [5, 7], finish_reason="length").flagged  # tokens
    closed = f"{T.FC_OPEN}x{T.FC_CLOSE} then{T.FC_OPEN[:6]}"
    assert judge(closed, [], None, None, None, None, finish_reason="length").leaked
    assert not judge("ok " + T.FC_OPEN[:6], [], None, None, None, None, "", "length").leaked
    assert judge(cut, [], True, None, None, None, finish_reason="stop").leaked


def test_the_load_records_each_tokens_logprob_and_unknown_ones_as_none():
    from workbench.drive.client import _apply_chunk
    from workbench.drive.record import RequestRecord

    rec, calls = RequestRecord(0, 0, "answer"), {}
    entries = [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -9999.0}]
    _apply_chunk({"choices": [{"delta": {"content": "ab"}, "logprobs": {"content": entries}}]},
                 rec, calls)
    _apply_chunk({"choices": [{"delta": {}, "finish_reason": "stop"}]}, rec, calls)
    assert rec.logprobs == [-0.5, None] and rec.token_texts == ["a", "b"]
    assert RequestRecord(0, 0, "call").row()["v_logprob_drift"] is None  # no verdict yet
