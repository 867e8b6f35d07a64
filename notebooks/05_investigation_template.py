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
# # 05 — Investigation of an unknown bug
#
# `wb investigate` executes this notebook. It is never told which bug it looks for: it sweeps a
# small seeded grid of load and fault shapes (`workbench.drive.SHAPES`: the production setting, slow
# transfers with reordered aux rows, slow HiCache load-back, client kills, paused peers) on the
# code in `source` and stops at the first anomaly — a response the independent oracle flags, a
# request that failed without being killed, anything left after the pair drained, or a room
# whose buffers differ from the reference (the buffer-level oracle judges unflagged rooms too).
# After the shapes it turns on the engine's modes one at a time (overlap scheduling, prompts ending
# on chunk and page boundaries, bf16 index-K, small chunks, HiCache off, larger pages), then in
# pairs; the coverage table says which cells ran and how much each judged.
# It then localizes the first flagged rooms (prefill, transfer, decode; layer; position),
# names the stage from the evidence, and with `commits="good..bad"` bisects that range.
# Findings are computed from the run; a clean run states its power instead of certifying.

# %% tags=["parameters"]
investigation_file = None  # a result `wb investigate --report` saved: rendered, not rerun
spec = {}  # fields of investigate.InvestigationSpec (source, patches, shapes, commits, ...)
findings_ledger = "runs/findings.jsonl"

# %%
import polars as pl

from workbench import investigate
from workbench.judge import record_drafts
from workbench.report import plots

pl.Config.set_tbl_cols(24)
pl.Config.set_fmt_str_lengths(120)
if investigation_file:
    inv = investigate.Investigation.load(investigation_file)
else:
    inv = investigate.investigate(investigate.InvestigationSpec(**spec))
print(inv.outcome.value, inv.error)
print(inv.spec)
rates = inv.summary()  # empty when the engine did not start
rates.select("shape", "bursts", "requests", "flagged", "mismatched", "leaked", "aborted",
             "errors", "stale_reads", "stale_kv_reads", "late_writes", "failed_rooms",
             "undrained_bursts", "judged_rooms", "buffer_flags") if len(rates) else rates

# %%
plots.plot_rates(rates, label="shape") if len(rates) else None

# %% [markdown]
# ## Coverage
# One row per cell of the sweep's design (a shape, possibly in engine modes): what ran, how many
# responses and rooms it judged, and what was not run. Then what the oracle can resolve.

# %%
print(inv.resolution.describe())
inv.coverage()

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
# The claims the measurements support, computed by the library (`Investigation.findings`):
# a culprit only from a converged bisection, a clean run only with its power. An outcome that
# is not a bug (the engine did not start, nothing found, not localized) is recorded as such.

# %%
print(inv.report())
for f in record_drafts(inv.findings(), replay=inv.replay(), tree=inv.tree,
                       source="05_investigation_template", ledger=findings_ledger):
    print(f)

# %%
if inv.bisection is not None:
    plots.plot_posterior(inv.bisection)
