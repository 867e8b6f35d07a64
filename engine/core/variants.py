"""Hook points of the engine loop, the model runner and the HiCache loader they build, and the
variants behind them (``engine.variants``). ``CoreHooks`` is the correct behaviour (and the
non-overlap schedule); each mixin reproduces one zoo entry or modifier of ``engine.patches``."""

from __future__ import annotations

import dataclasses

import torch

from engine.variants import variant


class CoreHooks:
    """Choices of one engine, fixed at construction."""

    overlap = False  # the overlap schedule (a modifier, not a bug)
    waits_index_k = True  # the indexer waits for a loading layer's index-K
    waits_kv = True  # the attention waits for a loading layer's K/V
    backs_up_index_k = True  # HiCache's host tier keeps index-K with K/V
    v_after_counter = False  # V of a loaded layer lands after its done counter advanced
    partial_page_min: float | None = None  # a partly matching cached page is reused whole

    def previous_tokens(self, prev: list[int], first: int, start: int, chunk: int) -> None:
        """Adjusts ``prev`` (each token's predecessor) for a chunk starting at token ``start``
        whose first entry is ``prev[first]``; correct: nothing to adjust."""

    def sample_row(self, last_row: int, end: int, num_tokens: int, chunk: int) -> int:
        """The row whose logits choose the next token of an item ending at token ``end``:
        its last row."""
        return last_row

    def stored_kv(self, k, v, batch):
        """The K/V rows the batch writes into the pool: as computed."""
        return k, v

    def future_tokens(self, live: tuple, resolved: tuple) -> dict:
        """Overlap scheduling: the tokens forward k-1 sampled that forward k reads as inputs,
        by sequence (``live``: those of sequences still running; ``resolved``: all, in batch
        order, including the discarded ones of sequences that finished meanwhile)."""
        return {s.seq: s.token for s in live}

    def generator(self, seq, batch: tuple, device) -> torch.Generator | None:
        """The generator ``seq`` samples from in a step that samples ``batch`` (the sequences,
        in batch order): its own (None)."""
        return None

    def route_tokens(self, sampled: tuple) -> tuple:
        """The (request, token) pairs a step's sampled rows are accepted as (``SampledToken``s,
        in batch order); correct: each row's token goes to the request it was sampled for."""
        return sampled


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


@variant("chunk_end_sample_row_off_by_one")
class ChunkEndSampleRow(CoreHooks):
    def sample_row(self, last_row: int, end: int, num_tokens: int, chunk: int) -> int:
        if num_tokens > 1 and end % chunk == 0:
            return last_row - 1  # a chunk-relative index: one short on a chunk boundary
        return last_row


@variant("overlap_future_token_slot_shift")
class FutureTokensBySlot(CoreHooks):
    def future_tokens(self, live: tuple, resolved: tuple) -> dict:
        return {s.seq: r.token for s, r in zip(live, resolved, strict=False)}


@variant("radix_partial_page_rounded_up")
class PartialPageRoundedUp(CoreHooks):
    partial_page_min = 0.5


@variant("decode_kv_fp8_roundtrip")
class DecodeKvFp8(CoreHooks):
    def stored_kv(self, k, v, batch):
        steps = torch.tensor([it.num_tokens == 1 for it in batch.items
                              for _ in range(it.num_tokens)])
        if not bool(steps.any()):
            return k, v
        k, v = k.clone(), v.clone()  # decode steps store through an fp8 intermediate
        k[steps] = k[steps].to(torch.float8_e4m3fn).to(k.dtype)
        v[steps] = v[steps].to(torch.float8_e4m3fn).to(v.dtype)
        return k, v


@variant("token_handoff_after_finish")
class TokenHandoffAfterFinish(CoreHooks):
    _last: tuple[str, ...] = ()  # the previous step's rows, by request id

    def route_tokens(self, sampled: tuple) -> tuple:
        rows, last = list(sampled), self._last
        self._last = tuple(s.seq.rid for s in rows)
        now = set(self._last)
        gone = [i for i, rid in enumerate(last) if rid not in now]
        if not gone or not rows:
            return sampled
        k = gone[0]  # the first row that left: the two rows now at its place trade tokens
        if k + 1 < len(rows) and rows[k].seq.rid in last and rows[k + 1].seq.rid in last:
            a, b = rows[k], rows[k + 1]
            rows[k] = dataclasses.replace(a, token=b.token, logprob=b.logprob)
            rows[k + 1] = dataclasses.replace(b, token=a.token, logprob=a.logprob)
        return tuple(rows)


@variant("sampling_generator_shared_in_batch")
class SamplingGeneratorSharedInBatch(CoreHooks):
    def generator(self, seq, batch: tuple, device) -> torch.Generator | None:
        sampled = [s for s in batch if s.params.temperature > 0.0]
        return sampled[0].rng(device) if sampled else None  # the batch's first seed for all
