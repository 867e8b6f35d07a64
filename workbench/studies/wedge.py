"""Wedge vs corruption (notebook 04): each variant's pair gets the same kill storm while its KV
transfers are slowed, its decode queues sampled, then a fresh request probes whether it still
serves. ``run_wedge(variants, cfg)`` measures; ``findings(run, ...)`` gives the claims the
measurements support (which variant wedges, and that the wedge has its own cause)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import polars as pl

from workbench.deploy import launch_pd_pair
from workbench.drive import kill_storm, wedge_probe
from workbench.investigate import RACE_ENGINE
from workbench.judge import FindingDraft
from workbench.observe import QueueSampler


@dataclass(frozen=True)
class WedgeConfig:
    """``kills`` clients disconnected from ``kill_at_s`` on, transfers slowed by
    ``transfer_fixed_ms`` so the kills land while the decode waits for KV, a transfer queue of
    ``max_transfer_queue`` entries; after ``settle_s`` a fresh request gets ``probe_timeout_s``."""

    kills: int = 5
    kill_at_s: float = 0.8
    transfer_fixed_ms: int = 400
    max_transfer_queue: int = 3
    settle_s: float = 1.0
    probe_timeout_s: float = 20.0
    sample_s: float = 0.2


@dataclass(frozen=True)
class WedgeRun:
    """``summary``: one row per variant (``variant, killed, transfer_entries, orphaned,
    served_after``); ``queues``: the sampled decode queues with a ``variant`` column."""

    config: WedgeConfig
    summary: pl.DataFrame
    queues: pl.DataFrame

    def replay(self, variants: Mapping[str, Sequence[str]]) -> dict:
        return {"variants": {k: list(v) for k, v in variants.items()}, **asdict(self.config)}


def _one(name: str, patches: Sequence[str], cfg: WedgeConfig) -> tuple[dict, pl.DataFrame]:
    with launch_pd_pair(patches=list(patches), engine=RACE_ENGINE,
                        faults={"seed": 1, "transfer_fixed_ms": cfg.transfer_fixed_ms},
                        decode_args=("--max-transfer-queue", str(cfg.max_transfer_queue))) as pair:
        with QueueSampler(pair, interval_s=cfg.sample_s) as sampler:
            killed = kill_storm(pair, cfg.kills, cfg.kill_at_s)
            time.sleep(cfg.settle_s)
            transfer = pair.debug("/debug/queues")["transfer"]
            served = wedge_probe(pair, timeout_s=cfg.probe_timeout_s)
    row = {"variant": name, "killed": killed, "transfer_entries": len(transfer),
           "orphaned": sum(bool(e["orphaned"]) for e in transfer), "served_after": served}
    return row, sampler.frame().with_columns(pl.lit(name).alias("variant"))


def run_wedge(variants: Mapping[str, Sequence[str]], cfg: WedgeConfig = WedgeConfig()) -> WedgeRun:
    """One fresh pair per variant (name -> patches), in order, each torn down before the next."""
    rows, frames = zip(*(_one(name, p, cfg) for name, p in variants.items()), strict=True)
    return WedgeRun(cfg, pl.DataFrame(list(rows)), pl.concat(frames))


def peak_orphans(run: WedgeRun) -> dict[str, int]:
    """The most orphaned transfer entries each variant's sampled queue held."""
    q = run.queues.filter(pl.col("queue") == "transfer").group_by("variant").agg(
        pl.col("orphaned").max())
    return {v: int(n or 0) for v, n in q.iter_rows()}


def findings(run: WedgeRun, wedging: str, others: Sequence[str]) -> list[FindingDraft]:
    """``wedging`` fills its queue with orphans and stops serving while every one of ``others``
    drains and serves; no orphan outside ``wedging`` (its cause is its own)."""
    by = {r["variant"]: r for r in run.summary.iter_rows(named=True)}
    cfg, peak, w = run.config, peak_orphans(run), by[wedging]
    checks = {"every variant got all its kills": all(r["killed"] == cfg.kills for r in by.values()),
              f"{wedging}: queue full of orphans": w["orphaned"] == cfg.max_transfer_queue,
              f"{wedging}: a fresh request hangs": not w["served_after"]}
    for name in others:
        checks[f"{name}: queue drained, still serving"] = (by[name]["transfer_entries"] == 0
                                                           and bool(by[name]["served_after"]))
    cause = {f"{name} leaves no orphan": peak.get(name, 0) == 0 for name in others}
    return [FindingDraft(f"only the {wedging} variant wedges", checks,
                         {"summary": run.summary}),
            FindingDraft(f"the wedge does not share the cause of {', '.join(others)}",
                         {**cause, f"{wedging} leaves orphans": peak.get(wedging, 0) > 0},
                         {"peak_orphans": peak})]
