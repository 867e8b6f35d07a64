"""Investigation steps the notebooks call: reproduce a variant in seeded bursts, compare rates.

``reproduce(patches, ...)`` launches a PD pair and runs seeded concurrency bursts (seeds
``seed, seed+1, ...``) until ``stop_after_flags`` requests are flagged or ``max_bursts`` ran; the
fixed variants are then run over the *same* seeds (``seeds=rep.seeds``), so a rate difference is
a difference of code, not of load. ``wedge_probe`` asks whether a pair still serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import polars as pl

from engine.config import EngineConfig
from engine.training.datagen import make_transcript
from workbench.buffers import capture_name
from workbench.concurrency import inject_concurrency, run_sync, wilson
from workbench.launch import LaunchSpec, PDPair, launch_pd_pair
from workbench.load import LoadConfig
from workbench.queues import QueueSampler
from workbench.series import RACE_ENGINE as SERIES_ENGINE
from workbench.series import RACE_FAULTS
from workbench.symptoms import symptoms

log = logging.getLogger(__name__)
__all__ = ["BUGGY", "RACE_ENGINE", "Burst", "QueueSampler", "Reproduction", "StopOn",
           "first_flags", "flagged_requests", "kill_storm", "race_counts", "rates_table",
           "reproduce", "symptoms", "wedge_probe"]

RACE_ENGINE = {**SERIES_ENGINE, "debug_capture": 64}
BUGGY = ("hicache_index_k_no_wait", "bf16_index_k")


class StopOn(enum.Enum):
    """Which count of a burst ends a reproduction."""

    FLAGGED = "flagged"
    LEAKED = "leaked"
    MISMATCHED = "mismatched"
    DROPPED = "dropped"

    def count(self, burst: Burst) -> int:
        return getattr(burst, self.value)


@dataclass(frozen=True)
class Burst:
    """One seeded burst's totals (a row of ``Reproduction.bursts``)."""

    seed: int
    requests: int
    flagged: int
    leaked: int
    mismatched: int
    dropped: int
    stale_reads: int
    stale_sends: int
    t_s: float = 0.0


BURST_COLUMNS = {f.name: (pl.Float64 if f.type == "float" else pl.Int64)
                 for f in dataclasses.fields(Burst)}


@dataclass(frozen=True)
class Reproduction:
    """Bursts run on one variant. ``first_flag_s``: launch start to the first flagged burst's end.

    Invariants: ``bursts`` has one row per seed in ``seeds`` (columns ``seed, requests, flagged,
    leaked, mismatched, dropped, stale_reads, stale_sends, t_s``); ``requests`` concatenates the
    per-request frames of every burst with a ``seed`` column; ``captures`` are dumps of flagged
    rooms (both sides).
    """

    variant: str
    patches: tuple[str, ...]
    seeds: tuple[int, ...]
    bursts: pl.DataFrame
    requests: pl.DataFrame
    captures: tuple[Path, ...]
    launch_s: float
    first_flag_s: float | None
    engine: dict
    faults: dict

    def engine_config(self) -> EngineConfig:
        """The launched engine's configuration (for references and buffer diffs)."""
        return LaunchSpec(self.patches, self.engine, self.faults).engine_config()

    def capture_of(self, room: int, role: str = "prefill") -> Path:
        """The dump captured for a flagged ``room`` on ``role`` (raises KeyError if none)."""
        for path in self.captures:
            if path.name == capture_name(room, role):
                return path
        raise KeyError(f"no {role} capture for room {room}; captured: "
                       f"{sorted(p.name for p in self.captures)}")

    @property
    def flagged(self) -> int:
        return int(self.bursts["flagged"].sum())


def race_counts(pair: PDPair) -> dict[str, int]:
    """HiCache index-K reads (``stale_reads``) and KV sends (``stale_sends``) that raced their
    layer's load, summed over the prefill servers (one ``/debug/hicache`` fetch each)."""
    total = {"stale_reads": 0, "stale_sends": 0}
    for srv in pair.prefill:
        for job in pair.debug("/debug/hicache", srv)["jobs"]:
            for kind in total:
                total[kind] += len(job[kind])
    return total


def _burst(pair: PDPair, seed: int, sessions: int, turns: int, max_tokens: int,
           capture_dir: Path | None,
           duration_s: float) -> tuple[Burst, pl.DataFrame, tuple[Path, ...]]:
    before = race_counts(pair)
    res = inject_concurrency(pair, sessions=sessions, turns=turns, seed=seed,
                             max_tokens=max_tokens, capture_dir=capture_dir, progress=False,
                             duration_s=duration_s)
    s = res.summary
    after = race_counts(pair)
    row = Burst(seed, s.completed, s.flagged, s.leaked, s.ref_mismatch, s.dropped,
                **{k: after[k] - before[k] for k in after})
    log.info("burst seed=%d: %s", seed, row)
    return row, res.requests.with_columns(pl.lit(seed).alias("seed")), res.captures


def reproduce(patches: Sequence[str] = BUGGY, *, variant: str | None = None,
              sessions: int = 6, turns: int = 2, max_tokens: int = 120, seed: int = 0,
              seeds: Sequence[int] | None = None, max_bursts: int | None = 6,
              stop_after_flags: int | None = 1, stop_on: StopOn | str = StopOn.FLAGGED,
              cap_s: float | None = None, engine: dict | None = None,
              faults: dict | None = None, capture_dir: str | Path | None = None,
              log_dir: str | Path | None = None, router: str = "embedded") -> Reproduction:
    """Runs seeded bursts on a fresh PD pair; stops once ``stop_after_flags`` requests are
    ``stop_on`` (a ``StopOn`` or its value: ``"flagged"``, ``"leaked"``, ``"mismatched"`` or
    ``"dropped"``).

    ``seeds`` (when given) fixes the bursts exactly and disables early stopping; the first burst
    seed also seeds the router (room numbers), so a replay by ``seeds`` numbers rooms alike.
    ``router`` names the PD router in front (``workbench.routers.ROUTERS``; SGLang's draws its
    own unseeded rooms). ``cap_s`` bounds the run in seconds from the launch start: no burst
    starts after it, and a running burst starts no turn past it. ``max_bursts=None`` (only with
    ``cap_s``) lets the cap alone end the run.
    """
    try:
        stop_on = StopOn(stop_on)
    except ValueError:
        raise ValueError(f"stop_on must be one of {[s.value for s in StopOn]}, "
                         f"not {stop_on!r}") from None
    if max_bursts is None and cap_s is None and seeds is None:
        raise ValueError("max_bursts=None needs cap_s (or seeds): the run would never end")
    plan = seeds if seeds is not None else (
        itertools.count(seed) if max_bursts is None else range(seed, seed + max_bursts))
    stop = None if seeds is not None else stop_after_flags
    cap = Path(capture_dir) if capture_dir else None
    engine = dict(RACE_ENGINE if engine is None else engine)
    faults = dict(RACE_FAULTS if faults is None else faults)
    t0 = time.monotonic()
    rows, frames, captures, first = [], [], [], None
    router_seed = seeds[0] if seeds else seed
    with launch_pd_pair(patches=patches, engine=engine, faults=faults, seed=router_seed,
                        log_dir=log_dir, router=router) as pair:
        launch_s = time.monotonic() - t0
        for s in plan:
            left = LoadConfig.duration_s if cap_s is None else cap_s - (time.monotonic() - t0)
            if left <= 0:
                break
            row, df, files = _burst(pair, s, sessions, turns, max_tokens, cap, left)
            rows.append(dataclasses.replace(row, t_s=round(time.monotonic() - t0, 2)))
            frames.append(df)
            captures += files
            if first is None and row.flagged:
                first = rows[-1].t_s
            if stop is not None and sum(stop_on.count(r) for r in rows) >= stop:
                break
    name = variant or ("+".join(patches) if patches else "fixed")
    bursts = pl.DataFrame([dataclasses.asdict(r) for r in rows], schema=BURST_COLUMNS)
    requests = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
    return Reproduction(name, tuple(patches), tuple(r.seed for r in rows), bursts, requests,
                        tuple(captures), round(launch_s, 2), first, engine, faults)


def rates_table(reps: Sequence[Reproduction]) -> pl.DataFrame:
    """One row per variant: totals and the flagged fraction with its 95% Wilson interval."""
    rows = []
    for rep in reps:
        b = rep.bursts
        n, k = int(b["requests"].sum()), rep.flagged
        lo, hi = wilson(k, n)
        rows.append({"variant": rep.variant, "bursts": b.height, "requests": n, "flagged": k,
                     "leaked": int(b["leaked"].sum()), "mismatched": int(b["mismatched"].sum()),
                     "dropped": int(b["dropped"].sum()),
                     "stale_reads": int(b["stale_reads"].sum()),
                     "stale_sends": int(b["stale_sends"].sum()), "rate": k / n if n else 0.0,
                     "lo": lo, "hi": hi})
    return pl.DataFrame(rows)


def flagged_requests(rep: Reproduction) -> pl.DataFrame:
    """The flagged rows, with what the oracle saw (content, first differing token, verdicts)."""
    cols = ["seed", "session", "turn", "kind", "room", "finish_reason", "content",
            "v_first_diff", "v_leaked", "v_dropped", "v_well_formed", "v_ref_match",
            "v_oracle_error"]
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
    except httpx.TimeoutException:
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
        await asyncio.gather(*(one(i) for i in range(n)))
    return killed


def kill_storm(pair: PDPair, n: int = 5, kill_at_s: float = 0.8, seed: int = 0,
               max_tokens: int = 8) -> int:
    """Sends ``n`` streaming requests and disconnects each at ``kill_at_s + 0.05*i`` seconds.

    Sized for a pair whose transfers are slowed (``transfer_fixed_ms``) so that the kills land
    while the decode waits for KV. Returns how many clients were killed before completion.
    """
    return run_sync(_kill_storm(pair.url, n, kill_at_s, seed, max_tokens, pair.model))
