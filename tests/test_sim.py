"""Deterministic simulation (issue 16): the scheduler's own guarantees on toy threads, and the
engine with its HiCache loader under it: a failing seed replays bit for bit, the fixed code
passes, and the result is a real load's ``LoadResult``."""

from __future__ import annotations

import queue

import pytest

from engine.sim import SimDeadlock, SimRuntime
from workbench import sim
from workbench.drive.concurrency import SCHEMA

RACE = ("bf16_index_k", "hicache_index_k_no_wait")


def _toy(seed: int, strategy: str = "random") -> tuple[list, list]:
    rt = SimRuntime(seed, strategy)
    out: list = []
    done: queue.Queue = queue.Queue()

    def worker(n: int):
        def body() -> None:
            for i in range(4):
                rt.point(f"w{n}.{i}")
                out.append((n, i))
                rt.sleep(0.001 * (n + 1))
            done.put(n)
        return body

    def main() -> None:
        for n in range(3):
            rt.start_thread(worker(n), f"w{n}")
        out.append(("joined", tuple(rt.get(done) for _ in range(3))))
    rt.run(main, wall_timeout_s=30)
    return out, [(d.thread, d.label, d.now) for d in rt.trace]


@pytest.mark.parametrize("strategy", ["random", "pct"])
def test_a_seed_fixes_the_interleaving(strategy):
    runs = [_toy(s, strategy) for s in (1, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({repr(r) for r in runs[1:]}) > 1  # other seeds interleave otherwise
    out, trace = runs[0]
    assert sorted(x for x in out if x[0] != "joined") == [(n, i) for n in range(3)
                                                         for i in range(4)]
    assert trace[-1][2] >= 0.012  # virtual time advanced past the slowest worker's sleeps


def test_a_deadlock_is_reported_not_hung():
    rt = SimRuntime(0)
    with pytest.raises(SimDeadlock):
        rt.run(lambda: rt.get(queue.Queue()), wall_timeout_s=30)
    with pytest.raises(ValueError, match="valid"):
        SimRuntime(0, "bfs")


@pytest.mark.slow
def test_the_race_fails_in_sim_and_its_seed_replays_bit_for_bit():
    w = sim.Workload(sessions=3)
    fixed = sim.explore((), seeds=range(2), workload=w, progress=False)
    assert not fixed.failures and all(r.result.summary.requests == 12 for r in fixed.runs)
    found = sim.explore(RACE, seeds=range(5), workload=w, progress=False).first_failure
    assert found is not None and found.result.summary.ref_mismatch > 0
    again = sim.replay(found)
    assert again.tokens == found.tokens and again.trace == found.trace
    assert set(SCHEMA) <= set(found.result.requests.columns)  # a real load's LoadResult
    assert found.forward_s <= found.wall_s


@pytest.mark.slow
def test_shrink_finds_a_smaller_failing_run_that_replays():
    found = sim.explore(RACE, seeds=range(8), workload=sim.Workload(sessions=3),
                        progress=False).first_failure
    assert found is not None
    small = sim.shrink(found, tries=3, max_schedules=30)
    a, b = found.workload, small.smallest.workload
    assert small.smallest.flagged
    assert (b.sessions, b.turns, b.max_tokens) <= (a.sessions, a.turns, a.max_tokens)
    assert b.sessions * b.turns * b.max_tokens < a.sessions * a.turns * a.max_tokens
    assert len(small.smallest.trace) < len(found.trace), small.describe()
    assert len(small.history) == len(small.steps) <= 30 and small.history["failed"].any()
    sim.replay(small.smallest)
    with pytest.raises(ValueError, match="failing"):
        sim.shrink(sim.run((), 0, sim.Workload(sessions=1, turns=1, max_tokens=4)))


@pytest.mark.slow
def test_simulated_trials_bisect_and_ddmin_name_the_race(tmp_path):
    from workbench.investigate.series import DEFAULT_SERIES, bisect_patch_series
    from workbench.search import ddmin

    w = sim.Workload(sessions=2)
    res = bisect_patch_series(DEFAULT_SERIES, store=tmp_path / "b.sqlite", confidence=0.9,
                              max_trials=30, sim=w)
    assert res.culprit == "+bf16_index_k+hicache_index_k_no_wait" and res.converged, res.history
    again = bisect_patch_series(DEFAULT_SERIES, confidence=0.9, max_trials=30, sim=w)
    assert again.history.equals(res.history)  # a simulated bisection replays from its seed
    got = ddmin(["bf16_index_k", "index_k_not_backed_up"], sim.trial(w), repeats=4, budget=40)
    assert got.minimal == ("index_k_not_backed_up",) and got.complete
    with pytest.raises(ValueError, match="late_write_after_abort.*simulated patch variants"):
        sim.run(("late_write_after_abort",), 0, w)


@pytest.mark.slow
def test_pct_finds_the_rare_interleaving_and_the_fixed_loader_never_fails():
    from engine.patches import RARE, ZOO

    assert "hicache_v_after_counter" in RARE and not set(RARE) & set(ZOO)
    w = sim.Workload(sessions=2)
    found = sim.explore(["hicache_v_after_counter"], seeds=range(40), workload=w, strategy="pct",
                        progress=False).first_failure
    assert found is not None and found.result.summary.ref_mismatch > 0
    assert any(d.label.startswith("loader.published") for d in found.trace)
    sim.replay(found)
    fixed = sim.explore((), seeds=range(found.seed + 1), workload=w, strategy="pct",
                        stop_on_failure=False, progress=False)
    assert not fixed.failures
