"""Bisection for intermittent failures: "bad" is a failure *probability*, not a verdict.

Model (ordered candidates ``c_0 .. c_{n-1}``): exactly one culprit index ``k`` — ``c_k`` is the
first bad candidate — with a uniform prior over ``k in 0..n-1`` (plus ``k = n``, "no culprit",
when ``allow_no_culprit``).  Candidates before ``k`` fail at rate ``p_good`` (exactly 0 by
default, or ``p_good ~ Beta(prior_good_fail_rate)``); candidates at or after ``k`` fail at one
shared unknown rate ``p_bad``.  By default nobody tells the search that rate: its prior is
log-uniform over 0.5%..50% (:data:`DEFAULT_PRIOR_FAIL_RATE`, a 64-point grid), and the joint
posterior over (culprit, rate) is exact on that grid; a Beta ``(a, b)`` prior is integrated out
in closed form instead.  Either way the likelihood of ``k`` is the product of the marginal
likelihoods of the pooled counts left and right of ``k``.

:func:`bisect` picks each next probe to minimise the expected posterior entropy over ``k``
(equivalently, to maximise the mutual information of one trial), stopping once the most
probable ``k`` reaches ``confidence``.  :func:`fixed_repeat_bisect` is the classic baseline:
binary search that calls a candidate good after ``repeats`` clean trials.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import polars as pl

from workbench.search.batch import choose_batch
from workbench.search.posterior import Posterior, choose, entropy_bits
from workbench.search.rate_prior import DEFAULT_RATE_PRIOR, RatePrior
from workbench.search.result import (
    CONFIDENCE,
    BisectOutcome,
    BisectResult,
    TrialUpdate,
    default_repeats,
)
from workbench.search.trials import CachedTrial, TrialFn, TrialStore

log = logging.getLogger(__name__)

RatePriorArg = tuple[float, float] | RatePrior
"""A bad-side rate prior: Beta ``(a, b)`` or a discrete :class:`RatePrior`."""

DEFAULT_PRIOR_FAIL_RATE: RatePrior = DEFAULT_RATE_PRIOR
"""Default prior on the bad-side rate: log-uniform over 0.5%..50%, so the rate need not be known
(``bench.bisect_sim`` measures accuracy and cost at 1%, 5% and 20% with this one prior)."""

BETA_PRIOR_FAIL_RATE = (0.3, 3.0)
"""The former default, Beta(0.3, 3): mean 0.09, density ~ p^-0.7 near 0."""

_HISTORY_SCHEMA = {"step": pl.Int64, "candidate": pl.Utf8, "failed": pl.Boolean,
                   "max_posterior": pl.Float64, "entropy": pl.Float64}


class _History:
    """Per-trial log, kept column-wise (cheap appends, fast frame construction)."""

    def __init__(self, on_trial: Callable[[TrialUpdate], None] | None = None) -> None:
        self.cols: dict[str, list] = {c: [] for c in _HISTORY_SCHEMA}
        self.posts: list[np.ndarray] = []
        self.on_trial = on_trial

    def add(self, candidate: str, failed: bool, post: np.ndarray) -> None:
        row = (len(self.cols["step"]) + 1, candidate, failed, float(post.max()), entropy_bits(post))
        for column, value in zip(self.cols.values(), row, strict=True):
            column.append(value)
        self.posts.append(post.copy())
        if self.on_trial is not None:  # a live view: it sees every trial as it is observed
            self.on_trial(TrialUpdate(row[0], candidate, failed, tuple(post.tolist())))

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.cols, schema=_HISTORY_SCHEMA)

    def trace(self, candidates: Sequence[str], prior: np.ndarray) -> pl.DataFrame:
        posts = [prior, *self.posts]
        n = len(candidates)
        return pl.DataFrame({
            "step": np.repeat(np.arange(len(posts)), n),
            "candidate": list(candidates) * len(posts),
            "probability": np.concatenate([p[:n] for p in posts]).astype(float)})


def _runner(trial: TrialFn, store: TrialStore | None, experiment: str | None, seed: int,
            method: str) -> CachedTrial:
    """Trial seeds depend only on (seed, candidate, index): stored and plain runs agree."""
    return CachedTrial(store, experiment or method, trial, namespace=f"seed={seed}")


def _result(candidates: Sequence[str], model: Posterior, post: np.ndarray, pick: int,
            spent: int, history: _History, outcome: BisectOutcome, method: str,
            target: float | None = None, rounds: int | None = None) -> BisectResult:
    n = len(candidates)
    result = BisectResult(
        candidates[pick] if pick < n else None,
        {c: float(p) for c, p in zip(candidates, post[:n], strict=True)},
        float(post[pick]), spent, *model.rates(post), history.frame(),
        float(post[n]) if post.size > n else 0.0, outcome is BisectOutcome.CONVERGED, method,
        history.trace(candidates, np.full(model.hyp, 1.0 / model.hyp)), outcome, target,
        rounds=rounds)
    log.info("%s bisect: %s", method, result.lead())
    return result


def _check(candidates: Sequence[str]) -> None:
    if len(candidates) == 0 or len(set(candidates)) != len(candidates):
        raise ValueError("candidates must be non-empty and distinct")


def bisect(
    candidates: Sequence[str],
    trial: TrialFn,
    *,
    confidence: float = CONFIDENCE,
    max_trials: int = 10_000,
    prior_fail_rate: RatePriorArg = DEFAULT_PRIOR_FAIL_RATE,
    prior_good_fail_rate: tuple[float, float] | None = None,
    allow_no_culprit: bool = False,
    seed: int = 0,
    store: TrialStore | None = None,
    experiment: str | None = None,
    parallel: int = 1,
    ends_budget: int = 0,
    good_end_trials: int = 2,
    on_trial: Callable[[TrialUpdate], None] | None = None,
) -> BisectResult:
    """Bayesian bisection: find the first bad candidate when failures are intermittent.

    ``trial(candidate, seed) -> failed`` must be a fair sample of the candidate's behaviour.
    Each step runs one trial at the candidate minimising expected posterior entropy; the loop
    stops when ``max(posterior) >= confidence`` (``converged=True``) or after ``max_trials``.
    ``prior_fail_rate`` is the bad-side rate prior: by default log-uniform over 0.5%..50% (the
    rate need not be known), or a Beta ``(a, b)`` / any :class:`RatePrior`.
    ``prior_good_fail_rate=None`` means good candidates never fail: one failure at ``c_j``
    proves the culprit is at or before ``j``.  Deterministic given ``seed`` and trial outcomes;
    with ``store`` (experiment defaults to ``"bayes"``) recorded trials are replayed first, so
    an interrupted run resumes to the identical result with no trial repeated.
    ``parallel = k > 1`` makes each step a round of ``k`` probes run in parallel threads
    (``trial`` must then be thread-safe), chosen together before any of their outcomes is seen
    to maximise the round's joint information about the culprit (:func:`choose_batch`: repeats
    of a candidate allowed, never ``k`` copies of the best probe by construction); the outcomes
    are observed in list order, the order the store's trial indices are claimed, so a resumed
    run replays the identical search.  More trials, fewer rounds; still deterministic.
    ``parallel=1`` is the single-probe search.  The stop rule is checked between rounds.

    ``ends_budget > 0`` checks both ends first (:func:`check_ends`), through the same runner, so
    those trials are stored, replayed and counted in the posterior like any other: a bad end
    with no failure in ``ends_budget`` trials ends the search as ``BAD_END_PASSES``; a good end
    that fails in ``good_end_trials`` trials (only when good candidates never fail) ends it as
    ``GOOD_END_FAILS``.  Neither claims a culprit.  The ends' trials run one at a time.
    ``on_trial`` is called after every trial (replayed ones too) with a :class:`TrialUpdate`.
    """
    _check(candidates)
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    runner = _runner(trial, store, experiment, seed, "bayes")
    model = Posterior(len(candidates), prior_fail_rate, prior_good_fail_rate, allow_no_culprit)
    rng = np.random.default_rng(seed)
    history = _History(on_trial)
    post = model.probabilities()
    ends = None
    if ends_budget > 0:
        good_end = good_end_trials if prior_good_fail_rate is None else 0
        ends = check_ends(candidates, runner, model, history, ends_budget, good_end, max_trials)
        post = model.probabilities()
    rounds = runner.spent  # the ends' trials ran one at a time
    while ends is None and post.max() < confidence and runner.spent < max_trials:
        rounds += 1
        size = min(parallel, max_trials - runner.spent)
        probes = _round(model, post, rng, size)
        for j, failed in zip(probes, runner.run_batch([candidates[j] for j in probes], parallel),
                             strict=True):
            model.observe(j, failed)
            post = model.probabilities()
            history.add(candidates[j], failed, post)
    outcome = ends or (BisectOutcome.CONVERGED if post.max() >= confidence
                       else BisectOutcome.NOT_CONVERGED)
    pick = int(np.argmax(post))
    return _result(candidates, model, post, pick, runner.spent, history, outcome, "bayes",
                   confidence, rounds)


def _round(model: Posterior, post: np.ndarray, rng: np.random.Generator, size: int) -> list[int]:
    """The next round's probes: the single most informative one, or a jointly chosen batch."""
    if size == 1:
        return [choose(model.information(post), rng)]
    return list(choose_batch(model.grid(post), rng, size).probes)


def check_ends(candidates: Sequence[str], runner: CachedTrial, model: Posterior,
               history: _History, bad_budget: int, good_trials: int,
               max_trials: int) -> BisectOutcome | None:
    """Trials of the bad end (``c_{n-1}``) until its first failure, at most ``bad_budget``
    (``BAD_END_PASSES`` if none failed), then up to ``good_trials`` of the good end (``c_0``,
    ``GOOD_END_FAILS`` on a failure); None: both ends behave, bisect on.
    Every trial is observed into ``model`` and ``history``; ``max_trials`` bounds them all."""
    last = len(candidates) - 1

    def run_end(j: int, budget: int) -> bool:
        for _ in range(budget):
            if runner.spent >= max_trials:
                return False
            failed = runner(candidates[j])
            model.observe(j, failed)
            history.add(candidates[j], failed, model.probabilities())
            if failed:
                return True
        return False
    if not run_end(last, bad_budget):
        return BisectOutcome.BAD_END_PASSES
    if last > 0 and run_end(0, good_trials):
        return BisectOutcome.GOOD_END_FAILS
    return None


def fixed_repeat_bisect(
    candidates: Sequence[str],
    trial: TrialFn,
    *,
    repeats: int | None = None,
    assumed_fail_rate: float = 0.05,
    alpha: float = 0.05,
    max_trials: int = 100_000,
    prior_fail_rate: RatePriorArg = DEFAULT_PRIOR_FAIL_RATE,
    seed: int = 0,
    store: TrialStore | None = None,
    experiment: str | None = None,
    parallel: int = 1,
) -> BisectResult:
    """Classic binary search: bad on the first failure, good after ``repeats`` clean trials.

    ``c_{n-1}`` is assumed bad.  ``repeats`` defaults to ``default_repeats(assumed_fail_rate,
    alpha)``.  The reported ``posterior``/``confidence`` come from the same Bayesian model as
    :func:`bisect` (prior ``prior_fail_rate``, good side exactly 0) applied to the trials this
    search ran, so the two methods' confidences are comparable.  Store semantics as
    :func:`bisect` (experiment defaults to ``"fixed-repeat"``).  ``parallel > 1`` runs a probe's
    trials ``parallel`` at a time (a failure ends the probe after its batch).
    """
    _check(candidates)
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    repeats = repeats or default_repeats(assumed_fail_rate, alpha)
    runner = _runner(trial, store, experiment, seed, "fixed-repeat")
    model = Posterior(len(candidates), prior_fail_rate, None, False)
    history = _History()
    lo, hi = 0, len(candidates) - 1
    while lo < hi and runner.spent < max_trials:
        mid = (lo + hi) // 2
        verdict = _probe(candidates, mid, repeats, runner, model, history, max_trials, parallel)
        if verdict is None:
            break
        lo, hi = (lo, mid) if verdict else (mid + 1, hi)
    post = model.probabilities()
    pick = lo if lo == hi else int(np.argmax(post))
    outcome = BisectOutcome.CONVERGED if lo == hi else BisectOutcome.NOT_CONVERGED
    return _result(candidates, model, post, pick, runner.spent, history, outcome,
                   "fixed-repeat")


def _probe(candidates: Sequence[str], j: int, repeats: int, runner: CachedTrial,
           model: Posterior, history: _History, max_trials: int, parallel: int = 1) -> bool | None:
    """Up to ``repeats`` trials of c_j, ``parallel`` at a time: True on a failure, False if all
    clean, None if the trial budget ran out first."""
    done = 0
    while done < repeats:
        size = min(parallel, repeats - done, max_trials - runner.spent)
        if size <= 0:
            return None
        outcomes = runner.run_many(candidates[j], size, parallel)
        for failed in outcomes:
            model.observe(j, failed)
            history.add(candidates[j], failed, model.probabilities())
        done += size
        if any(outcomes):
            return True
    return False
