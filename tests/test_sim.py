"""Deterministic simulation (issue 16): the scheduler's own guarantees on toy threads, and the
engine with its HiCache loader under it: a failing seed replays bit for bit, the fixed code
passes, and the result is a real load's ``LoadResult``."""

from __future__ import annotations

import queue

import pytest

from engine.sim import SimDeadlock, SimRuntime
from workbench import sim
from workbench.concurrency import SCHEMA

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
