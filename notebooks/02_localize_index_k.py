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
# # 02 — Localize: dump index-K at the failing request and diff it against the reference
#
# Notebook 01 showed the corruption appears only with the suspect variants. Here we catch one
# flagged request, pull the buffers the oracle captured for it on **both** servers, and
# recompute every buffer on the no-cache reference path. The question: which buffer goes
# wrong first — the stored KV, the stored index-K, or index-K *as the indexer read it* — at
# which layer and which token positions?

# %% tags=["parameters"]
patches = ["hicache_index_k_no_wait", "bf16_index_k"]
sessions = 6
turns = 2
max_tokens = 120
seed = 0
max_bursts = 6
findings_ledger = "runs/findings.jsonl"

# %%
import polars as pl

from workbench import (
    ReferenceBuffers,
    diff_against_reference,
    investigate,
    load_dump,
    plots,
    record_finding,
    reproduce,
)

pl.Config.set_tbl_rows(40)
rep = reproduce(patches, shape="hicache_race", sessions=sessions, turns=turns, max_tokens=max_tokens, seed=seed,
                max_bursts=max_bursts, capture_dir="runs/02-captures")
bad = investigate.flagged_requests(rep)
bad

# %%
room = bad["room"][0]
prefill = load_dump(rep.capture_of(room, "prefill"))
decode = load_dump(rep.capture_of(room, "decode"))
ref = ReferenceBuffers(rep.engine_config())
print(f"room {room}: {len(prefill.tokens)} tokens, {prefill.num_cached} of them loaded back "
      f"from the HiCache host tier")

# %% [markdown]
# ## Prefill side: stored buffers vs what the indexer read

# %%
d_pre = diff_against_reference(prefill, ref)
d_pre.summary

# %%
plots.plot_diff_heatmap(d_pre, "index_k_read_f32");

# %%
plots.plot_diff_heatmap(d_pre, "k");

# %%
plots.plot_layer_errors(d_pre);

# %% [markdown]
# ## Decode side: what arrived over NIXL

# %%
d_dec = diff_against_reference(decode, ref)
d_dec.summary

# %% [markdown]
# ## Finding 1: the first bad buffer is index-K *as read*, first layer, loaded prefix
# Stored K, V and index-K of the first bad layer equal the reference; only the indexer's view
# of the pages still being loaded from host memory differs, and only inside the loaded prefix.

# %%
s = d_pre.summary
first = s.filter(pl.col("layer") == d_pre.first_bad_layer)
bad_first = set(first.filter(pl.col("bad_positions") > 0)["buffer"])
stale = d_pre.errors(d_pre.first_bad_layer, "index_k_read_f32")
stale_pos = (stale > 0).nonzero().flatten()
replay = {"patches": patches, "seeds": rep.seeds, "room": room, "sessions": sessions,
          "turns": turns, "max_tokens": max_tokens}
print(record_finding(
    "the first bad buffer is index-K as read, first bad layer, inside the loaded prefix",
    {"only index-K-as-read is bad in the first bad layer": bad_first == {"index_k_read_f32"},
     "some positions are stale": len(stale_pos) > 0,
     "all stale positions are in the loaded prefix":
         len(stale_pos) > 0 and int(stale_pos.max()) < prefill.num_cached},
    evidence={"first_bad_layer": d_pre.first_bad_layer, "bad_buffers": sorted(bad_first),
              "stale_positions": len(stale_pos), "num_cached": prefill.num_cached},
    replay=replay, source="02_localize_index_k", ledger=findings_ledger))
print(f"layer {d_pre.first_bad_layer}: index-K read stale at {len(stale_pos)} positions in "
      f"[{int(stale_pos.min())}, {int(stale_pos.max())}], all inside the "
      f"{prefill.num_cached}-token loaded prefix")

# %% [markdown]
# ## Finding 2: stored K/V is wrong only downstream, and the transfer copied it exactly
# Stored K/V differ only in layers after the first bad one (their inputs went through
# attention over wrongly selected positions); the decode holds bit-for-bit the K and V the
# prefill stored for the prompt.

# %%
stored = s.filter(pl.col("buffer") != "index_k_read_f32", pl.col("bad_positions") > 0)
T = len(prefill.tokens)
kv_same = {k: bool((decode.tensors[k][:T] == v).all()) for k, v in prefill.tensors.items()
           if k.endswith((".k", ".v"))}
print(record_finding(
    "stored K/V is wrong only downstream, and the transfer copied it exactly",
    {"stored buffers are wrong somewhere": stored.height > 0,
     "only in layers after the first bad one":
         stored.height > 0 and stored["layer"].min() > d_pre.first_bad_layer,
     "decode K/V == prefill K/V, bit for bit": bool(kv_same) and all(kv_same.values())},
    evidence={"wrong_stored": stored.select("layer", "buffer", "bad_positions"),
              "kv_layers_compared": len(kv_same)},
    replay=replay, source="02_localize_index_k", ledger=findings_ledger))

# %% [markdown]
# Did the decode also get stale index-K? Inside the loaded prefix, before the first position
# whose K/V is wrong, index-K must equal the reference unless the KV sender (trusting the
# per-layer counter, which does not cover index-K) shipped pages whose index-K had not landed;
# the decode's indexer then reads them stale at every step.

# %%
kv_rows = stored.filter(pl.col("buffer").is_in(["k", "v"]))
clean_end = min(prefill.num_cached, int(kv_rows["first_bad_position"].min()))
shipped_stale = {}
for layer in range(decode.num_layers):
    err = d_dec.errors(layer, "index_k_f32")[:clean_end]
    if int((err > 0).sum()):
        shipped_stale[f"layer{layer}"] = int((err > 0).sum())
print(f"decode index-K differing from the reference in the clean prefix [0, {clean_end}):",
      shipped_stale or "none for this room")

# %% [markdown]
# Where did the corrupted stored K/V come from? If its first bad position lies *inside* the
# loaded prefix, an earlier request of the same session raced, its corrupted K/V was cached in
# the radix tree, offloaded to host and loaded back here: the race poisons the prefix cache.

# %%
first_kv = int(kv_rows["first_bad_position"].min())
origin = ("an earlier raced request, via the prefix cache" if first_kv < prefill.num_cached
          else "this request's own raced prefill step")
print(f"stored K/V first wrong at position {first_kv} "
      f"(loaded prefix ends at {prefill.num_cached}): written by {origin}")
ik_rows = stored.filter(pl.col("buffer") == "index_k_f32")
print("stored index-K wrong (layer: first position, count):",
      {r["layer"]: (r["first_bad_position"], r["bad_positions"])
       for r in ik_rows.iter_rows(named=True)})
