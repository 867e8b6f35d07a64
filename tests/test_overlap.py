"""Overlap scheduling (patch ``overlap_schedule``) on the shipped model: same tokens as without it,
aborts, page accounting, the one-step-late release (a PD pair with it: ``tests/test_pd.py``)."""

from __future__ import annotations

from engine.core import Engine
from engine.core.sequence import FinishReason, SamplingParams, Sequence, Status, TokenEvent
from engine.model import Reference
from engine.text import render_prompt
from engine.training import make_transcript

OVERLAP = "overlap_schedule"


def chat_prompts(eng: Engine, n: int, seed: int = 300) -> list[list[int]]:
    """Prompts of the shipped model's own domain (first turns of seeded transcripts)."""
    out = []
    for i in range(n):
        tr = make_transcript(seed + i)
        out.append(eng.tokenizer.encode(render_prompt(tr.messages(upto_round=0), list(tr.tools))))
    return out


def params(i: int) -> SamplingParams:
    if i % 3 == 2:  # seeded sampling replays too: each sequence draws from its own generator
        return SamplingParams(max_tokens=10 + i, temperature=0.8, seed=i)
    return SamplingParams(max_tokens=[1, 24, 7, 16, 3, 30][i % 6])


def run_mix(make, patches: str, n: int = 6, **cfg) -> tuple[Engine, list[Sequence]]:
    """``n`` concurrent requests; the second half, submitted mid-run, extends the first half's
    prompts (prefix-cache hits once those finished)."""
    eng = make(patches=patches, **cfg)
    ps = chat_prompts(eng, n)
    ps[n // 2:] = [ps[i - n // 2] + ps[i][8:40] for i in range(n // 2, n)]
    seqs = [eng.submit(Sequence(f"m{i}", p, params(i))) for i, p in enumerate(ps[: n // 2])]
    for _ in range(3):
        eng.step()
    seqs += [eng.submit(Sequence(f"m{i}", p, params(i)))
             for i, p in enumerate(ps[n // 2:], n // 2)]
    eng.run_until_idle()
    return eng, seqs


def assert_no_page_leak(eng: Engine) -> None:
    assert eng.overlap is None or eng.overlap.inflight is None
    assert eng.allocator.num_free + eng.cache.num_pages == eng.allocator.num_pages
    eng.cache.evict(eng.cache.num_pages)
    assert eng.allocator.num_free == eng.allocator.num_pages


def test_overlap_tokens_equal_non_overlap_and_reference(make_engine):
    base, base_seqs = run_mix(make_engine, "")
    eng, seqs = run_mix(make_engine, OVERLAP)
    assert base.overlap is None and eng.overlap is not None
    assert [s.output for s in seqs] == [s.output for s in base_seqs]
    assert [s.finish_reason for s in seqs] == [s.finish_reason for s in base_seqs]
    assert sum(s.num_cached for s in seqs) > 0, "the shared prefix should hit the radix cache"
    ref = Reference(eng.model, eng.cfg)
    seq = seqs[1]  # greedy, 24 tokens
    assert seq.output == ref.generate(seq.prompt, 24, eng.tokenizer.eos_id)[: len(seq.output)]
    stats = eng.overlap.stats
    assert stats.discarded_tokens > 0, "finished sequences run once more, their token discarded"
    assert eng.stats.generated_tokens == base.stats.generated_tokens
    assert_no_page_leak(base)
    assert_no_page_leak(eng)


def test_overlap_abort_mid_decode(make_engine):
    eng = make_engine(patches=OVERLAP)
    ps = chat_prompts(eng, 2, seed=40)
    events: list[TokenEvent] = []
    victim = eng.submit(Sequence("victim", ps[0], SamplingParams(max_tokens=40), events.append))
    other = eng.submit(Sequence("other", ps[1], SamplingParams(max_tokens=12)))
    while len(victim.output) < 4:
        eng.step()
    eng.abort("victim")
    eng.step()  # the abort is deferred: the victim is scheduled once more, then finished
    assert victim.status is Status.FINISHED and victim.finish_reason is FinishReason.ABORT
    assert victim.pages == [] and eng.overlap.stats.deferred_aborts == 1
    eng.run_until_idle()
    assert len(victim.output) < 40 and events[-1].finish_reason is FinishReason.ABORT
    assert [e.token for e in events[:-1]] == victim.output
    assert eng.stats.finished["abort"] == 1
    alone = make_engine().generate(ps[1], SamplingParams(max_tokens=12))
    assert other.output == alone
    assert_no_page_leak(eng)


def trajectory(make, patches: str, steps: int) -> tuple[Engine, Sequence, list[tuple]]:
    """(free pages, tokens delivered, status) after each of ``steps`` steps of one request."""
    eng = make(patches=patches, prefix_cache=False)
    prompt = chat_prompts(eng, 1)[0][:200]  # one prefill chunk
    seq = eng.submit(Sequence("late", prompt, SamplingParams(max_tokens=3)))
    rows = []
    for _ in range(steps):
        ran = eng.step()
        rows.append((eng.allocator.num_free, len(seq.output), seq.status, ran is not None))
    return eng, seq, rows


def test_overlap_releases_finished_pages_one_step_late(make_engine):
    base, _, plain = trajectory(make_engine, "", 4)
    eng, seq, late = trajectory(make_engine, OVERLAP, 6)
    full, held = eng.allocator.num_pages, plain[0][0]
    assert held < full
    # Without overlap: steps 1-3 each sample a token; step 3 finishes and frees at once.
    assert plain == [(held, 1, Status.RUNNING, True), (held, 2, Status.RUNNING, True),
                     (full, 3, Status.FINISHED, True), (full, 3, Status.FINISHED, False)]
    # With overlap, step k processes step k-1's token: after step 3 (whose forward sampled the
    # last token) the pages are still held, and step 4 schedules the finished request once more
    # before releasing it; step 5 resolves and discards that extra token.
    assert late == [(held, 0, Status.RUNNING, True), (held, 1, Status.RUNNING, True),
                    (held, 2, Status.RUNNING, True), (full, 3, Status.FINISHED, True),
                    (full, 3, Status.FINISHED, True), (full, 3, Status.FINISHED, False)]
    assert eng.overlap.stats.discarded_tokens == 1 and eng.stats.steps == base.stats.steps + 1
    assert seq.output == base.generate(seq.prompt, SamplingParams(max_tokens=3))


def test_overlap_prefill_only_scheduler_never_decodes(make_engine):
    eng = make_engine(patches=OVERLAP, prefix_cache=False)
    eng.scheduler.prefill_only = True  # what PrefillEngine sets: the decode runs elsewhere
    seq = eng.submit(Sequence("p", chat_prompts(eng, 1)[0], SamplingParams(max_tokens=1)))
    eng.run_until_idle()
    assert len(seq.output) == 1 and eng.overlap.stats.discarded_tokens == 0
    assert eng.stats.steps == -(-len(seq.prompt) // eng.cfg.chunk_size)
    assert eng.allocator.num_free == eng.allocator.num_pages
