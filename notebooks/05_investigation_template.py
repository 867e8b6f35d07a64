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
# # 05 — Investigation template
#
# Copy this notebook for a new bug. Cells: launch a PD pair with the variants under suspicion,
# inject concurrency with the oracle, dump and diff the buffers of a request, record findings
# with `record_finding`: named checks that fail the cell (and the re-run) when they no longer
# hold, kept with their evidence and replay seeds in a ledger (`wb findings` lists it).

# %% tags=["parameters"]
patches = []
engine = {"debug_capture": 16}
faults = {"seed": 0}
workload = "smoke"  # a shipped load shape (`list_workloads()`), or a path to a workload file
load_overrides = {"seed": 0}
findings_ledger = "runs/findings.jsonl"

# %%
import polars as pl

from workbench import (
    diff_against_reference,
    dump_buffers,
    launch_pd_pair,
    list_workloads,
    plots,
    record_finding,
    run_workload,
)

pair = launch_pd_pair(patches=patches, engine=engine, faults=faults)
pair.debug("/debug/patches")

# %%
list_workloads()

# %%
res = run_workload(pair, workload, **load_overrides)
res.summary

# %%
res.requests.select(["session", "turn", "kind", "room", "ttft_s", "e2e_s", "finish_reason",
                     "v_leaked", "v_ref_match"])

# %%
plots.plot_latency(res.requests);

# %% [markdown]
# Dump a flagged room when there is one; otherwise the completed room with the longest prompt
# (later turns carry more context, so they cross the most prefill chunk boundaries).

# %%
judged = res.requests.filter(pl.col("v_leaked").is_not_null() & pl.col("room").is_not_null())
flagged = judged.filter(pl.col("flagged"))
pick = flagged if flagged.height else judged.with_columns(
    pl.col("messages").str.len_chars().alias("prompt_chars")).sort("prompt_chars",
                                                                   descending=True)
room = pick["room"][0]
print(f"dumping room {room} ({'flagged' if flagged.height else 'longest prompt, not flagged'})")
dump = dump_buffers(pair, room=room, what=("kv", "index_k"))
diff = diff_against_reference(dump, pair.spec.engine_config())
diff.summary

# %%
plots.plot_layer_errors(diff);

# %% [markdown]
# ## Finding: what this run can and cannot rule out
# A clean run is not a proof: it bounds the per-request flag rate. The finding states how many
# responses were judged, the 95% Wilson upper bound on the rate it leaves possible, and what the
# dump covered.

# %%
n, hi = res.summary.completed, res.summary.flag_rate_ci[1]
if not patches:
    print(record_finding(
        f"default variants: no corruption in {n} judged responses (flag rate below {hi:.0%} at "
        f"95%); room {room}'s {len(dump.tokens)}-token buffers equal the reference",
        {"no reference mismatch": res.summary.ref_mismatch == 0,
         "no bad layer in the dump": diff.first_bad_layer is None},
        evidence={"requests": res.summary.requests, "judged": n, "flag_rate_upper_95": hi,
                  "room": room, "dumped_tokens": len(dump.tokens)},
        replay={"patches": patches, "faults": faults, "workload": workload, **load_overrides},
        source="05_investigation_template", ledger=findings_ledger))
pair.close()
