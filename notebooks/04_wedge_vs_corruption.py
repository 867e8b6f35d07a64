# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 — Wedge vs corruption: does the stuck decode queue share the index-K cause?
#
# Second symptom: after clients are killed mid-flight the decode's transfer queue stops
# draining and new requests hang. Hypotheses: (a) it is the same index-K race; (b) it is the
# abort cleanup in the transfer layer. For each variant we slow KV transfers (so kills land
# while the decode waits for KV), kill a storm of clients, sample the queues over time through
# the debug endpoints, then probe whether a fresh request is still served.

# %% tags=["parameters"]
variants = {
    "fixed": [],
    "index-K race": ["hicache_index_k_no_wait", "bf16_index_k"],
    "orphan cleanup": ["abort_orphan_transfer_entry"],
}
kills = 5
kill_at_s = 0.8
transfer_fixed_ms = 400
max_transfer_queue = 3
settle_s = 1.0
probe_timeout_s = 20
findings_ledger = "runs/findings.jsonl"

# %%
import time

import polars as pl

from workbench import investigate, launch_pd_pair, record_finding
from workbench.drive import kill_storm, wedge_probe
from workbench.observe import QueueSampler
from workbench.report import plots

frames, rows = [], []
for name, patches in variants.items():
    with launch_pd_pair(patches=patches, engine=investigate.RACE_ENGINE,
                        faults={"seed": 1, "transfer_fixed_ms": transfer_fixed_ms},
                        decode_args=("--max-transfer-queue", str(max_transfer_queue))) as pair:
        with QueueSampler(pair, interval_s=0.2) as sampler:
            killed = kill_storm(pair, kills, kill_at_s)
            time.sleep(settle_s)
            transfer = pair.debug("/debug/queues")["transfer"]
            served = wedge_probe(pair, timeout_s=probe_timeout_s)
        frames.append(sampler.frame().with_columns(pl.lit(name).alias("variant")))
        rows.append({"variant": name, "killed": killed, "transfer_entries": len(transfer),
                     "orphaned": sum(bool(e["orphaned"]) for e in transfer),
                     "served_after": served})
queues = pl.concat(frames)
summary = pl.DataFrame(rows)
summary

# %%
for name in variants:
    fig = plots.plot_queues(queues.filter(pl.col("variant") == name))
    fig.axes[0].set_title(f"decode queues — {name}")

# %% [markdown]
# ## Finding 1: only the abort-cleanup variant wedges
# Its transfer queue fills with orphaned entries of killed rooms and a fresh request hangs;
# the fixed code and the index-K race variant drain the queue and keep serving after the
# same kills.

# %%
by = {r["variant"]: r for r in summary.iter_rows(named=True)}
wedged = by["orphan cleanup"]
replay = {"variants": variants, "kills": kills, "kill_at_s": kill_at_s,
          "transfer_fixed_ms": transfer_fixed_ms, "max_transfer_queue": max_transfer_queue}
checks = {"every variant got all its kills": all(r["killed"] == kills for r in by.values()),
          "orphan cleanup: queue full of orphans": wedged["orphaned"] == max_transfer_queue,
          "orphan cleanup: a fresh request hangs": not wedged["served_after"]}
for name in ("fixed", "index-K race"):
    checks[f"{name}: queue drained, still serving"] = (by[name]["transfer_entries"] == 0
                                                       and by[name]["served_after"])
print(record_finding("only the abort-cleanup variant wedges", checks,
                     evidence={"summary": summary}, replay=replay,
                     source="04_wedge_vs_corruption", ledger=findings_ledger))

# %% [markdown]
# ## Finding 2: the wedge does not share the index-K cause
# The index-K race corrupts outputs (notebooks 01–02) without leaving a single orphan; the
# wedge needs the abort-cleanup defect. Same transfer layer, two separate defects, so the fix
# for one does not fix the other.

# %%
orphans = queues.filter(pl.col("queue") == "transfer").group_by("variant").agg(
    pl.col("orphaned").max())
peak = dict(orphans.iter_rows())
print(record_finding(
    "the wedge does not share the index-K cause",
    {"index-K race leaves no orphan": peak["index-K race"] == 0,
     "fixed leaves no orphan": peak["fixed"] == 0,
     "orphan cleanup leaves orphans": peak["orphan cleanup"] > 0},
    evidence={"peak_orphans": peak}, replay=replay, source="04_wedge_vs_corruption",
    ledger=findings_ledger))
