"""Priors over the unknown failure rate of a bad candidate, for ``workbench.search.bisect``.

:class:`RatePrior` is a discrete prior: the rate is one of ``rates`` with probability
``weights``.  The default, :meth:`RatePrior.log_uniform`, spreads equal mass per decade over
0.5%..50% (64 log-spaced points), so nobody has to tell the bisection the rate: it learns the
rate jointly with the culprit.  :class:`GridRate` integrates such a prior out of pooled
Bernoulli counts exactly (a finite sum), giving what ``Posterior`` needs per hypothesis: the log
marginal likelihood of (fails, passes) and the posterior-mean rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RatePrior:
    """Discrete prior over a failure rate.

    Invariants: ``rates`` strictly increasing inside (0, 1); ``weights`` positive, same length,
    summing to 1 (normalised on construction).
    """

    rates: tuple[float, ...]
    weights: tuple[float, ...]
    label: str = "discrete"

    def __post_init__(self) -> None:
        r, w = np.asarray(self.rates, float), np.asarray(self.weights, float)
        if r.ndim != 1 or r.size == 0 or r.shape != w.shape:
            raise ValueError("rates and weights must be non-empty and of equal length")
        if not (np.all(r > 0) and np.all(r < 1) and np.all(np.diff(r) > 0)):
            raise ValueError("rates must be strictly increasing inside (0, 1)")
        if not np.all(w > 0):
            raise ValueError("weights must be positive")
        object.__setattr__(self, "rates", tuple(float(x) for x in r))
        object.__setattr__(self, "weights", tuple(float(x) for x in w / w.sum()))

    @classmethod
    def log_uniform(cls, low: float = 0.005, high: float = 0.5, points: int = 64) -> RatePrior:
        """Equal mass on ``points`` log-spaced rates from ``low`` to ``high`` (density ~ 1/p):
        scale-free, so no rate inside the range is favoured over another tenfold lower."""
        if not 0 < low < high < 1 or points < 2:
            raise ValueError(f"need 0 < low < high < 1 and points >= 2, got {low}, {high}")
        rates = np.exp(np.linspace(math.log(low), math.log(high), points))
        return cls(tuple(rates), (1.0,) * points,
                   f"log-uniform {low:.1%}..{high:.0%} ({points} points)")

    def mean(self) -> float:
        return float(np.dot(self.rates, self.weights))

    def __str__(self) -> str:
        return self.label


DEFAULT_RATE_PRIOR = RatePrior.log_uniform()
"""The rate prior ``bisect`` uses unless told otherwise: the rate is not needed up front."""


class GridRate:
    """Beta-Bernoulli's role for a :class:`RatePrior`: for pooled counts ``(f, s)`` (fails,
    passes; integer arrays of one shape), the log marginal likelihood
    ``log sum_i w_i p_i^f (1 - p_i)^s`` and the posterior-mean rate, computed together."""

    def __init__(self, prior: RatePrior):
        self.prior = prior
        self._p = np.asarray(prior.rates)
        self._lp, self._lq = np.log(self._p), np.log1p(-self._p)
        self._lw = np.log(np.asarray(prior.weights))

    def evaluate(self, f: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(log_marginal, mean_rate)``, each of the counts' shape."""
        top, w = self._terms(f, s)
        total = w.sum(axis=-1)
        return np.log(total) + top[..., 0], (w @ self._p) / total

    def posterior(self, f: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The posterior over the grid's rates given pooled counts: shape ``f.shape + (G,)``,
        each row summing to 1."""
        _, w = self._terms(f, s)
        return w / w.sum(axis=-1, keepdims=True)

    def _terms(self, f: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ll = (np.asarray(f)[..., None] * self._lp + np.asarray(s)[..., None] * self._lq
              + self._lw)
        top = ll.max(axis=-1, keepdims=True)
        return top, np.exp(ll - top)
