"""Named patch variants that reproduce real PD bug classes. Every one is off by default.

A launch selects any combination by name (``--set patches=a,b``); ``PatchSet`` validates names
against the registry and is reported by ``/debug/patches``. Each ``Patch`` is the one record of
its variant: what it reproduces, where it arises, what it needs, whether simulation drives it,
and (``behaviour``) the hook mixins that are its code. Every list of patches is derived from the
records; no other module spells a patch's name (``tests/test_layout.py``).
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass

from engine.registry import Registry


class Component(enum.Enum):
    """Where a variant's fault arises along a request's path (the localizer's stages by name:
    ``workbench.observe.Stage``). Ground truth for scoring (``bench.zoo``); the investigation
    never reads it."""

    ROUTER = "router"
    PREFILL = "prefill"
    TRANSFER = "transfer"
    DECODE = "decode"
    SAMPLING = "sampling"
    ENGINE_LOOP = "engine_loop"
    SERVING = "serving"  # the OpenAI layer: what the answer says of the tokens generated


class SimScope(enum.Enum):
    """Where the deterministic simulation (``workbench.sim``) runs a variant's code."""

    NONE = "none"  # not driven by simulation: a real deployment only
    ENGINE = "engine"  # one engine with its HiCache loader (and the overlap forward thread)
    PD = "pd"  # a simulated PD pair only (transfer layer, control plane)


VARIANT_SEAMS = ("engine.core.variants", "engine.disagg.variants", "engine.router.variants",
                 "engine.serving.variants")
"""The modules whose hook mixins are patch behaviour (``engine.variants.variant``)."""


@dataclass(frozen=True)
class Patch:
    """A patch variant. ``modifier`` ones are not bugs on their own (they change timing or
    scheduling); ``mirrors`` names the public bug class the variant reproduces; ``rare`` ones
    need a narrow interleaving (simulation's test cases; kept out of the real-mode zoo).
    ``components``: where it arises (empty for modifiers); ``needs``: engine modes
    (``workbench.drive.modes``) without which it cannot fire; ``sim``: where simulation runs it;
    ``config``: ``EngineConfig`` fields it sets (its whole effect when it has no mixin)."""

    name: str
    description: str
    bug_class: str
    mirrors: str = ""
    modifier: bool = False
    rare: bool = False  # its failure needs a narrow interleaving
    components: frozenset[Component] = frozenset()
    needs: tuple[str, ...] = ()
    sim: SimScope = SimScope.NONE
    config: tuple[tuple[str, str], ...] = ()

    @property
    def behaviour(self) -> tuple[type, ...]:
        """The hook mixins registered under this name (``variant``), seam by seam."""
        for module in VARIANT_SEAMS:
            importlib.import_module(module)
        return tuple(_MIXINS.get(self.name, ()))


_MIXINS: dict[str, list[type]] = {}


def variant(patch: str):
    """Registers the decorated mixin as (part of) patch ``patch``'s behaviour; an unknown name
    raises ``UnknownVariantError`` listing the valid ones."""
    PATCHES.get(patch)

    def register(mixin: type) -> type:
        _MIXINS.setdefault(patch, []).append(mixin)
        return mixin
    return register


_R, _P, _T, _D = Component.ROUTER, Component.PREFILL, Component.TRANSFER, Component.DECODE
_S, _E, _O = Component.SAMPLING, Component.ENGINE_LOOP, Component.SERVING
_ENGINE, _PD = SimScope.ENGINE, SimScope.PD


def _at(*components: Component) -> frozenset[Component]:
    return frozenset(components)


PATCHES: Registry[Patch] = Registry("patch variant")
for _p in (
    Patch("hicache_index_k_no_wait",
          "HiCache layer-wise load-back: index-K of layer i is not covered by the per-layer "
          "done counter that gates the main KV read (it lands after the counter advanced) and "
          "the indexer reads it without waiting; the PD KV sender, trusting the counter, ships "
          "index-K pages still loading.",
          "missing synchronization (read-before-load race) -> stale index-K at the prefill and, "
          "shipped, at every decode step: wrong top-k, corrupted output / DSML leaking into "
          "content", "layer-wise cache load without a per-layer ready gate (the seed's bug)",
          components=_at(_P), sim=_ENGINE),
    Patch("bf16_index_k",
          "Store index-K in bf16 instead of fp8 e4m3: twice the bytes per token, so every copy "
          "of index-K (load-back, transfer) takes longer.",
          "race-window widening (a benign-looking change that makes a latent race fire)",
          modifier=True,
          sim=_ENGINE, config=(("index_k_dtype", "bf16"),)),
    Patch("abort_orphan_transfer_entry",
          "Decode abort cleanup marks the room Failed but leaves its entry (and its pages) in "
          "the transfer queue.",
          "resource leak -> transfer queue fills with orphans and wedges",
          "abort cleanup leaving transfer-queue entries (the seed's wedge)",
          components=_at(_D), sim=_PD),
    Patch("late_write_after_abort",
          "Decode frees an aborted room's pages at once, while the prefill may still be "
          "writing into them; the pages are reused by another request.",
          "use-after-free via a late one-sided NIXL WRITE -> corruption of an unrelated request",
          "freeing pages a one-sided WRITE may still land in",
          components=_at(_T, _D), sim=_PD),
    Patch("overlap_schedule",
          "Overlap scheduling: the next batch is scheduled while the previous step's results "
          "are still being processed, so finished/aborted requests are released one step late.",
          "ordering change that shifts race windows (SGLang's default overlap mode)",
          modifier=True,
          sim=_ENGINE),
    Patch("hicache_kv_no_wait",
          "HiCache layer-wise load-back: the attention reads a loaded prefix's K/V of layer i "
          "without waiting for the layer's done counter (only index-K is waited for), and the "
          "PD sender ships K/V pages still loading.",
          "missing synchronization on K/V (read-before-load race) -> stale K/V, corrupted output",
          "layer-wise cache load without a per-layer ready gate",
          components=_at(_P), sim=_ENGINE),
    Patch("chunk_prev_token_dropped",
          "Chunked prefill: the first token of every chunk starting at a multiple of chunk_size "
          "is prepared without its previous-token input, as if chunks were prepared "
          "independently.",
          "deterministic scheduling / batch-preparation bug -> every prompt crossing a chunk "
          "boundary is corrupted at that position, in K, V and index-K",
          "chunked-prefill position or input offset errors",
          components=_at(_P), sim=_ENGINE),
    Patch("index_k_not_backed_up",
          "HiCache eviction backs K/V up to host memory but not index-K (and its scales): a "
          "prefix loaded back has host index-K that was never written.",
          "cache-tier coverage bug -> a reloaded prefix has garbage index-K, wrong top-k",
          "a new per-token buffer (the DSA indexer's) missing from the host cache tier",
          components=_at(_P), sim=_ENGINE),
    Patch("aux_read_before_landed",
          "Decode starts decoding once every KV layer arrived, without waiting for the aux row's "
          "notification, and trusts a still-zero aux row (no room check when it reads 0).",
          "metadata race -> the first token read from a zero aux row",
          "SGLang's decode metadata gate (aux/metadata buffer read before it was written)",
          components=_at(_T), sim=_PD),
    Patch("aux_slot_double_free",
          "Decode returns a room's aux slot to the free list twice when it starts decoding, so "
          "two later rooms share one aux slot.",
          "resource double-free on the decode -> a room reads another room's aux row "
          "(aux room X != Y, aborted requests or wrong first tokens)",
          "double free of transfer metadata slots",
          components=_at(_T, _D), sim=_PD),
    Patch("sender_stale_prefix_pages",
          "PD sender: the cached-prefix part of a room is shipped from the pages the same "
          "sender worker shipped for its previous room.",
          "wrong source pages in a transfer -> the decode holds another request's K/V prefix",
          "a KV sender shipping another request's cached pages (stale page-index reuse)",
          components=_at(_T), sim=_PD),
    Patch("index_k_scale_not_sent",
          "PD sender ships K, V and index-K but not the index-K scales: the decode reads "
          "whatever scales its pages held.",
          "incomplete transfer of a buffer family -> the decode's indexer picks wrong top-k",
          "a per-token buffer left out of the KV transfer (indexer buffers in PD)",
          components=_at(_T), sim=_PD),
    Patch("late_notification_recreates_room",
          "Decode: a notification for a room it no longer tracks (e.g. the prefill's DONE after "
          "decoding started) re-creates that room's transfer state, which then never ends.",
          "state resurrection -> rooms stuck in Transferring, bookkeeping grows without bound",
          "late notifications recreating cleared transfer state",
          components=_at(_D), sim=_PD),
    Patch("transfer_timeout_leaks_room",
          "Decode: a room whose transfer times out is dropped from the transfer queue without "
          "freeing its pages or aux slot.",
          "resource leak on a timeout path -> pages and aux slots drain away, the queue wedges",
          "a transfer timeout that leaks the room",
          components=_at(_D), sim=_PD),
    Patch("chunk_end_sample_row_off_by_one",
          "Chunked prefill: the row whose logits choose a prompt's first token is computed "
          "chunk-relative, one short when the prompt ends exactly on a chunk boundary, so the "
          "first token is chosen from the second-to-last prompt position.",
          "off-by-one at an aligned length -> a wrong first token on exactly the prompts whose "
          "length is a multiple of chunk_size (one in 256 by chance)",
          "last-token logits index of an extend batch wrong on a chunk boundary",
          components=_at(_P, _S)),
    Patch("overlap_future_token_slot_shift",
          "Overlap scheduling: the tokens forward k-1 sampled are handed to forward k by batch "
          "slot, not by request; the slot of a request that finished meanwhile still holds its "
          "discarded token, so every request after it in the batch reads its neighbour's token.",
          "engine-loop token bookkeeping that exists only in overlap mode -> requests decode "
          "from another request's token after any request in the batch finishes",
          "SGLang's overlap future-token map resolving by slot index after batch composition "
          "changed",
          components=_at(_E), needs=("overlap",)),
    Patch("radix_partial_page_rounded_up",
          "Radix prefix match: when the shared prefix ends mid-page and at least half of that "
          "page matches a cached page, the cached page is reused whole, so the prompt's tokens "
          "after the shared part read another request's K/V.",
          "cache match granularity error on a prefix hit ending mid-page -> the prompt's tail "
          "of that page attends to stale K/V, corrupted output",
          "page-granular radix matching that rounds a partially matching page up (page_size > 1 "
          "prefix reuse)",
          components=_at(_P)),
    Patch("decode_kv_fp8_roundtrip",
          "Decode steps store their new K/V through an fp8 (e4m3) intermediate although the "
          "cache is fp32 (prefill chunks store it exactly).",
          "silent precision loss on one write path -> logprobs drift (by ~1e-6 on this confident "
          "model) while greedy tokens do not flip: invisible to a token-level oracle",
          "a decode-only KV store path (fused or graph-captured kernel) casting through a lower "
          "precision than the cache",
          components=_at(_D)),
    Patch("router_room_block_refill_race",
          "Router: bootstrap rooms are handed out from blocks of 4 drawn at once; a request "
          "that finds its block spent waits for the refill (a 100 ms reservation), and every "
          "request that waited on one refill takes the new block's first room (its index was "
          "read before the await and not read again), so two concurrent requests share a room.",
          "stale local across an await in control-plane id allocation -> two concurrent "
          "requests share a bootstrap room: the prefill refuses one, the decode runs both, one "
          "decodes from its neighbour's KV and the other fails",
          "a PD router's bootstrap-room / transfer-id allocation colliding under concurrency",
          components=_at(_R)),
    Patch("token_handoff_after_finish",
          "Engine loop: in the step after a running request finishes, the sampled tokens of the "
          "two rows that follow its old place in the batch are accepted by each other's "
          "requests (the row-to-request mapping still counts the finished row).",
          "batch bookkeeping off by one after a request leaves the batch -> neighbouring "
          "requests swap one token each, with every KV buffer right for what they hold",
          "output tokens appended to the wrong request after the running batch was filtered "
          "(stale row indices when a finished request is removed mid-batch)",
          components=_at(_E)),
    Patch("hicache_v_after_counter",
          "HiCache layer-wise load-back advances a layer's done counter after copying K but "
          "before copying V: a forward woken by the counter reads that layer's V from the "
          "page's previous contents, if it gets there before the (small, undelayed) V copy.",
          "readiness published between the halves of a two-part write: a window of one small "
          "copy, so the failure needs a rare interleaving",
          "a ready flag or event recorded before the last buffer of a group was written",
          rare=True, components=_at(_P), sim=_ENGINE),
    Patch("prealloc_parked_after_check",
          "Prefill: a prealloc whose room it has not seen yet is parked for the room's request "
          "under a second acquisition of the lock, not the one that looked the room up: a "
          "request registered in between never finds it, and the room waits in bootstrap "
          "until the decode's KV timeout.",
          "lost wakeup (check-then-act across two critical sections): a window of a few "
          "bytecodes between two threads, so the failure needs a rare interleaving",
          "a bootstrap handshake that parks a message for a peer that registered meanwhile",
          rare=True, components=_at(_R), sim=_PD),
    Patch("stream_stop_prefix_released",
          "Streaming with stop strings: a tail that may still become a stop string is not held "
          "back, so the stop string's start is streamed before its match completes.",
          "incremental stop matching that releases a partial match -> streamed content holds "
          "the beginning of the stop sequence the client asked to end before",
          "stop strings spanning token boundaries leaking into streamed output",
          components=_at(_O)),
    Patch("unstreamed_last_piece_dropped",
          "Unstreamed answers are built without the last token's text (the final detokenizer "
          "step is not flushed): a truncated answer loses its last characters.",
          "a non-streaming path that drops the final incremental-detokenization step -> "
          "content one token short where the answer is cut by max_tokens",
          "non-streamed output missing the last detokenized piece",
          components=_at(_O)),
    Patch("stream_usage_counts_first_token_twice",
          "Streamed usage (stream_options.include_usage): completion_tokens counts the "
          "prefill's first token again.",
          "usage accounting off by one on one path -> billing and clients' budgets disagree "
          "with the tokens returned",
          "usage.completion_tokens disagreeing with the tokens streamed",
          components=_at(_O)),
    Patch("max_tokens_budget_one_short",
          "A request that sets max_tokens gets one token less (the prefill's first token counted "
          "twice): an answer cut by it ends a token early with finish_reason length.",
          "token budget off by one at the max_tokens limit -> truncated answers a token short",
          "max_tokens enforcement off by one (the first token counted twice)",
          components=_at(_O)),
    Patch("sampling_generator_shared_in_batch",
          "Seeded sampling: in a step that samples several requests, all draw from the first "
          "one's generator, so a seeded request gives other tokens in a burst than alone.",
          "per-request random state shared across a batch -> seeded sampling not reproducible "
          "under concurrency",
          "a seed honoured only for a request alone (batch-level generator)",
          components=_at(_S)),
):
    PATCHES.register(_p.name, _p)

ZOO: tuple[str, ...] = tuple(n for n in PATCHES.names()
                             if not PATCHES.get(n).modifier and not PATCHES.get(n).rare)
"""The bug variants real mode investigates blind (every patch that is a bug on its own and not
``rare``), in registry order."""
RARE: tuple[str, ...] = tuple(n for n in PATCHES.names() if PATCHES.get(n).rare)
"""Bug variants whose failure needs a narrow interleaving (``bench.sim_rare``): in one engine
``hicache_v_after_counter`` (in a PD pair it is not rare: 12 of 37 real bursts flagged), in a
PD pair ``prealloc_parked_after_check``."""


SIMULATED: frozenset[str] = frozenset(n for n in PATCHES.names()
                                      if PATCHES.get(n).sim is SimScope.ENGINE)
"""Patch variants simulation runs in one engine."""
SIMULATED_PD: frozenset[str] = SIMULATED | {n for n in PATCHES.names()
                                            if PATCHES.get(n).sim is SimScope.PD}
"""Patch variants simulation runs in a PD pair (every ``SIMULATED`` one too)."""

OVERLAP = "overlap_schedule"  # the modifier behind the ``overlap`` mode and ``--overlap``
BF16_INDEX_K = "bf16_index_k"  # the seed's widening patch (its mode has its name)
SEED_RACE: tuple[str, ...] = (BF16_INDEX_K, "hicache_index_k_no_wait")
"""The seed's corruption: the index-K load race, widened by the bf16 patch."""
SEED_STORY: tuple[str, ...] = (*SEED_RACE, "late_write_after_abort",
                               "abort_orphan_transfer_entry")
"""The production story's patches in the order they landed: the race, then the wedge's two."""
