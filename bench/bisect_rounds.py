"""Parallel Bayesian bisection: rounds to the culprit with k probes per round (rate unknown).

Run ``python -m bench.bisect_sim --k 1 2 4 8 [--quick]``.  Every cell uses the culprits and
trial seeds of ``bench.bisect_sim`` (the same draws for every k, so the k's are compared on
identical problems) and ``bisect(..., parallel=k)`` with the default log-uniform rate prior.  A
*round* is one wait for trials: with k deployments its k trials run at once, so rounds are the
wall time of a search whose trials take equal time.  Targets: >= 95% right in every cell; at
the 1% and 5% rates (where repeated trials dominate) k = 8 needs at most 0.35x the rounds of
k = 1; no k > 1 ever needs more rounds than k = 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from workbench.search.bisect import DEFAULT_PRIOR_FAIL_RATE, bisect

KS = (1, 2, 4, 8)
TARGET_ACCURACY, TARGET_ROUNDS, TARGET_RATES = 0.95, 0.35, (0.01, 0.05)


def simulated_trial(n: int, culprit: int, rate: float) -> Callable[[str, int], bool]:
    """Trial for candidates ``c000..``: fails iff index >= culprit and U(seed) < rate."""

    def trial(candidate: str, seed: int) -> bool:
        return int(candidate[1:]) >= culprit and (seed >> 10) / 2.0**53 < rate

    return trial


@dataclass(frozen=True)
class RoundsCell:
    """Aggregate of one (rate, n, k) cell: accuracy and mean rounds and trials over ``runs``."""

    rate: float
    n: int
    k: int
    runs: int
    accuracy: float
    mean_rounds: float
    mean_trials: float
    seconds: float


def run_rounds_cell(rate: float, n: int, k: int, runs: int, seed: int,
                    confidence: float) -> RoundsCell:
    """``runs`` seeded bisections at ``k`` probes per round (culprits drawn as ``run_cell``)."""
    rng = np.random.default_rng([seed, n, int(rate * 1e6)])
    candidates = [f"c{i:03d}" for i in range(n)]
    hits = rounds = trials = 0
    start = time.perf_counter()
    for r in range(runs):
        culprit = int(rng.integers(0, n))
        res = bisect(candidates, simulated_trial(n, culprit, rate), confidence=confidence,
                     prior_fail_rate=DEFAULT_PRIOR_FAIL_RATE, seed=seed * 100_003 + r, parallel=k)
        hits += res.culprit == candidates[culprit]
        rounds += res.rounds or 0
        trials += res.trials_spent
    return RoundsCell(rate, n, k, runs, hits / runs, rounds / runs, trials / runs,
                      time.perf_counter() - start)


@dataclass(frozen=True)
class RoundsSim:
    """All cells of one run, keyed ``(rate, n, k)``; ``ks`` must include 1 (the baseline)."""

    runs: int
    confidence: float
    cells: dict[tuple[float, int, int], RoundsCell]
    seconds: float

    def ratio(self, cell: RoundsCell) -> float:
        """Mean rounds of ``cell`` over those of k = 1 at the same rate and n."""
        return cell.mean_rounds / self.cells[(cell.rate, cell.n, 1)].mean_rounds

    def checks(self) -> dict[str, bool]:
        """The targets, each True when it holds in every cell it concerns; the rounds target
        is left out when no cell at the largest k has a rate in ``TARGET_RATES``."""
        cells = list(self.cells.values())
        top = max(c.k for c in cells)
        fast = [c for c in cells if c.k == top and c.rate in TARGET_RATES]
        out = {f"accuracy >= {TARGET_ACCURACY:.0%} in every cell":
               all(c.accuracy >= TARGET_ACCURACY for c in cells)}
        if fast:
            rates = ", ".join(f"{r:.0%}" for r in TARGET_RATES)
            out[f"k={top} rounds <= {TARGET_ROUNDS}x k=1 at {rates}"] = all(
                self.ratio(c) <= TARGET_ROUNDS for c in fast)
        out["no k > 1 needs more rounds than k=1"] = all(self.ratio(c) <= 1.0 for c in cells)
        return out


def run_rounds(ks=KS, rates=(0.01, 0.05, 0.20), sizes=(16, 64), runs: int = 200, seed: int = 0,
               confidence: float = 0.97) -> RoundsSim:
    if 1 not in ks:
        raise ValueError(f"the k axis needs k=1 as its baseline, got {ks}")
    start = time.perf_counter()
    cells = {(rate, n, k): run_rounds_cell(rate, n, k, runs, seed, confidence)
             for rate in rates for n in sizes for k in ks}
    return RoundsSim(runs, confidence, cells, time.perf_counter() - start)


def report_rounds(res: RoundsSim) -> None:
    print(f"parallel bisection, rate unknown (log-uniform 0.5%..50% prior), confidence "
          f"{res.confidence}, {res.runs} runs per cell; a round = k trials at once")
    print(f"{'rate':>5} {'n':>3} {'k':>2} | {'right':>6} {'rounds':>8} {'trials':>8} "
          f"{'rounds/k=1':>10} | {'s':>5}")
    for c in res.cells.values():
        print(f"{c.rate:>5.0%} {c.n:>3} {c.k:>2} | {c.accuracy:>6.1%} {c.mean_rounds:>8.1f} "
              f"{c.mean_trials:>8.1f} {res.ratio(c):>10.2f} | {c.seconds:>5.1f}")
    for name, ok in res.checks().items():
        print(f"target {name}: {'met' if ok else 'NOT met'}")
    print(f"total {res.seconds:.0f} s")
