# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
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
import polars as pl

from workbench.judge import record_drafts
from workbench.report import plots
from workbench.studies import wedge

cfg = wedge.WedgeConfig(kills=kills, kill_at_s=kill_at_s, transfer_fixed_ms=transfer_fixed_ms,
                        max_transfer_queue=max_transfer_queue, settle_s=settle_s,
                        probe_timeout_s=probe_timeout_s)
run = wedge.run_wedge(variants, cfg)
queues = run.queues
run.summary

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
only, own_cause = record_drafts(wedge.findings(run, "orphan cleanup", ["fixed", "index-K race"]),
                                replay=run.replay(variants), source="04_wedge_vs_corruption",
                                ledger=findings_ledger)
print(only)

# %% [markdown]
# ## Finding 2: the wedge does not share the index-K cause
# The index-K race corrupts outputs (notebooks 01–02) without leaving a single orphan; the
# wedge needs the abort-cleanup defect. Same transfer layer, two separate defects, so the fix
# for one does not fix the other.

# %%
print(own_cause)
