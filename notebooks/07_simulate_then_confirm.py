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
# # 07 — Simulate, then confirm on a real pair
#
# Wall-clock races are statistical: a burst may or may not hit the window. Here the engine and
# its HiCache loader run in one process under a seeded scheduler with virtual time
# (`workbench.sim`): every engine step, forward layer and loader copy is a decision drawn from
# the seed. We explore seeds until a schedule fails, replay that seed to show it fails the same
# way every time (same tokens, same decisions), check the fixed code over as many schedules,
# and confirm the bug on a real PD pair, which stays the ground truth.

# %% tags=["parameters"]
patches = ["hicache_index_k_no_wait", "bf16_index_k"]
seeds = 20
fixed_seeds = 10
sessions = 6
replays = 3
shrink_schedules = 10  # schedules shrink_schedule may try on the failing one
strategy = "random"
confirm_shape = "hicache_race"
max_bursts = 6
pd_bug = "late_write_after_abort"
pd_shape = "kills"
pd_sessions = 3
pd_seeds = 3
findings_ledger = "runs/findings.jsonl"

# %%
import polars as pl

from workbench import sim
from workbench.investigate import reproduce
from workbench.judge import record_drafts
from workbench.report import plot_schedule_timeline, schedule_timeline, schedule_view
from workbench.studies import confirm

workload = sim.Workload(sessions=sessions)
explored = sim.explore(patches, seeds=range(seeds), workload=workload, strategy=strategy,
                       progress=False)
found = explored.first_failure
pl.DataFrame([{"seed": r.seed, "flagged": r.flagged, "requests": r.result.summary.requests,
               "decisions": len(r.trace), "wall_s": r.wall_s, "fingerprint": r.fingerprint}
              for r in explored.runs])

# %% [markdown]
# The failing schedule as lanes per thread over its decisions; red marks its context switches
# (a thread that could have gone on was preempted). Live, slide the window or jump to a switch.

# %%
schedule_view(schedule_timeline(found))

# %% [markdown]
# Shrinking the schedule keeps the shortest guided prefix that still fails and drops every
# preemption the failure does not need: the switches left are the ones it needs (past the
# guide, shaded, no thread is preempted). None left means the scheduler's default order fails
# too: the race needs no forced context switch.

# %%
shrunk = sim.shrink_schedule(found, max_schedules=shrink_schedules)
print(shrunk.describe())
print(f"context switches the failure needs: {len(shrunk.smallest.preemptions)} of the "
      f"{len(found.preemptions)} in the failing schedule")
plot_schedule_timeline(schedule_timeline(shrunk.smallest))

# %% [markdown]
# ## Finding 1: the failing schedule replays exactly
# A seed is an interleaving: replaying it gives the same decisions and the same tokens, so the
# failure is no longer a matter of luck, and the fixed code passes the same schedules.

# %%
again = [sim.replay(found) for _ in range(replays)]
fixed = sim.explore([], seeds=range(fixed_seeds), workload=workload, strategy=strategy,
                    stop_on_failure=False, progress=False)
flagged = found.result.requests.filter(pl.col("flagged"))
replay = {"patches": patches, "seed": found.seed, "strategy": strategy, "sessions": sessions}
for finding in record_drafts(confirm.replay_findings(found, again, fixed), replay=replay,
                             source="07_simulate_then_confirm", ledger=findings_ledger):
    print(finding)
flagged.select(["session", "turn", "kind", "v_first_diff", "v_leaked"])

# %% [markdown]
# ## Finding 2: a real PD pair confirms it
# The same patches on a launched prefill/decode pair over real NIXL, under the HiCache race
# shape, flag responses too; the fixed pair does not.

# %%
real = reproduce(patches, variant="buggy", shape=confirm_shape, max_bursts=max_bursts)
for finding in record_drafts(confirm.real_pair_findings(real),
                             replay={**replay, "shape": confirm_shape},
                             source="07_simulate_then_confirm", ledger=findings_ledger):
    print(finding)
print(f"confirmed: {real.flagged} flagged on the real pair vs seed {found.seed} in sim")

# %% [markdown]
# ## Finding 3: a transfer-layer bug in a simulated PD pair
# The PD pair simulates too: the real prefill and decode engines, with the transfer layer
# (one-sided WRITEs landing at seeded points, the tag after its data), the bootstrap and the
# client kills as decisions. The kill shape of real mode finds the late write after an abort;
# the seed replays it, the fixed code passes the same schedule, and a real pair confirms it.

# %%
pd_workload = sim.Workload.of_shape(pd_shape, sessions=pd_sessions)
pd_found = sim.explore([pd_bug], seeds=range(pd_seeds), workload=pd_workload,
                       progress=False).first_failure
pd_fixed = sim.run([], pd_found.seed, pd_workload)
pd_real = reproduce([pd_bug], variant="buggy", shape=pd_shape, max_bursts=max_bursts)
pd_replay = {"patches": [pd_bug], "seed": pd_found.seed, "shape": pd_shape,
             "sessions": pd_sessions}
for finding in record_drafts(
        confirm.late_write_findings(pd_found, sim.replay(pd_found), pd_fixed, pd_real),
        replay=pd_replay, source="07_simulate_then_confirm", ledger=findings_ledger):
    print(finding)
print(f"PD sim: seed {pd_found.seed} {pd_found.evidence}; real pair: "
      f"{int(pd_real.bursts['late_writes'].sum())} late writes")
