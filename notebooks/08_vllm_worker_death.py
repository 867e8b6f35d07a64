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
# # 08 — Why does a real vLLM decode worker die on its first NIXL transfer?
#
# A fresh-clone CI run lost notebook 06: the vLLM decode's worker died one second after its
# first NIXL transfer (`Worker proc VllmWorker-0 died unexpectedly`), and on the same host,
# quiet, both pairs of `bench.nixl_progress` lost it too, with exit code -4: **SIGILL**. That
# host was an AMX-capable Intel guest; the README's tables were measured on an AMD EPYC.
#
# The workbench's own tools measure it here:
#
# - **the rate** with its 95% interval, from fresh pairs under notebook 06's load, one
#   `workbench.studies.crash_study` condition at a time (quiet; a busy neighbour core; NIXL's stock
#   busy-polling progress thread); every pair records the host's CPU model and ISA flags, which
#   process died, with which signal (the kernel's own exit record, `workbench.deploy.exits`), after how
#   many NIXL transfers, with how many requests in flight, and its stack;
# - **the ISA path**: what vLLM's CPU attention picks on this host, and whether the process may
#   use AMX tiles at all (Linux grants tile state only on request; a tile instruction without it
#   is SIGILL).
#
# **Cause and mitigation (issue 36).** vLLM's CPU attention picks its AMX kernel from CPUID
# alone (`_get_attn_isa`: bf16 and an AMX CPU), and no vLLM code asks Linux for tile data state
# (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA=18)`). A worker lives only if something
# else in the process (oneDNN) asked first. Measured on an Intel Xeon guest with AMX (issue 36):
# 4/4 pairs lost their decode worker without the request, 0/4 with it. The launcher's site hook
# now asks in every vLLM process where CPUID advertises AMX (`VllmOptions(amx_grant=True)`, the
# default); condition `ungranted` turns it off to study the death. Each pair records each
# worker's permission read inside it (`/collective_rpc`, never requesting), and the cause claim
# below checks prediction against outcome per pair: a check that can fail. A minimal
# reproduction without the workbench is in `docs/vllm.md`.
#
# The measurements of the committed study file are read by default (`pairs = 0`); set `pairs` to
# run that many fresh pairs per condition on this machine instead (about 80 s each).

# %% tags=["parameters"]
outcomes_file = "data/findings/crash_study.jsonl"
pairs = 0
conditions = ["quiet", "ungranted"]
min_pairs = 12
findings_ledger = "runs/findings.jsonl"
log_dir = "runs/08-crash-study"

# %%
from dataclasses import asdict

import polars as pl

from workbench.deploy import isa_probe
from workbench.judge import record_drafts
from workbench.report import plots
from workbench.studies import crash_findings, crash_study

if pairs > 0:
    outcomes_file = crash_study.outcomes_path(log_dir)
    crash_study.run_study(conditions, pairs, outcomes_file, log_dir)
outcomes = crash_study.read_outcomes(outcomes_file)
here = crash_study.host()
print(f"this machine: {here.cpu} ({here.vendor}), ISA flags {here.flags}, {here.cores} cores")
print(f"study: {len(outcomes)} pairs from {outcomes_file}, measured on "
      f"{sorted(set(outcomes['cpu']))}")
if "amx_tile" not in here.flags:
    print(f"{here.cpu} does not advertise AMX: the SIGILL cannot happen here, so this notebook "
          "keeps the committed study and checks only what this host can show")

# %% [markdown]
# ## Death rate per condition

# %%
table = crash_study.rates(outcomes)
print("death rate per condition (95% Wilson interval):")
table

# %%
plots.plot_rates(table, label="condition")

# %% [markdown]
# ## Every pair that lost a process: which, how, when

# %%
outcomes.filter(pl.col("died") | pl.col("hung") | (pl.col("launch_error") != "")).select(
    "condition", "index", "process", "signal", "after_launch_s", "transfers_before",
    "in_flight", "errors", "launch_error", "stack")

# %% [markdown]
# ## The ISA path vLLM takes on this machine

# %%
probe = isa_probe()
bare = isa_probe(grant=False)
pl.DataFrame([{"site hook": "grant (default)", **asdict(probe), "predicts_sigill":
               probe.predicts_sigill},
              {"site hook": "no grant", **asdict(bare), "predicts_sigill": bare.predicts_sigill}])

# %% [markdown]
# ## NIXL transfer times per pair (issue 12's stall, re-measured with the pacing in place)

# %%
outcomes.group_by("condition", maintain_order=True).agg(
    pl.len().alias("pairs"), pl.col("transfers").median().alias("transfers_median"),
    pl.col("xfer_p50_s").median().alias("p50_median_s"),
    pl.col("xfer_p90_s").max().alias("p90_worst_s"), pl.col("errors").sum().alias("errors"))

# %% [markdown]
# ## Findings

# %%
replay = {"notebook": "08_vllm_worker_death", "outcomes": outcomes_file, "pairs": pairs,
          "conditions": conditions}
for finding in record_drafts(crash_findings.findings(outcomes, probe, here, min_pairs), replay=replay,
                             source="08_vllm_worker_death", ledger=findings_ledger):
    print(finding)
