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
# # 01 — Reproduce the tool-call corruption under concurrency
#
# Production report: under many concurrent agentic sessions, PD-disaggregated serving with
# HiCache leaked raw DSML tool-call markup into `content` instead of structured `tool_calls`.
# Suspects: `hicache_index_k_no_wait` (in layer-wise load-back, index-K is not covered by the
# per-layer done counter that gates K/V) and `bf16_index_k` (doubles the index-K bytes, so each
# load takes longer).
#
# Method: run seeded multi-turn sessions through a real prefill + decode + router (NIXL over
# UCX) with HiCache offloading every finished prefix, so each turn loads its prefix back layer
# by layer. Every response is judged by the oracle (token-identical to the single-request
# reference, DSML well-formed, not leaked). The buggy variants run bursts until the first DSML
# leak; the fixed variants then replay **the same seeds**. The pair monitor shows the buggy pair
# live (queues, rooms, pages, tokens/s, flags) and leaves its figure in the saved notebook.

# %% tags=["parameters"]
buggy_patches = ["hicache_index_k_no_wait", "bf16_index_k"]
sessions = 6
turns = 2
max_tokens = 120
seed = 0
max_bursts = 6
stop_on = "leaked"
stop_after_flags = 1
router = "embedded"  # or "sglang": SGLang's Rust PD router in front of the same servers
findings_ledger = "runs/findings.jsonl"

# %%
import polars as pl

from workbench import Monitor, explore, investigate
from workbench.investigate import reproduce
from workbench.judge import record_drafts
from workbench.report import plots

pl.Config.set_tbl_rows(30)
pl.Config.set_fmt_str_lengths(90)
pair_monitor = Monitor()
buggy = reproduce(buggy_patches, variant="buggy", shape="hicache_race", sessions=sessions,
                  turns=turns, max_tokens=max_tokens, seed=seed, max_bursts=max_bursts,
                  stop_after_flags=stop_after_flags, stop_on=stop_on,
                  capture_dir="runs/01-captures", router=router, watch=pair_monitor)
buggy.bursts

# %% [markdown]
# Same load, fixed code: the default variants replay exactly the buggy run's seeds.

# %%
fixed = reproduce([], variant="fixed", shape="hicache_race", sessions=sessions, turns=turns,
                  max_tokens=max_tokens, seeds=buggy.seeds, router=router)
rates = investigate.rates_table([buggy, fixed])
rates

# %%
plots.plot_rates(rates)

# %%
plots.plot_bursts([buggy, fixed])

# %% [markdown]
# What the oracle flagged: tool-call turns whose DSML block is malformed (a truncated parameter
# tag, an unknown tool) so the detector hands the raw markup to `content`, and answer turns
# that quote back the wrong tool. `v_first_diff` is the first token that differs from the
# reference.

# %%
investigate.flagged_requests(buggy)

# %% [markdown]
# The same requests to look at: filter by verdict, session, shape or finish reason; choose one to
# see the conversation, the response beside the reference (the first differing token
# highlighted, DSML markup verbatim) and the per-token logprob drift; "replay alone" sends that
# exact request to a fresh pair of the same variant, alone, and says whether it still differs.

# %%
explore(buggy)

# %% [markdown]
# ## Finding 1: the buggy variants leak DSML into content; the race really fired
# A leak in a session's first flagged turn is also a reference mismatch: the markup is corrupted
# output, not a parser bug. (Later turns carry the corrupted answer in their prompt, so the
# reference, fed the same prompt, can reproduce their leak: `investigate.first_flags` keeps
# each session's first flag.)
# The prefill's indexer read index-K still loading (`stale_reads`) and its KV sender shipped
# index-K pages still loading to the decode (`stale_sends`).

# %%
b = rates.row(0, named=True)
replay = {"patches": buggy_patches, "seeds": buggy.seeds, "sessions": sessions, "turns": turns,
          "max_tokens": max_tokens, "router": router}
recorded = {"source": "01_reproduce_corruption", "ledger": findings_ledger}
print(*record_drafts(investigate.leak_findings(buggy), replay=replay, **recorded))
print(f"buggy: {b['leaked']} DSML leaks, {b['flagged']}/{b['requests']} flagged "
      f"({b['rate']:.1%}, 95% CI {b['lo']:.1%}-{b['hi']:.1%}); first flag "
      f"{buggy.first_flag_s}s after launch")

# %% [markdown]
# ## Finding 2: over the same seeded load the fixed variants never corrupt, never race

# %%
f = rates.row(1, named=True)
print(*record_drafts(investigate.control_findings(fixed, buggy),
                     replay={**replay, "patches": []}, **recorded))
print(f"fixed: 0/{f['requests']} flagged (95% CI upper bound {f['hi']:.1%})")

# %% [markdown]
# ## Finding 3: under SGLang's fail-closed parser the same corruption is dropped, not leaked
# What users see depends on the tool-call parser. The same buggy variants, served with
# `tool_parser=sglang` (SGLang 0.5.21-0.5.23's `DeepSeekV32Detector`, checked against the real
# code in `tests/test_parser_fidelity.py`), run seeded bursts until a request is flagged. Where
# `strict` hands the broken block to `content`, SGLang keeps only the prose before it: the
# corruption shows as a vanished call (`dropped`) or a wrong answer (reference mismatch), and
# no content ever holds a block opener.

# %%
sgl = reproduce(buggy_patches, variant="buggy, sglang parser", shape="hicache_race",
                sessions=sessions, turns=turns, max_tokens=max_tokens, seed=seed, max_bursts=max_bursts,
                stop_after_flags=stop_after_flags, stop_on="flagged", router=router,
                engine={**investigate.RACE_ENGINE, "tool_parser": "sglang"})
(parsed,) = record_drafts(investigate.parser_findings(sgl, buggy),
                          replay={**replay, "seeds": sgl.seeds,
                                  "engine": {"tool_parser": "sglang"}}, **recorded)
print(parsed)
pl.DataFrame([{"parser": k, **v} for k, v in parsed.evidence["symptoms"].items()])

# %% [markdown]
# ## Finding 4: the parser decides the symptom of the same corrupted tokens
# Which symptom a user reports depends on the parser and on the SGLang release.
# `tool_parser=sglang-leaky` is SGLang 0.5.15's detector (0.5.6-0.5.15 return the whole text,
# markup included, when no call parses); `sglang` is 0.5.21-0.5.23's, which fails closed. Both
# are checked against the real code (`tests/test_parser_fidelity.py`). Here the tokens the
# buggy run actually generated in each session's first flagged turn, where it leaked under
# `strict`, are parsed again under every variant, one-shot and streamed token by token
# (`workbench.judge.symptoms`): no race, no server, the same tokens for every parser. On seed 0 we
# measured: `strict` leaks all of them; a broken call turn becomes a call with empty arguments
# under 0.5.15 and vanishes under 0.5.23; answer turns that start mid-block leak one-shot under
# both releases and vanish from both when streamed.

# %%
print(*record_drafts(investigate.symptom_findings(buggy), replay=replay, **recorded))
investigate.symptom_table(buggy)
