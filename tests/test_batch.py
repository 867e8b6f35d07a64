"""Parallel bisection: the joint batch chooser vs brute force, and k-probe rounds end to end."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from test_bisect import CANDIDATES, Interrupted, culprit_trial

from bench.bisect_rounds import run_rounds
from workbench.search import Posterior, RatePrior, TrialStore
from workbench.search.batch import JointRound, choose_batch
from workbench.search.bisect import bisect


def brute_force_information(grid, probes: tuple[int, ...]) -> float:
    """I(Y_probes; culprit) by enumerating every outcome vector and grid point."""
    weights = grid.weights
    bad = np.broadcast_to(grid.bad, weights.shape)
    joint = np.zeros((2 ** len(probes), weights.shape[0]))
    for y, outcome in enumerate(itertools.product((0, 1), repeat=len(probes))):
        for k, i in np.ndindex(weights.shape):
            pr = weights[k, i]
            for j, failed in zip(probes, outcome, strict=True):
                p = bad[k, i] if k <= j else (0.0 if grid.good is None else grid.good[k])
                pr *= p if failed else 1.0 - p
            joint[y, k] += pr
    py, pk = joint.sum(axis=1, keepdims=True), joint.sum(axis=0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log2(joint[nz] / (py * pk)[nz])).sum())


def observed(model: Posterior) -> Posterior:
    for j, failed in [(4, True), (2, False), (1, False), (3, True), (0, False)]:
        model.observe(j, failed)
    return model


@pytest.mark.parametrize("model", [
    Posterior(5, RatePrior((0.05, 0.2, 0.6), (0.3, 0.3, 0.4)), None, False),
    Posterior(5, (1.0, 3.0), (1.0, 20.0), True),
    Posterior(5, RatePrior.log_uniform(points=8), None, True),
], ids=["grid", "beta-noisy-good-no-culprit", "log-uniform-no-culprit"])
def test_joint_information_equals_brute_force_enumeration(model):
    model = observed(model)
    post = model.probabilities()
    grid = model.grid(post)
    assert np.allclose(grid.weights.sum(axis=1), post)
    assert np.allclose(JointRound(grid, 1).gains(), model.information(post))  # m = 1: as today
    for probes in [(2, 2), (1, 3, 3), (0, 2, 4, 4)]:
        state = JointRound(grid, len(probes))
        for j in probes:
            state.add(j, float(state.gains()[j]))
        assert math.isclose(state.information, brute_force_information(grid, probes),
                            rel_tol=1e-9, abs_tol=1e-12)


def information_of(grid, probes: tuple[int, ...]) -> float:
    state = JointRound(grid, len(probes))
    for j in probes:
        state.add(j, float(state.gains()[j]))
    return state.information


def test_a_batch_spreads_when_copies_of_the_best_probe_are_redundant():
    model = Posterior(16, RatePrior((0.9,), (1.0,)), None, False)  # nearly deterministic
    post = model.probabilities()
    best = int(np.argmax(model.information(post)))
    design = choose_batch(model.grid(post), np.random.default_rng(0), 3)
    assert len(set(design.probes)) == 3 and best in design.probes
    copies = information_of(model.grid(post), (best,) * 3)
    assert design.information > copies + 0.5  # three cuts beat one cut seen three times
    assert math.isclose(design.information, information_of(model.grid(post), design.probes))


def test_a_rare_failure_batch_repeats_the_best_region():
    """At 1% a trial says little; the best round piles its probes near the middle."""
    model = Posterior(16, RatePrior((0.01,), (1.0,)), None, False)
    design = choose_batch(model.grid(model.probabilities()), np.random.default_rng(0), 8)
    assert all(4 <= j <= 11 for j in design.probes) and len(set(design.probes)) < 8
    with pytest.raises(ValueError, match="at least one probe"):
        choose_batch(model.grid(model.probabilities()), np.random.default_rng(0), 0)


@pytest.mark.parametrize("culprit", [0, 6, 15])
def test_k_probe_rounds_find_the_culprit(culprit):
    one = bisect(CANDIDATES, culprit_trial(culprit, 0.2), confidence=0.97, seed=culprit)
    four = bisect(CANDIDATES, culprit_trial(culprit, 0.2), confidence=0.97, seed=culprit,
                  parallel=4)
    assert one.culprit == four.culprit == CANDIDATES[culprit] and four.converged
    assert one.rounds == one.trials_spent
    assert four.rounds == math.ceil(four.trials_spent / 4) < one.rounds


def test_k8_bisect_resumes_from_the_store_identically(tmp_path):
    full = bisect(CANDIDATES, culprit_trial(11, 0.1), seed=7, parallel=8,
                  store=TrialStore(tmp_path / "full.db"), experiment="exp")
    calls: list = []
    with TrialStore(tmp_path / "resume.db") as store, pytest.raises(Interrupted):
        bisect(CANDIDATES, culprit_trial(11, 0.1, calls, limit=37), seed=7, parallel=8,
               store=store, experiment="exp")
    with TrialStore(tmp_path / "resume.db") as store:
        resumed = bisect(CANDIDATES, culprit_trial(11, 0.1, calls), seed=7, parallel=8,
                         store=store, experiment="exp")
    assert resumed == full and resumed.history.equals(full.history)
    assert full.culprit == CANDIDATES[11] and full.rounds == resumed.rounds
    assert len(calls) == len(set(calls)) == full.trials_spent  # nothing lost or repeated


def test_quick_rounds_bench_never_needs_more_rounds_than_one_probe():
    res = run_rounds(ks=(1, 2, 8), rates=(0.05, 0.2), sizes=(16,), runs=6, confidence=0.97)
    checks = res.checks()
    assert checks["no k > 1 needs more rounds than k=1"]
    assert checks["k=8 rounds <= 0.35x k=1 at 1%, 5%"]
    assert all(res.ratio(c) < 0.5 for c in res.cells.values() if c.k == 8)
    with pytest.raises(ValueError, match="k=1"):
        run_rounds(ks=(2, 4), runs=1)
