# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
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
sessions = 2
turns = 1
seed = 0
max_tokens = 80
findings_ledger = "runs/findings.jsonl"

# %%
from workbench import (
    diff_against_reference,
    dump_buffers,
    inject_concurrency,
    launch_pd_pair,
    record_finding,
)
from workbench.plots import plot_latency, plot_layer_errors

pair = launch_pd_pair(patches=patches, engine=engine, faults=faults)
pair.debug("/debug/patches")

# %%
res = inject_concurrency(pair, sessions=sessions, turns=turns, seed=seed, max_tokens=max_tokens)
res.summary

# %%
res.requests.select(["session", "turn", "kind", "room", "ttft_s", "e2e_s", "finish_reason",
                     "v_leaked", "v_ref_match"])

# %%
plot_latency(res.requests);

# %%
room = res.requests["room"].drop_nulls()[0]
dump = dump_buffers(pair, room=room, what=("kv", "index_k"))
diff = diff_against_reference(dump, pair.spec.engine_config())
diff.summary

# %%
plot_layer_errors(diff);

# %% [markdown]
# ## Finding: with the default variants every buffer equals the reference

# %%
if not patches:
    print(record_finding(
        "with the default variants every buffer equals the reference",
        {"no reference mismatch": res.summary.ref_mismatch == 0,
         "no bad layer in the dump": diff.first_bad_layer is None},
        evidence={"requests": res.summary.requests, "room": room},
        replay={"patches": patches, "faults": faults, "seed": seed, "sessions": sessions},
        source="05_investigation_template", ledger=findings_ledger))
pair.close()
