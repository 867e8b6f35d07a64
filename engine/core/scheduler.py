"""Continuous-batching scheduler with chunked prefill, prefix reuse and page reservation.

Each step decodes every running sequence (one token each) and fills the remaining token budget
with prefill chunks, oldest first. A sequence is admitted only when pages for its whole budget
(prompt + max_tokens) can be reserved, so a running sequence never runs out of pages.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from engine.cache import PageAllocator, RadixCache
from engine.config import EngineConfig
from engine.core.sequence import FinishReason, Sequence, Status

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduledSeq:
    """Compute tokens ``[start, start + num_tokens)`` of ``seq``; sample after the last if set."""

    seq: Sequence
    start: int
    num_tokens: int
    sample: bool


@dataclass(frozen=True)
class Batch:
    items: tuple[ScheduledSeq, ...]

    @property
    def num_tokens(self) -> int:
        return sum(it.num_tokens for it in self.items)

    def __bool__(self) -> bool:
        return bool(self.items)


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


class Scheduler:
    def __init__(self, cfg: EngineConfig, allocator: PageAllocator, cache: RadixCache | None):
        self.cfg = cfg
        self.alloc = allocator
        self.cache = cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # PD prefill with overlap scheduling: never decode (a prefill sequence ends at its first
        # token, which that mode processes a step late).
        self.prefill_only = False

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def find(self, rid: str) -> Sequence | None:
        return next((s for s in [*self.running, *self.waiting] if s.rid == rid), None)

    def _admit(self, seq: Sequence) -> bool:
        S = self.cfg.page_size
        match = None
        if self.cache is not None:
            match = self.cache.match(seq.prompt, max_tokens=len(seq.prompt) - 1)
        cached = list(match.pages) if match else []
        need = pages_for(seq.max_total_tokens, S) - len(cached)
        if need > self.alloc.num_free and self.cache is not None:
            self.cache.evict(need - self.alloc.num_free)
        if need > self.alloc.num_free:
            self.alloc.free(cached)
            return False
        seq.pages = cached + self.alloc.alloc(need)
        seq.load_jobs = match.jobs if match else ()
        for job in seq.load_jobs:
            job.rids.add(seq.rid)
        seq.num_computed = seq.num_cached = len(cached) * S
        seq.status = Status.RUNNING
        return True

    def schedule(self) -> Batch:
        """Decode tokens for running sequences first, then prefill chunks within the budget."""
        budget = self.cfg.max_batch_tokens
        items: list[ScheduledSeq] = []
        for seq in self.running:
            if not seq.in_prefill and budget > 0 and not self.prefill_only:
                items.append(ScheduledSeq(seq, seq.num_computed, 1, sample=True))
                budget -= 1
        while self.waiting and len(self.running) < self.cfg.max_running:
            if not self._admit(self.waiting[0]):
                break
            self.running.append(self.waiting.popleft())
        for seq in self.running:
            if seq.in_prefill and budget > 0:
                n = min(len(seq.prompt) - seq.num_computed, budget, self.cfg.chunk_size)
                done = seq.num_computed + n == len(seq.prompt)
                items.append(ScheduledSeq(seq, seq.num_computed, n, sample=done))
                budget -= n
        return Batch(tuple(items))

    def finish(self, seq: Sequence, reason: FinishReason, release: bool = True) -> None:
        """Drops a sequence; with ``release`` also frees its pages (see ``release``)."""
        seq.status, seq.finish_reason = Status.FINISHED, reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            return
        if release:
            self.release(seq)

    def release(self, seq: Sequence) -> None:
        """Caches a finished sequence's full computed pages (unless aborted or failed), then frees
        them."""
        reason = seq.finish_reason
        if self.cache is not None and reason not in (FinishReason.ABORT, FinishReason.ERROR):
            self.cache.insert(seq.tokens[: seq.num_computed], seq.pages)
        self.alloc.free(seq.pages)
        seq.pages = []
        if self.cache is not None and self.cfg.hicache_offload_on_finish:
            self.cache.evict(self.cache.num_pages)
