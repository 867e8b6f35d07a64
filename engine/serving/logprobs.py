"""Token log-probabilities in the OpenAI chat schema (``choices[i].logprobs.content``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.core.sequence import TokenLogprob
from engine.serving.responses import ChoiceLogprobs, TokenLogprobOut, TopLogprobOut
from engine.text import Tokenizer

UNKNOWN_LOGPROB = -9999.0  # OpenAI's value for a token whose logprob is not known


def _value(lp: float) -> float:
    return UNKNOWN_LOGPROB if math.isnan(lp) else lp


def choice_logprobs(tk: Tokenizer, lps: Sequence[TokenLogprob]) -> ChoiceLogprobs:
    """One entry per generated token; ``token`` is the token's raw text (control and DSML tokens
    included), so a client holding the tokenizer recovers the ids exactly."""
    def entry(lp: TokenLogprob) -> TokenLogprobOut:
        text = tk.token_text(lp.token)
        top = [TopLogprobOut(token=tk.token_text(t), logprob=v,
                             bytes=list(tk.token_text(t).encode())) for t, v in lp.top]
        return TokenLogprobOut(token=text, logprob=_value(lp.logprob), bytes=list(text.encode()),
                               top_logprobs=top)
    return ChoiceLogprobs(content=[entry(lp) for lp in lps])
