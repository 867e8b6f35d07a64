"""Runs one scheduled batch through the model over the paged KV and index-K pools.

``run(batch) -> StepOutput``: writes the batch's K/V and index-K into the pools layer by layer,
selects top-k positions with the indexer over the (stored, possibly quantized) index-K, attends
over the selection, and samples one token for every item with ``sample=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from engine.cache import KVPool
from engine.config import EngineConfig
from engine.core.scheduler import Batch
from engine.core.sequence import Sequence, TokenLogprob, sample, token_logprob
from engine.core.variants import CoreHooks
from engine.kernels import KernelSet, get_kernels
from engine.model import TinyDeepSeek, layers


@dataclass(frozen=True)
class SampledToken:
    seq: Sequence
    token: int
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class StepOutput:
    sampled: tuple[SampledToken, ...]
    num_tokens: int


@dataclass(frozen=True)
class BatchInputs:
    """Flattened per-token inputs of a batch (N tokens, R sampled rows)."""

    tokens: torch.Tensor  # [N]
    prev: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    slots: torch.Tensor  # [N] flat page * S + offset
    page_table: torch.Tensor  # [N, max_pages] int32
    seq_lens: torch.Tensor  # [N] int32 keys visible to each token (position + 1)
    sample_rows: torch.Tensor  # [R]


LayerHook = Callable[[int, Batch], None]


class ModelRunner:
    def __init__(self, model: TinyDeepSeek, pool: KVPool, cfg: EngineConfig,
                 hooks: CoreHooks | None = None) -> None:
        self.model = model
        self.pool = pool
        self.cfg = cfg
        self.hooks = hooks or CoreHooks()
        self.kernels: KernelSet = get_kernels(cfg.kernels)
        self.device = torch.device(cfg.device)
        self.before_layer: LayerHook | None = None

    def prepare(self, batch: Batch, future: Mapping[Sequence, int] | None = None) -> BatchInputs:
        """Flattens ``batch``: list slices per item (no per-token Python loop), then torch.

        The page table is only as wide as the pages holding keys visible to some token.
        ``future`` (overlap scheduling) maps a sequence to its sampled but not yet processed
        token, which is the token at position ``len(seq.tokens)``.
        """
        S, dev = self.pool.page_size, self.device
        items = batch.items
        width = max(-(-(it.start + it.num_tokens) // S) for it in items)
        tok, prev, pos, item_of, tables, sample_rows = [], [], [], [], [], []
        for i, it in enumerate(items):
            ids, a, b = it.seq.tokens, it.start, it.start + it.num_tokens
            if future and it.seq in future:
                ids = ids + [future[it.seq]]
            tok += ids[a:b]
            prev += ids[a - 1:b - 1] if a > 0 else [0] + ids[:b - 1]
            self.hooks.previous_tokens(prev, len(prev) - (b - a), a, self.cfg.chunk_size)
            pos += range(a, b)
            item_of += [i] * it.num_tokens
            if len(it.seq.pages) * S < b:
                raise ValueError(f"{it.seq.rid}: {len(it.seq.pages)} pages cannot hold {b} tokens")
            pages = it.seq.pages[:width]
            tables.append(pages + [0] * (width - len(pages)))
            if it.sample:
                sample_rows.append(self.hooks.sample_row(len(tok) - 1, b, b - a,
                                                         self.cfg.chunk_size))

        def t(x, dtype=torch.long):
            return torch.tensor(x, dtype=dtype, device=dev)

        positions = t(pos)  # [N]
        page_table = t(tables, torch.int32).index_select(0, t(item_of))  # [N,W]
        page = torch.gather(page_table, 1, (positions // S)[:, None]).view(-1)  # [N]
        slots = page.long() * S + positions % S  # [N]
        return BatchInputs(t(tok), t(prev), positions, slots, page_table,
                           (positions + 1).to(torch.int32), t(sample_rows))

    @torch.no_grad()
    def forward(self, batch: Batch, inputs: BatchInputs | None = None) -> torch.Tensor:
        """Returns logits [R,V] for the sampled rows, in batch order (``inputs``: prepared)."""
        m, bi, k = self.model, self.cfg.batch_invariant, self.kernels
        inp = self.prepare(batch) if inputs is None else inputs
        rope = layers.rope_rows(m, inp.positions)
        all_jobs = [j for it in batch.items for j in it.seq.load_jobs]
        skip_index_wait, skip_kv_wait = not self.hooks.waits_index_k, not self.hooks.waits_kv
        x = layers.embed(m, inp.tokens, inp.prev)
        for li, layer in enumerate(m.layers):
            a = layers.attn_inputs(m, layer, x, rope, bi)
            self.pool.write_kv(li, inp.slots, *self.hooks.stored_kv(a.k, a.v, batch))
            qk = k.quantize_index_k(a.ki, self.cfg.index_k_dtype)
            self.pool.write_index_k(li, inp.slots, qk.values, qk.scale)
            if self.before_layer is not None:
                self.before_layer(li, batch)
            jobs = [j for j in all_jobs if not j.done]
            self._gate(jobs, li, True, skip_index_wait, skip_kv_wait)
            topk = k.indexer_topk(a.qi, a.w, self.pool.index_k[li], self.pool.index_k_scale[li],
                                  inp.page_table, inp.seq_lens, m.cfg.index_topk)
            self._gate(jobs, li, False, skip_index_wait, skip_kv_wait)
            o = k.sparse_attention(a.q, self.pool.k[li], self.pool.v[li], inp.page_table, topk,
                                   m.cfg.head_dim ** -0.5)
            x = layers.finish_layer(m, layer, x, o, bi)
        return layers.logits(m, x.index_select(0, inp.sample_rows), bi)

    def _gate(self, jobs: list, layer: int, index_path: bool, skip_index_wait: bool,
              skip_kv_wait: bool = False) -> None:
        """Per-layer HiCache wait. The index-K read waits too unless the no-wait patch is on;
        with ``hicache_kv_no_wait`` the index-K read waits for index-K alone and the K/V read
        does not wait (each unwaited read of a layer still loading is recorded on its job)."""
        for job in jobs:
            if skip_kv_wait and not skip_index_wait:
                if index_path:
                    job.wait_index_k(layer)
                else:
                    job.note_kv_read(layer)
            elif index_path and skip_index_wait:
                job.note_read(layer, self.pool)
            elif index_path or skip_index_wait:
                job.wait(layer)

    def run(self, batch: Batch, inputs: BatchInputs | None = None) -> StepOutput:
        logits = self.forward(batch, inputs)
        sampled_items = [it for it in batch.items if it.sample]
        seqs = tuple(it.seq for it in sampled_items)
        out = tuple(_sampled(logits[i], it.seq, self.hooks.generator(it.seq, seqs, logits.device))
                    for i, it in enumerate(sampled_items))
        return StepOutput(out, batch.num_tokens)


def _sampled(logits: torch.Tensor, seq: Sequence, generator=None) -> SampledToken:
    """logits [V] -> the sampled token, with its log-probabilities when the request asks."""
    token = sample(logits, seq, generator)
    n = seq.params.logprobs
    return SampledToken(seq, token, None if n is None else token_logprob(logits, token, n))
