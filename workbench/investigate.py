"""Investigation steps the notebooks call: reproduce (``workbench.reproduce``) in seeded bursts
or a sweep of shapes, compare rates, read flagged requests, localize a room, probe a wedge;
``run`` is the whole investigation of an unknown bug (``workbench.investigation``).

``RACE_ENGINE``/``RACE_FAULTS``/``BUGGY`` are the seed investigation's settings (the index-K
race); nothing uses them unless a caller passes them.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import polars as pl

from engine.training.datagen import make_transcript
from workbench.bursts import Burst, Reproduction, StopOn
from workbench.concurrency import run_sync
from workbench.evidence import Drain, collect, settle
from workbench.investigation import Diagnosis, Investigation, diagnose
from workbench.investigation import investigate as run
from workbench.launch import PDPair
from workbench.localize import Localization, localize
from workbench.queues import QueueSampler
from workbench.reproduce import Sweep, rates_table, reproduce, sweep
from workbench.series import RACE_ENGINE as SERIES_ENGINE
from workbench.series import RACE_FAULTS as SERIES_FAULTS
from workbench.shapes import SHAPES, SWEEP_ORDER, Shape
from workbench.symptoms import symptoms

log = logging.getLogger(__name__)
__all__ = ["BUGGY", "RACE_ENGINE", "RACE_FAULTS", "SHAPES", "SWEEP_ORDER", "Burst", "Diagnosis",
           "Drain", "Investigation", "Localization", "QueueSampler", "Reproduction", "Shape",
           "StopOn", "Sweep", "diagnose", "first_flags", "flagged_requests", "kill_storm",
           "localize", "race_counts", "rates_table", "reproduce", "run", "settle", "sweep",
           "symptoms", "wedge_probe"]

RACE_ENGINE = {**SERIES_ENGINE, "debug_capture": 64}
RACE_FAULTS = SERIES_FAULTS
BUGGY = ("hicache_index_k_no_wait", "bf16_index_k")


def race_counts(pair: PDPair) -> dict[str, int]:
    """HiCache layer accesses that raced their load, summed over the servers: index-K reads
    (``stale_reads``) and sends (``stale_sends``), K/V reads and sends (``stale_kv_*``)."""
    return dict(collect(pair).stale)


def flagged_requests(rep: Reproduction) -> pl.DataFrame:
    """The flagged rows, with what the oracle saw (content, first differing token, verdicts)."""
    cols = ["seed", "session", "turn", "kind", "room", "finish_reason", "content",
            "v_first_diff", "v_leaked", "v_dropped", "v_well_formed", "v_ref_match",
            "v_aborted", "v_oracle_error"]
    return rep.requests.filter(pl.col("flagged")).select(cols)


def first_flags(rep: Reproduction) -> pl.DataFrame:
    """The first flagged request of every session (in turn order, the call before the answer).

    A session goes on after a corrupted answer, so later turns carry that corruption in their
    prompt: the reference, run on the same prompt, reproduces it. Only a session's first flag
    has a clean history, so only there must a leak also be a reference mismatch.
    """
    flagged = rep.requests.filter(pl.col("flagged"))
    if not len(flagged):
        return flagged
    step = pl.when(pl.col("kind") == "call").then(0).otherwise(1).alias("_step")
    return (flagged.with_columns(step).sort(["seed", "session", "turn", "_step"])
            .group_by(["seed", "session"], maintain_order=True).first().drop("_step"))


def wedge_probe(pair: PDPair, timeout_s: float = 15.0, seed: int = 0) -> bool:
    """True when a fresh 4-token request completes through the router within ``timeout_s``."""
    tr = make_transcript(900_000 + seed)
    body = {"messages": tr.messages(upto_round=0), "tools": [t.to_openai() for t in tr.tools],
            "max_tokens": 4, **({"model": pair.model} if pair.model else {})}
    try:
        r = httpx.post(pair.url + "/v1/chat/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError:  # timed out, or the router is gone: not served either way
        return False
    return r.status_code == 200


async def _kill_storm(url: str, n: int, kill_at_s: float, seed: int, max_tokens: int,
                      model: str | None) -> int:
    tr = make_transcript(800_000 + seed)
    body = {"messages": tr.messages(upto_round=0), "tools": [t.to_openai() for t in tr.tools],
            "max_tokens": max_tokens, "stream": True, **({"model": model} if model else {})}
    killed = 0
    async with httpx.AsyncClient(timeout=60) as client:
        async def one(i: int) -> None:
            nonlocal killed
            try:
                await asyncio.wait_for(client.post(url + "/v1/chat/completions", json=body),
                                       kill_at_s + 0.05 * i)
            except asyncio.TimeoutError:
                killed += 1
            except httpx.HTTPError:  # refused or broken: nothing to disconnect
                pass
        await asyncio.gather(*(one(i) for i in range(n)))
    return killed


def kill_storm(pair: PDPair, n: int = 5, kill_at_s: float = 0.8, seed: int = 0,
               max_tokens: int = 8) -> int:
    """Sends ``n`` streaming requests and disconnects each at ``kill_at_s + 0.05*i`` seconds.

    Sized for a pair whose transfers are slowed (``transfer_fixed_ms``) so that the kills land
    while the decode waits for KV. Returns how many clients were killed before completion.
    """
    return run_sync(_kill_storm(pair.url, n, kill_at_s, seed, max_tokens, pair.model))
