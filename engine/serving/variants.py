"""Hook points of the OpenAI serving layer (what a request's answer says about the tokens the
engine generated) and the variants behind them (``engine.variants``). ``ServingHooks`` is the
correct behaviour; each mixin reproduces one zoo entry of ``engine.patches`` that only a
request feature reaches (stop strings while streaming, the unstreamed path, ``max_tokens``
budgets, usage accounting)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.text.dsml_grammar import partial_suffix
from engine.variants import variant


class ServingHooks:
    """Choices of one server, fixed at construction."""

    def held_back(self, text: str, stops: Sequence[str]) -> int:
        """How many characters at the end of the streamed ``text`` are withheld because they
        may still become a stop string: the longest tail that begins one."""
        return max(partial_suffix(text, s) for s in stops)

    def unstreamed_text(self, text: str, last_piece: str) -> str:
        """The text an unstreamed answer is parsed from (``last_piece``: its last token's
        text): all of it."""
        return text

    def completion_tokens(self, generated: int, streamed: bool) -> int:
        """``usage.completion_tokens`` of an answer of ``generated`` tokens."""
        return generated

    def token_budget(self, max_tokens: int, explicit: bool) -> int:
        """The tokens a request may generate (``explicit``: its ``max_tokens`` was sent)."""
        return max_tokens


@variant("stream_stop_prefix_released")
class StreamStopPrefixReleased(ServingHooks):
    def held_back(self, text: str, stops: Sequence[str]) -> int:
        return 0  # a tail that starts a stop string is streamed before the match completes


@variant("unstreamed_last_piece_dropped")
class UnstreamedLastPieceDropped(ServingHooks):
    def unstreamed_text(self, text: str, last_piece: str) -> str:
        return text[:len(text) - len(last_piece)] if last_piece and text.endswith(last_piece) \
            else text


@variant("stream_usage_counts_first_token_twice")
class StreamUsageCountsFirstTokenTwice(ServingHooks):
    def completion_tokens(self, generated: int, streamed: bool) -> int:
        return generated + 1 if streamed and generated else generated


@variant("max_tokens_budget_one_short")
class MaxTokensBudgetOneShort(ServingHooks):
    def token_budget(self, max_tokens: int, explicit: bool) -> int:
        return max(1, max_tokens - 1) if explicit else max_tokens
