"""Intermittent-failure bisection, flaky ddmin and the resumable trial store."""

from __future__ import annotations

import math
import sqlite3

import numpy as np
import polars as pl
import pytest

from workbench.search import GridRate, Posterior, RatePrior, ddmin
from workbench.search.bisect import (
    DEFAULT_PRIOR_FAIL_RATE,
    BisectResult,
    bisect,
    default_repeats,
    fixed_repeat_bisect,
)
from workbench.search.trials import (
    CachedTrial,
    Counts,
    Trial,
    TrialStore,
    derive_seed,
    run_parallel,
)

CANDIDATES = [f"v{i:02d}" for i in range(16)]


def uniform(seed: int) -> float:
    """A U[0, 1) draw fully determined by a trial seed."""
    return (seed >> 10) / 2.0**53


def culprit_trial(culprit: int, rate: float, calls: list | None = None, limit: int | None = None):
    """Seeded flaky reproduction: candidates at/after ``culprit`` fail with ``rate``."""

    seen = calls if calls is not None else []

    def trial(candidate: str, seed: int) -> bool:
        if limit is not None and len(seen) >= limit:
            raise Interrupted(f"killed after {limit} trials")
        seen.append((candidate, seed))
        return CANDIDATES.index(candidate) >= culprit and uniform(seed) < rate

    return trial


class Interrupted(Exception):
    """Stands in for KeyboardInterrupt / a killed worker in the resume tests."""


def assert_posterior_normalised(result: BisectResult) -> None:
    total = sum(result.posterior.values()) + result.no_culprit_probability
    assert math.isclose(total, 1.0, abs_tol=1e-9)
    assert all(0.0 <= p <= 1.0 for p in result.posterior.values())


@pytest.mark.parametrize(
    ("rate", "culprit"), [(1.0, 0), (1.0, 11), (0.3, 5), (0.3, 15), (0.05, 9), (0.05, 2)]
)
def test_bayesian_bisect_finds_culprit(rate, culprit):
    result = bisect(CANDIDATES, culprit_trial(culprit, rate), seed=culprit)
    assert result.culprit == CANDIDATES[culprit]
    assert result.converged and result.confidence >= 0.95
    assert result.trials_spent == result.history.height
    assert result.history.columns == ["step", "candidate", "failed", "max_posterior", "entropy"]
    assert_posterior_normalised(result)
    assert result.estimated_fail_rate_good == 0.0
    if rate == 1.0:
        assert result.estimated_fail_rate_bad > 0.3  # the prior's grid tops out at 0.5


def test_bisect_respects_max_trials():
    result = bisect(CANDIDATES, culprit_trial(7, 0.01), max_trials=25, seed=1)
    assert result.trials_spent == 25 and not result.converged
    assert_posterior_normalised(result)


def test_no_culprit_and_noisy_good_side():
    clean = bisect(CANDIDATES, lambda c, s: False, allow_no_culprit=True,
                   prior_fail_rate=(2.0, 2.0), seed=0)
    assert clean.culprit is None and clean.no_culprit_probability >= 0.95
    assert_posterior_normalised(clean)

    def noisy(candidate: str, seed: int) -> bool:  # good side fails 1% of the time
        return uniform(seed) < (0.6 if CANDIDATES.index(candidate) >= 6 else 0.01)

    result = bisect(CANDIDATES, noisy, prior_good_fail_rate=(1.0, 50.0), seed=2)
    assert result.culprit == "v06"
    assert 0.0 < result.estimated_fail_rate_good < 0.1
    assert_posterior_normalised(result)


def test_default_repeats():
    assert default_repeats(0.05, 0.05) == 59
    assert default_repeats(0.01, 0.05) == 299
    assert default_repeats(1.0, 0.05) == 1


@pytest.mark.parametrize(("rate", "culprit"), [(1.0, 3), (0.3, 12), (0.05, 6)])
def test_fixed_repeat_finds_culprit(rate, culprit):
    repeats = default_repeats(rate, alpha=0.01)
    result = fixed_repeat_bisect(CANDIDATES, culprit_trial(culprit, rate), repeats=repeats)
    assert result.culprit == CANDIDATES[culprit] and result.method == "fixed-repeat"
    assert result.trials_spent == result.history.height
    assert_posterior_normalised(result)
    probed = result.history.group_by("candidate").agg(n=pl.len(), f=pl.col("failed").any())
    for row in probed.iter_rows(named=True):  # good calls took exactly `repeats` clean trials
        assert row["f"] or row["n"] == repeats


def test_ddmin_finds_minimal_pair_under_flakiness():
    def trial(subset: frozenset[str], seed: int) -> bool:
        return {"a", "c"} <= subset and uniform(seed) < 0.5

    result = ddmin(list("abcdefgh"), trial, assumed_fail_rate=0.5, alpha=0.01, seed=0)
    assert result.minimal == ("a", "c") and result.complete
    assert result.confidence > 0.95
    assert result.trials_spent == result.history["trials"].sum()


def test_ddmin_budget_and_non_failing_input():
    def trial(subset: frozenset[str], seed: int) -> bool:
        return {"e", "g"} <= subset and uniform(seed) < 0.5

    cut = ddmin(list("abcdefgh"), trial, assumed_fail_rate=0.5, budget=10, seed=1)
    assert not cut.complete and cut.trials_spent == 10
    assert {"e", "g"} <= set(cut.minimal) and cut.confidence < 0.5
    with pytest.raises(ValueError):
        ddmin(list("abc"), lambda s, seed: False, repeats=3)


def test_store_dedupes_and_counts(tmp_path):
    with TrialStore(tmp_path / "t.db") as store:
        assert store.record(Trial("e", "v00", 0, True, 0.1, 7))
        assert not store.record(Trial("e", "v00", 0, False, 0.2, 8))  # ignored, not duplicated
        store.record(Trial("e", "v00", 1, False, 0.1, 9))
        store.record(Trial("other", "v01", 0, True, 0.1, 1))
        frame = store.trials("e")
        assert frame.height == 2 and frame["failed"].to_list() == [True, False]
        assert store.counts("e") == {"v00": Counts(1, 2)}
        assert store.trials("missing").height == 0
    mode = sqlite3.connect(tmp_path / "t.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode.lower() == "wal"


def test_cached_trial_replays_then_runs(tmp_path):
    store = TrialStore(tmp_path / "t.db")
    calls: list = []
    first = CachedTrial(store, "e", culprit_trial(0, 0.5, calls))
    outcomes = [first("v03") for _ in range(5)]
    again = CachedTrial(TrialStore(tmp_path / "t.db"), "e", culprit_trial(0, 0.5, calls))
    assert [again("v03") for _ in range(7)][:5] == outcomes
    assert (again.replayed, again.ran, len(calls)) == (5, 2, 7)
    assert calls[0][1] == derive_seed("e", "v03", 0)
    assert again.run_many("v04", 6, workers=3) == CachedTrial(None, "e", culprit_trial(
        0, 0.5)).run_many("v04", 6)
    assert store.counts("e")["v04"].total == 6


def test_run_parallel_keeps_order():
    assert run_parallel(lambda x: x * x, range(20), workers=4) == [x * x for x in range(20)]
    assert run_parallel(lambda x: x + 1, [1, 2], workers=1) == [2, 3]


def test_store_and_plain_runs_agree(tmp_path):
    plain = bisect(CANDIDATES, culprit_trial(4, 0.3), seed=5)
    stored = bisect(CANDIDATES, culprit_trial(4, 0.3), seed=5,
                    store=TrialStore(tmp_path / "t.db"), experiment="x")
    assert plain == stored and plain.history.equals(stored.history)


@pytest.mark.parametrize("method", [bisect, fixed_repeat_bisect])
def test_interrupted_run_resumes_exactly(tmp_path, method):
    culprit, rate, seed = 10, 0.3, 4
    full_calls: list = []
    full_store = TrialStore(tmp_path / "full.db")
    full = method(CANDIDATES, culprit_trial(culprit, rate, full_calls), seed=seed,
                  store=full_store, experiment="exp")
    assert full.trials_spent > 30

    calls: list = []
    with TrialStore(tmp_path / "resume.db") as store, pytest.raises(Interrupted):
        method(CANDIDATES, culprit_trial(culprit, rate, calls, limit=30), seed=seed,
               store=store, experiment="exp")
    assert len(calls) == 30
    restarted = TrialStore(tmp_path / "resume.db")  # a fresh process would reopen the file
    resumed = method(CANDIDATES, culprit_trial(culprit, rate, calls), seed=seed,
                     store=restarted, experiment="exp")

    assert restarted.trials("exp").height == full_store.trials("exp").height  # (a)
    assert len(calls) == len(set(calls)) == full.trials_spent  # (b) nothing lost or repeated
    assert sorted(calls) == sorted(full_calls)
    assert resumed == full and resumed.history.equals(full.history)  # (c)


def test_rejects_bad_candidates():
    with pytest.raises(ValueError):
        bisect(["a", "a"], lambda c, s: True)
    with pytest.raises(ValueError):
        fixed_repeat_bisect([], lambda c, s: True)


def test_trace_holds_the_posterior_after_every_trial():
    result = bisect(CANDIDATES, culprit_trial(5, 0.3), seed=5)
    trace = result.trace
    assert trace.columns == ["step", "candidate", "probability"]
    assert trace["step"].n_unique() == result.trials_spent + 1
    sums = trace.group_by("step").agg(pl.col("probability").sum())["probability"]
    assert all(abs(x - 1.0) < 1e-9 for x in sums)
    final = trace.filter(pl.col("step") == result.trials_spent)
    assert dict(zip(final["candidate"], final["probability"], strict=True)) == \
        pytest.approx(result.posterior)


def test_parallel_bisect_runs_trials_concurrently_and_is_deterministic():
    import threading
    import time

    active, peak, lock = [0], [0], threading.Lock()
    inner = culprit_trial(9, 0.3)

    def slow_trial(candidate: str, seed: int) -> bool:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.005)
        with lock:
            active[0] -= 1
        return inner(candidate, seed)

    first = bisect(CANDIDATES, slow_trial, seed=2, parallel=4)
    again = bisect(CANDIDATES, culprit_trial(9, 0.3), seed=2, parallel=4)
    assert peak[0] > 1, "trials of one step ran at the same time"
    assert first.culprit == CANDIDATES[9] and first.converged
    assert first == again and first.history.equals(again.history)
    assert first.trials_spent == first.history.height
    with pytest.raises(ValueError, match="parallel must be >= 1"):
        bisect(CANDIDATES, inner, parallel=0)


def test_parallel_bisect_resumes_from_the_store_without_repeating(tmp_path):
    full = bisect(CANDIDATES, culprit_trial(10, 0.3), seed=4, parallel=3,
                  store=TrialStore(tmp_path / "full.db"), experiment="exp")
    calls: list = []
    with TrialStore(tmp_path / "resume.db") as store, pytest.raises(Interrupted):
        bisect(CANDIDATES, culprit_trial(10, 0.3, calls, limit=20), seed=4, parallel=3,
               store=store, experiment="exp")
    resumed = bisect(CANDIDATES, culprit_trial(10, 0.3, calls), seed=4, parallel=3,
                     store=TrialStore(tmp_path / "resume.db"), experiment="exp")
    assert resumed == full and resumed.history.equals(full.history)
    assert len(calls) == len(set(calls)) == full.trials_spent  # nothing lost or repeated


def test_bisect_batch_never_exceeds_max_trials():
    res = bisect(CANDIDATES, culprit_trial(9, 0.05), seed=1, parallel=4, max_trials=10)
    assert res.trials_spent == 10 and not res.converged


def test_parallel_fixed_repeat_bisect_finds_the_culprit_deterministically():
    a = fixed_repeat_bisect(CANDIDATES, culprit_trial(6, 1.0), repeats=9, seed=3, parallel=4)
    b = fixed_repeat_bisect(CANDIDATES, culprit_trial(6, 1.0), repeats=9, seed=3, parallel=4)
    assert a.culprit == CANDIDATES[6] and a == b and a.history.equals(b.history)
    clean_probes = a.history.group_by("candidate").agg(pl.col("failed").any())
    assert a.trials_spent == a.history.height and clean_probes.height == 4  # log2(16) probes
    with pytest.raises(ValueError, match="parallel must be >= 1"):
        fixed_repeat_bisect(CANDIDATES, culprit_trial(6, 1.0), parallel=0)


def test_rate_prior_is_normalised_and_validated():
    prior = RatePrior.log_uniform(0.005, 0.5, 64)
    assert prior is not DEFAULT_PRIOR_FAIL_RATE and prior == DEFAULT_PRIOR_FAIL_RATE
    assert math.isclose(sum(prior.weights), 1.0) and len(prior.rates) == 64
    assert math.isclose(prior.rates[0], 0.005) and math.isclose(prior.rates[-1], 0.5)
    ratios = np.diff(np.log(prior.rates))
    assert np.allclose(ratios, ratios[0])  # equal mass per decade
    with pytest.raises(ValueError):
        RatePrior((0.2, 0.1), (1.0, 1.0))
    with pytest.raises(ValueError):
        RatePrior((0.1, 1.0), (1.0, 1.0))
    with pytest.raises(ValueError):
        RatePrior.log_uniform(0.5, 0.1)


def test_grid_rate_matches_the_direct_sum():
    prior = RatePrior((0.01, 0.1, 0.4), (0.2, 0.5, 0.3))
    f, s = np.array([0, 3, 40]), np.array([10, 50, 2])
    log_marginal, mean = GridRate(prior).evaluate(f, s)
    rates, weights = np.array(prior.rates), np.array(prior.weights)
    for i in range(3):
        terms = weights * rates ** f[i] * (1 - rates) ** s[i]
        assert math.isclose(log_marginal[i], math.log(terms.sum()), rel_tol=1e-12)
        assert math.isclose(mean[i], (terms * rates).sum() / terms.sum(), rel_tol=1e-12)


def test_a_one_point_rate_prior_is_the_known_rate_posterior():
    model = Posterior(4, RatePrior((0.2,), (1.0,)), None, False)
    for j, failed in [(3, True), (1, False), (1, False), (2, False), (2, True)]:
        model.observe(j, failed)
    # k in {0, 1, 2} explain the failure at c2; each clean trial at or after k costs (1 - p)
    expected = np.array([0.8 ** 3, 0.8 ** 3, 0.8 ** 1, 0.0])
    assert np.allclose(model.probabilities(), expected / expected.sum())
    assert np.allclose(model.predictive()[0], 0.2)


@pytest.mark.parametrize("rate", [0.03, 0.3])
def test_default_bisect_needs_no_rate_and_stays_accurate(rate):
    """Rate not told: one default prior; 12 seeded culprits per rate, >= 11 found."""
    rng = np.random.default_rng(int(rate * 100))
    runs = [(int(rng.integers(0, 16)), seed) for seed in range(12)]
    results = [bisect(CANDIDATES, culprit_trial(k, rate), confidence=0.97, seed=seed)
               for k, seed in runs]
    hits = sum(r.culprit == CANDIDATES[k] for r, (k, _) in zip(results, runs, strict=True))
    assert hits >= 11 and all(r.converged for r in results)
    estimates = [r.estimated_fail_rate_bad for r in results]
    assert 0.3 * rate < float(np.median(estimates)) < 3 * rate  # the rate is learned
    again = bisect(CANDIDATES, culprit_trial(runs[0][0], rate), confidence=0.97, seed=runs[0][1])
    assert again == results[0] and again.history.equals(results[0].history)


def test_beta_and_grid_priors_agree_on_easy_problems():
    grid = bisect(CANDIDATES, culprit_trial(7, 0.5), seed=3)
    beta = bisect(CANDIDATES, culprit_trial(7, 0.5), seed=3, prior_fail_rate=(1.0, 1.0))
    assert grid.culprit == beta.culprit == CANDIDATES[7]
    assert 0.2 < grid.estimated_fail_rate_bad <= 0.5
