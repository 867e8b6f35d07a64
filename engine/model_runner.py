"""Runs one scheduled batch through the model over the paged KV and index-K pools.

``run(batch) -> StepOutput``: writes the batch's K/V and index-K into the pools layer by layer,
selects top-k positions with the indexer over the (stored, possibly quantized) index-K, attends
over the selection, and samples one token for every item with ``sample=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine import layers
from engine.config import EngineConfig
from engine.kernels import KernelSet, get_kernels
from engine.kv_pool import KVPool
from engine.model import TinyDeepSeek
from engine.scheduler import Batch
from engine.sequence import Sequence, sample


@dataclass(frozen=True)
class SampledToken:
    seq: Sequence
    token: int


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
    def __init__(self, model: TinyDeepSeek, pool: KVPool, cfg: EngineConfig) -> None:
        self.model = model
        self.pool = pool
        self.cfg = cfg
        self.kernels: KernelSet = get_kernels(cfg.kernels)
        self.device = torch.device(cfg.device)
        self.before_layer: LayerHook | None = None

    def prepare(self, batch: Batch) -> BatchInputs:
        S = self.pool.page_size
        tok, prev, pos, slots, rows, sample_rows = [], [], [], [], [], []
        width = max(len(it.seq.pages) for it in batch.items)
        for it in batch.items:
            ids = it.seq.tokens
            table = it.seq.pages + [0] * (width - len(it.seq.pages))
            for p in range(it.start, it.start + it.num_tokens):
                tok.append(ids[p])
                prev.append(ids[p - 1] if p > 0 else 0)
                pos.append(p)
                slots.append(it.seq.pages[p // S] * S + p % S)
                rows.append(table)
            if it.sample:
                sample_rows.append(len(tok) - 1)

        def t(x, dtype=torch.long):
            return torch.tensor(x, dtype=dtype, device=self.device)

        positions = t(pos)
        return BatchInputs(t(tok), t(prev), positions, t(slots), t(rows, torch.int32),
                           (positions + 1).to(torch.int32), t(sample_rows))

    @torch.no_grad()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Returns logits [R,V] for the sampled rows, in batch order."""
        m, bi, k = self.model, self.cfg.batch_invariant, self.kernels
        inp = self.prepare(batch)
        x = layers.embed(m, inp.tokens, inp.prev)
        for li, layer in enumerate(m.layers):
            a = layers.attn_inputs(m, layer, x, inp.positions, bi)
            self.pool.write_kv(li, inp.slots, a.k, a.v)
            qk = k.quantize_index_k(a.ki, self.cfg.index_k_dtype)
            self.pool.write_index_k(li, inp.slots, qk.values, qk.scale)
            if self.before_layer is not None:
                self.before_layer(li, batch)
            jobs = [j for it in batch.items for j in it.seq.load_jobs if not j.done]
            self._gate(jobs, li, index_path=True)
            topk = k.indexer_topk(a.qi, a.w, self.pool.index_k[li], self.pool.index_k_scale[li],
                                  inp.page_table, inp.seq_lens, m.cfg.index_topk)
            self._gate(jobs, li, index_path=False)
            o = k.sparse_attention(a.q, self.pool.k[li], self.pool.v[li], inp.page_table, topk,
                                   m.cfg.head_dim ** -0.5)
            x = layers.finish_layer(m, layer, x, o, bi)
        return layers.logits(m, x[inp.sample_rows], bi)

    def _gate(self, jobs: list, layer: int, index_path: bool) -> None:
        """Per-layer HiCache wait. The index-K read waits too unless the no-wait patch is on."""
        skip_index_wait = self.cfg.has("hicache_index_k_no_wait")
        for job in jobs:
            if index_path and skip_index_wait:
                job.note_read(layer, self.pool)
            elif index_path or skip_index_wait:
                job.wait(layer)

    def run(self, batch: Batch) -> StepOutput:
        logits = self.forward(batch)
        sampled_items = [it for it in batch.items if it.sample]
        out = tuple(SampledToken(it.seq, sample(logits[i], it.seq))
                    for i, it in enumerate(sampled_items))
        return StepOutput(out, batch.num_tokens)
