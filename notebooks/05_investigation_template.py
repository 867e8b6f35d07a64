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
# # 05 — Investigation of an unknown bug
#
# `wb investigate` executes this notebook. It is never told which bug it looks for: it sweeps a
# small seeded grid of load and fault shapes (`workbench.drive.SHAPES`: the production setting, slow
# transfers with reordered aux rows, slow HiCache load-back, client kills, paused peers) on the
# code in `source` and stops at the first anomaly — a response the independent oracle flags, a
# request that failed without being killed, anything left after the pair drained, or a room
# whose buffers differ from the reference (the buffer-level oracle judges unflagged rooms too).
# It then localizes the first flagged rooms (prefill, transfer, decode; layer; position),
# names the stage from the evidence, and with `commits="good..bad"` bisects that range.
# Findings are computed from the run; a clean run states its power instead of certifying.

# %% tags=["parameters"]
source = None  # a checkout to investigate (default: this one)
patches = []  # patch variants to enable (a zoo bug, to rehearse)
seed = 0
cap_s = None  # bound on the sweep, seconds
shapes = None  # default: every shape of workbench.drive.SWEEP_ORDER
commits = None  # "good..bad" in source's repository, to bisect after a hit
out_dir = "runs/investigate"
findings_ledger = "runs/findings.jsonl"

# %%
import polars as pl

from workbench import investigate, record_finding
from workbench.report import plots

pl.Config.set_tbl_cols(24)
pl.Config.set_fmt_str_lengths(120)
good_bad = tuple(commits.split("..")) if commits else None
inv = investigate.investigate(source, patches=patches, seed=seed, cap_s=cap_s, shapes=shapes,
                      commits=good_bad, out_dir=out_dir)
rates = inv.summary()
rates.select("shape", "bursts", "requests", "flagged", "mismatched", "leaked", "aborted",
             "errors", "stale_reads", "stale_kv_reads", "late_writes", "failed_rooms",
             "undrained_bursts", "judged_rooms", "buffer_flags")

# %%
plots.plot_rates(rates, label="shape")

# %% [markdown]
# ## Where it arises
# Every divergence of the localized rooms, in causal order (stage, layer, position); the first
# row is the localization. Failure reasons and what stayed after draining follow.

# %%
for loc in inv.localizations:
    print(loc.describe())
pl.concat([loc.frame() for loc in inv.localizations]) if inv.localizations else None

# %%
hit = inv.sweep.hit
print(f"shapes tried: {inv.sweep.tried}; fired: {inv.sweep.fired}; "
      f"first anomaly after {inv.first_flag_s} s")
if hit is not None:
    print("failure reasons:", hit.reasons)
    print("left after draining:", [d.left for d in hit.drains])
print("diagnosis:", inv.diagnosis.describe())

# %% [markdown]
# ## Findings

# %%
if inv.found:
    print(record_finding(
        f"shape '{inv.sweep.fired}' reproduces an anomaly in {inv.first_flag_s:.0f} s; "
        f"it arises in {inv.diagnosis.describe()}",
        {"anomaly reproduced": inv.found, "localized to a stage": inv.diagnosis.stage is not None},
        evidence={"shape": inv.sweep.fired, "diagnosis": inv.diagnosis.describe(),
                  "basis": inv.diagnosis.basis,
                  "divergences": [d.describe() for loc in inv.localizations
                                  for d in loc.divergences[:3]],
                  "reasons": hit.reasons, "left": [d.left for d in hit.drains]},
        replay={"source": source, "patches": patches, "seed": seed, "shape": inv.sweep.fired,
                "seeds": list(hit.seeds)},
        source="05_investigation_template", ledger=findings_ledger))
else:
    print(record_finding(
        f"no anomaly in {inv.judged} judged responses over shapes {list(inv.sweep.tried)} "
        f"(flag rate below {inv.flag_upper_95:.1%} at 95%); {inv.judged_rooms} rooms' buffers "
        "compared with the reference on both sides",
        {"every shape ran": len(inv.sweep.runs) == len(inv.sweep.tried),
         "responses judged": inv.judged > 0},
        evidence={"judged": inv.judged, "flag_rate_upper_95": inv.flag_upper_95,
                  "judged_rooms": inv.judged_rooms, "shapes": list(inv.sweep.tried)},
        replay={"source": source, "patches": patches, "seed": seed},
        source="05_investigation_template", ledger=findings_ledger))

# %%
if inv.bisection is not None:
    b = inv.bisection
    print(record_finding(
        f"commit {b.culprit[:12]} introduced it (posterior {b.confidence:.3f}, "
        f"{b.trials_spent} trials)",
        {"bisection converged": b.converged},
        evidence={"culprit": b.culprit, "posterior": b.confidence, "trials": b.trials_spent},
        replay={"commits": commits, "shape": inv.sweep.fired, "seed": seed},
        source="05_investigation_template", ledger=findings_ledger))
    plots.plot_posterior(b)
