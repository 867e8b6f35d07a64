"""How a load's request is held to the greedy reference given the API features it used: which
requests have a reference at all (``judged_reference``), which tokens of it the server must
reproduce (``compared_tokens``), and the per-feature oracles' verdict (``feature_verdict``)."""

from __future__ import annotations

from engine.model import Scored
from engine.text import Tokenizer
from workbench.drive.dialects import RequestParams
from workbench.drive.record import RequestRecord
from workbench.judge.features import (
    FeatureVerdict,
    expected_tokens,
    length_ok,
    reference_text,
    stop_cut,
    stop_ok,
    text_ok,
    top1_ok,
    usage_ok,
)

_TK = Tokenizer()


def judged_reference(params: RequestParams) -> bool:
    """A greedy reference applies: not sampled, and no ``tool_choice`` (which forces a prefix
    the reference's prompt does not hold)."""
    return not params.sampled and params.tool_choice is None


def compared_tokens(rec: RequestRecord, ref: Scored | None
                    ) -> tuple[list[int] | None, list[int] | None]:
    """(reference, server tokens) as far as they must agree: the reference cut after a stop
    match; with ``ignore_eos`` both without EOS and the server's as long as the reference."""
    if ref is None:
        return None, rec.token_ids
    p, tokens = rec.params, rec.token_ids
    want = expected_tokens(ref.tokens, reference_text(ref.tokens, _TK), p.stop, p.ignore_eos,
                           _TK.eos_id)
    if p.ignore_eos and tokens is not None and _TK.eos_id in ref.tokens:
        tokens = tokens[:len(want)]
    return want, tokens


def feature_verdict(rec: RequestRecord, ref: Scored | None) -> FeatureVerdict:
    """Every feature oracle that applies to ``rec`` (the seed oracle is set after the burst);
    none for an answer the server aborted (it is reported as aborted, never compared)."""
    if rec.finish_reason == "abort":
        return FeatureVerdict()
    usage = usage_ok(rec.usage, rec.token_ids,
                     rec.prompt_ids if judged_reference(rec.params) else None)
    top1 = top1_ok(rec.token_texts, rec.top_logprobs) if judged_reference(rec.params) else None
    if ref is None:
        return FeatureVerdict(usage_ok=usage, top1_ok=top1)
    pieces, p = reference_text(ref.tokens, _TK), rec.params
    cut = stop_cut(pieces, p.stop) if p.stop else None
    answer = rec.kind == "answer" and not rec.tool_calls
    want = expected_tokens(ref.tokens, pieces, (), p.ignore_eos, _TK.eos_id)
    text = text_ok(rec.content, reference_text(want, _TK), p.ignore_eos) \
        if answer and cut is None else None
    return FeatureVerdict(
        stop_ok=stop_ok(rec.content, pieces, p.stop, rec.finish_reason) if answer else None,
        text_ok=text,
        length_ok=length_ok(rec.token_ids, ref.tokens, rec.max_tokens or 0, rec.finish_reason,
                            p.ignore_eos, _TK.eos_id, cut is not None),
        usage_ok=usage, top1_ok=top1)
