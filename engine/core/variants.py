"""Hook points of the engine loop, the model runner and the HiCache loader they build, and the
variants behind them (``engine.variants``). ``CoreHooks`` is the correct behaviour (and the
non-overlap schedule); each mixin reproduces one zoo entry or modifier of ``engine.patches``."""

from __future__ import annotations

from engine.variants import variant


class CoreHooks:
    """Choices of one engine, fixed at construction."""

    overlap = False  # the overlap schedule (a modifier, not a bug)
    waits_index_k = True  # the indexer waits for a loading layer's index-K
    waits_kv = True  # the attention waits for a loading layer's K/V
    backs_up_index_k = True  # HiCache's host tier keeps index-K with K/V
    v_after_counter = False  # V of a loaded layer lands after its done counter advanced

    def previous_tokens(self, prev: list[int], first: int, start: int, chunk: int) -> None:
        """Adjusts ``prev`` (each token's predecessor) for a chunk starting at token ``start``
        whose first entry is ``prev[first]``; correct: nothing to adjust."""


@variant("overlap_schedule")
class Overlap(CoreHooks):
    overlap = True


@variant("hicache_index_k_no_wait")
class IndexKNoWait(CoreHooks):
    waits_index_k = False


@variant("hicache_kv_no_wait")
class KvNoWait(CoreHooks):
    waits_kv = False


@variant("index_k_not_backed_up")
class IndexKNotBackedUp(CoreHooks):
    backs_up_index_k = False


@variant("hicache_v_after_counter")
class VAfterCounter(CoreHooks):
    v_after_counter = True


@variant("chunk_prev_token_dropped")
class ChunkPrevTokenDropped(CoreHooks):
    def previous_tokens(self, prev: list[int], first: int, start: int, chunk: int) -> None:
        if start > 0 and start % chunk == 0:
            prev[first] = 0  # the chunk's first token loses its previous token
