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
# # 03 — Bisect the patch series to the culprit
#
# The deployment picked up a series of patches one by one. Candidate *i* enables the first *i*
# patches; `base` enables none. A trial launches (or reuses) a PD pair for the candidate, runs a
# short seeded concurrency burst, and fails when any response differs from the single-request
# reference. Failures are intermittent, so plain bisection would lie: this is Bayesian
# change-point search (Beta-Bernoulli failure rate on the bad side, next probe minimising the
# expected posterior entropy), stopping at the chosen confidence. Every trial is appended to a
# SQLite store: re-running this notebook replays it, and a killed run resumes without
# repeating or losing trials. While it runs, the posterior over candidates and the trial
# timeline beside it redraw after every trial; when it ends, the final picture stays.

# %% tags=["parameters"]
series = ["bf16_index_k", "hicache_index_k_no_wait", "late_write_after_abort",
          "abort_orphan_transfer_entry"]
sessions = 4
confidence = 0.9
max_trials = 40
seed = 0
store = "runs/03-bisect.sqlite"
findings_ledger = "runs/findings.jsonl"

# %%
from pathlib import Path

import polars as pl

from workbench import PatchSeries, bisect_patch_series
from workbench.investigate import culprit_findings
from workbench.judge import record_drafts
from workbench.report import live_bisection, plots

Path(store).parent.mkdir(parents=True, exist_ok=True)
print("candidates:", PatchSeries(tuple(series)).labels())
live = live_bisection(PatchSeries(tuple(series)).labels(), confidence)
res = bisect_patch_series(series, store=store, sessions=sessions, confidence=confidence,
                          seed=seed, max_trials=max_trials, log_dir="runs/03-logs",
                          on_trial=live.add)
live.finish(res)
print(res.headline())  # names a culprit only when the bisection converged
print(f"estimated failure rate {res.estimated_fail_rate_bad:.0%} per trial")

# %%
pl.DataFrame({"candidate": list(res.posterior), "posterior": list(res.posterior.values())})

# %%
plots.plot_posterior(res)

# %%
res.history

# %% [markdown]
# What a fixed-repeat bisection would have paid at most: to call a candidate good at the
# estimated failure rate with 5% risk it needs `res.fixed_repeat_bound()` clean trials per probe (a
# bad probe stops at its first failure, so it pays less). Told the true rate, fixed-repeat is
# close to the cheapest any bisection can be; `python -m bench.bisect_sim` measures both methods
# on simulated culprits and prints the information-theoretic floor next to them.

# %%
per_probe, fixed_cost = res.fixed_repeat_bound(min_rate=0.05)
print(f"fixed-repeat: {per_probe} clean trials per good call, at most {fixed_cost} in all; "
      f"Bayesian: {res.trials_spent}")

# %% [markdown]
# ## Finding: the culprit is the patch that drops the index-K wait gate

# %%
claims = culprit_findings(res, series, confidence, expected="hicache_index_k_no_wait")
for finding in record_drafts(
        claims, replay={"series": series, "seed": seed, "sessions": sessions, "store": store},
        source="03_bisect_patch_series", ledger=findings_ledger):
    print(finding)
print(f"culprit patch: {claims[0].evidence['added']}")
