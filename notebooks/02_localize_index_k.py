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
# # 02 — Localize: which buffer of a flagged request goes wrong first, and where?
#
# Catch flagged requests, pull the buffers the oracle captured for them on **both** servers,
# recompute every buffer on the no-cache reference path, and order every divergence causally:
# prefill (its own buffers vs the reference), transfer (the decode's copy of the prompt and its
# first token vs the prefill's), decode (positions the decode computed); then layer, then
# position. Nothing here knows which bug it is: the findings state what the localization found.
# The default parameters run the seed's suspect variants under the slow-HiCache shape.

# %% tags=["parameters"]
patches = ["hicache_index_k_no_wait", "bf16_index_k"]
shape = "hicache_race"
sessions = 6
turns = 2
max_tokens = 120
seed = 0
max_bursts = 6
rooms = 3  # flagged rooms to localize
findings_ledger = "runs/findings.jsonl"

# %%
import polars as pl

from workbench import (
    ReferenceBuffers,
    diff_against_reference,
    investigate,
    load_dump,
    plots,
    reproduce,
)
from workbench.judge import record_drafts
from workbench.report import divergence_map, divergence_view

pl.Config.set_tbl_rows(40)
pl.Config.set_fmt_str_lengths(120)
rep = reproduce(patches, shape=shape, sessions=sessions, turns=turns, max_tokens=max_tokens,
                seed=seed, max_bursts=max_bursts, stop_on="flagged",
                capture_dir="runs/02-captures")
bad = investigate.flagged_requests(rep)
bad

# %%
ref = ReferenceBuffers(rep.engine_config())
locs = investigate.localize_flagged(rep, rooms)
for loc in locs:
    print(loc.describe())
loc = locs[0]
loc.frame()

# %% [markdown]
# ## The first divergence, seen as a map
# Every compared buffer of the first localized room, per stage (prefill against the reference,
# the decode's copy against the prefill, decode against the reference), as a layer x position
# map of max |diff|: the prefix reused from the cache shaded (dashed edge), page boundaries as
# ticks, the first divergence circled. Live, pick a cell (from the list of bad cells, or by layer
# and position) to see both sides' values; an exported report shows the map.

# %%
room = loc.room
dmap = divergence_map(rep, room, ref)
print(dmap.describe())
divergence_view(dmap)

# %%
if dmap.first is not None:
    print(dmap.values(dmap.first).describe())
side = load_dump(rep.capture_of(room, "decode" if loc.first and loc.first.stage.name in (
    "TRANSFER", "DECODE") else "prefill"))
d = diff_against_reference(side, ref)

# %%
plots.plot_layer_errors(d)

# %% [markdown]
# ## Finding 1: where the corruption first appears
# Computed from the localization of every localized flagged room; the claim is the first
# divergence itself, and the checks say it is consistent across rooms.

# %%
replay = {"patches": patches, "shape": shape, "seeds": rep.seeds, "rooms": [x.room for x in locs],
          "sessions": sessions, "turns": turns, "max_tokens": max_tokens}
where, copy = investigate.localization_findings(locs)
print(*record_drafts([where], replay=replay, source="02_localize_index_k",
                     ledger=findings_ledger))

# %% [markdown]
# ## Finding 2: what the transfer did with it
# Did the decode receive exactly the prompt's K, V and index-K the prefill held (corruption,
# if any, travelled through an exact copy), or did the transfer itself change them?

# %%
print(*record_drafts([copy], replay=replay, source="02_localize_index_k",
                     ledger=findings_ledger))
later = loc.divergences[1:9]
print("later divergences of room", room, *[x.describe() for x in later], sep="\n  ")
