"""Response oracle: judges every response of an agentic session.

Verdicts: ``leaked`` (DSML markup in content), ``dropped`` (a call was expected and neither a call
nor any markup came back: a fail-closed parser swallowed corrupted markup), ``well_formed`` (exactly
one structured call where one was expected), ``tool_ok`` / ``args_ok`` (against the transcript), and
``ref_match``: the completion's token ids equal a single-request greedy reference computed in-
process with the same storage dtypes by the cache-free ``Reference`` (valid when the server runs
batch-invariant greedy with the torch kernels). ``logprob_drift``: the largest absolute
difference between the server's log-probability of a token and the reference's, over the tokens
both agree on; ``drifted``: that drift is above the oracle's tolerance (``LOGPROB_TOLERANCE``,
applied only where ``ref_match`` is valid), which catches corruption too small to flip a greedy
token. ``oracle_error``: the reference itself failed for this request (the request is flagged;
the run goes on).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.model import Reference, Scored, load_model
from engine.serving.generation import plan_prompt
from engine.text import Tokenizer, ToolCall, ToolSpec
from engine.text import tokenizer as T
from engine.text.dsml import LEAK_MARKERS
from engine.text.dsml_grammar import partial_suffix

LOGPROB_TOLERANCE = 1e-6
"""The largest |server logprob - reference logprob| of an agreeing token a verdict accepts
(batch-invariant greedy, torch kernels). Measured on the correct code over real PD pairs
(issue 25, ``python -m bench.logprob_drift``, ``docs/workbench.md``): max drift 0.0, bit for
bit, over 7,355 tokens of 198 responses (HiCache off; on; on with the ``hicache_race`` faults
and ``overlap_schedule``), the servers on 1 torch thread and the reference on 2. A greedy token
is the argmax of 128, so its logprob is >= -ln 128 = -4.85, where 1e-6 is >= 2 fp32 ulps (8 at
|logprob| ~1). ``hicache_v_after_counter`` (a race; no token differed in 80 responses, twice)
drifted 3 responses per run: 1.2e-6 to 1.1e-5 (3 flagged), then 7e-7 to 8.5e-6 (1 flagged);
``chunk_prev_token_dropped`` drifted up to 0.23 (17 of its 64 token-equal responses flagged)."""


@dataclass(frozen=True)
class Verdict:
    leaked: bool
    well_formed: bool | None
    tool_ok: bool | None
    args_ok: bool | None
    ref_match: bool | None
    first_diff: int | None
    dropped: bool = False
    oracle_error: str = ""  # the reference failed for this request (a flag, not a crash)
    aborted: bool = False  # the server ended it with finish_reason "abort" (not compared)
    logprob_drift: float | None = None  # max |logprob - reference's| over agreeing tokens
    drifted: bool = False  # logprob_drift above the tolerance (where one applies)

    @property
    def flagged(self) -> bool:
        return (self.leaked or self.dropped or self.ref_match is False or self.aborted
                or self.well_formed is False or bool(self.oracle_error) or self.drifted)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logprob_drift(logprobs: list[float | None], reference: list[float], agree: int
                  ) -> float | None:
    """Max ``|logprobs[i] - reference[i]|`` over the first ``agree`` positions (the tokens both
    chose alike) where the server's value is known (not None); None when there is none."""
    diffs = [abs(a - b) for a, b in zip(logprobs[:agree], reference[:agree], strict=False)
             if a is not None]
    return max(diffs) if diffs else None


class ReferenceOracle:
    """Greedy single-request references, independent of the serving code under test.

    Tokens come from ``engine.model.reference.Reference``: the model's math over contiguous
    per-position buffers, with no pages, no scheduler, no chunking, no radix or HiCache, no
    transfer; only the storage rounding (KV dtype, index-K quantization) of ``cfg`` is emulated,
    so with batch-invariant greedy and the torch kernels a correct server's tokens are equal.
    A bug in the engine's scheduler, pools or caches is therefore not shared by the oracle.
    Results are cached by (prompt, max_tokens); thread-safe. ``drift_tolerance``: the logprob
    tolerance verdicts apply (``tolerance``; None: drift reported, never flagged), None unless
    ``cfg`` serves batch-invariant with the torch kernels, the only setting where the server's
    logprobs must equal these so closely.
    """

    def __init__(self, cfg: EngineConfig, tolerance: float | None = LOGPROB_TOLERANCE) -> None:
        exact = cfg.batch_invariant and cfg.kernels == "torch"
        self.drift_tolerance = tolerance if exact else None
        base = cfg.replace(patches=frozenset(), hicache=False, faults={}, debug_capture=0,
                           kernels="torch", batch_invariant=True, prefix_cache=False)
        model = load_model(Path(base.model_dir) / "model.safetensors")
        self.reference = Reference(model, base)
        self.tokenizer = Tokenizer()
        self._cache: dict[tuple[tuple[int, ...], int], Scored] = {}
        self._lock = threading.Lock()

    def prompt_ids(self, messages: list[dict], tools: list[dict], tool_choice=None) -> list[int]:
        specs = [ToolSpec.from_openai(t) for t in tools]
        return plan_prompt(self.tokenizer, messages, specs, tool_choice).ids

    def expected(self, prompt: list[int], max_tokens: int) -> list[int]:
        """The reference's greedy tokens for ``prompt``."""
        return list(self.scored(prompt, max_tokens).tokens)

    def scored(self, prompt: list[int], max_tokens: int) -> Scored:
        """The reference's greedy tokens and their log-probabilities for ``prompt``."""
        key = (tuple(prompt), max_tokens)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = self.reference.generate_scored(list(prompt), max_tokens,
                                                                  self.tokenizer.eos_id)
            return self._cache[key]


def without_unclosed_block(text: str) -> str:
    """``text`` without the call block it ends in: up to its last block opener when that block
    has no closer, or without a trailing partial opener."""
    start = text.rfind(T.FC_OPEN)
    if start >= 0 and text.find(T.FC_CLOSE, start) < 0:
        return text[:start]
    return text[:len(text) - partial_suffix(text, T.FC_OPEN)]


def judge(content: str | None, calls: list[dict], leaked_flag: bool | None,
          expected: ToolCall | None, token_ids: list[int] | None,
          reference: list[int] | None, oracle_error: str = "",
          finish_reason: str | None = None, *, logprobs: list[float | None] | None = None,
          ref_logprobs: list[float] | None = None, tolerance: float | None = None) -> Verdict:
    """Judges one completed response; an aborted one is reported as aborted, its partial tokens
    never compared (a cut-off answer is not a corrupted one). A response cut by ``max_tokens``
    (finish_reason ``length``) is judged by its tokens: the call block it was still writing is
    content under every parser, so only markup before that unclosed block counts as leaked.
    With ``logprobs`` (the server's, None where unknown) and ``ref_logprobs`` the verdict has
    the drift over the agreeing tokens; it is ``drifted`` only when above ``tolerance``."""
    text = content or ""
    aborted = finish_reason == "abort"
    truncated = finish_reason == "length"
    if aborted:
        reference = None
    if truncated:
        text, leaked_flag = without_unclosed_block(text), None
    leaked = bool(leaked_flag) or any(m in text for m in LEAK_MARKERS)
    well = tool_ok = args_ok = None
    dropped = expected is not None and not calls and not leaked and not aborted and not truncated
    if expected is not None and not aborted and not truncated:
        well = len(calls) == 1 and not leaked
        tool_ok = well and calls[0]["name"] == expected.name
        args_ok = tool_ok and _args(calls[0]["arguments"]) == expected.arguments
    ref_match = diff = drift = None
    if token_ids is not None and reference is not None:
        diff = first_difference(token_ids, reference)
        ref_match = diff is None
        if logprobs is not None and ref_logprobs is not None:
            agree = diff if diff is not None else min(len(token_ids), len(reference))
            drift = logprob_drift(logprobs, ref_logprobs, agree)
    drifted = drift is not None and tolerance is not None and drift > tolerance
    return Verdict(leaked, well, tool_ok, args_ok, ref_match, diff, dropped, oracle_error,
                   aborted, drift, drifted)


def _args(raw: str) -> dict | None:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None
