"""The change-point posterior behind ``workbench.search.bisect``: the failure rates on each side of
the
culprit integrated out (a Beta or a discrete :class:`RatePrior` on the bad side, a Beta or exactly
zero on the good side), the posterior over the culprit index, and the information of a probe."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.search.rate_prior import GridRate, RatePrior


class _LogBeta:
    """``log B(a + f, b + s) - log B(a, b)`` for integer arrays via growing lgamma tables."""

    def __init__(self, a: float, b: float):
        if a <= 0 or b <= 0:
            raise ValueError(f"Beta parameters must be positive, got ({a}, {b})")
        self.a, self.b, self.size = a, b, 0
        self._grow(256)

    def _grow(self, size: int) -> None:
        ga, gb, gab = (np.array([math.lgamma(x + i) for i in range(size)])
                       for x in (self.a, self.b, self.a + self.b))
        self._ga, self._gb, self._gab, self.size = ga, gb, gab, size
        self._base = ga[0] + gb[0] - gab[0]

    def __call__(self, f: np.ndarray, s: np.ndarray) -> np.ndarray:
        need = int((f + s).max()) + 1
        if need > self.size:
            self._grow(max(need, 2 * self.size))
        return self._ga[f] + self._gb[s] - self._gab[f + s] - self._base


class _BetaRate:
    """:class:`GridRate`'s interface for a Beta(a, b) rate prior (closed form)."""

    def __init__(self, a: float, b: float):
        self.a, self.b, self._lb = a, b, _LogBeta(a, b)

    def evaluate(self, f: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._lb(f, s), (self.a + f) / (self.a + self.b + f + s)


def _binary_entropy(p: np.ndarray) -> np.ndarray:
    q = 1.0 - p
    return -(p * np.log2(np.maximum(p, 1e-300)) + q * np.log2(np.maximum(q, 1e-300)))


def entropy_bits(post: np.ndarray) -> float:
    """Shannon entropy (bits) of a probability vector; zero entries contribute nothing."""
    nz = post[post > 0]
    return float(-(nz * np.log2(nz)).sum())


@dataclass(frozen=True)
class HypothesisGrid:
    """The posterior over (culprit k, bad-side rate) as a finite grid, for batch design.

    Invariants: ``weights`` has shape ``(hyp, G)``, is non-negative and sums to 1 (its row sums
    are the culprit posterior); ``bad`` (shape ``(1, G)`` or ``(hyp, G)``) is the failure rate
    of a candidate at or after k under each grid point; ``good`` (shape ``(hyp,)``) is the
    failure rate of one before k, or None when good candidates never fail.  ``n`` candidates
    can be probed; ``hyp`` is ``n + 1`` when "no culprit" is a hypothesis.  A Beta rate prior
    becomes one grid point per k at its posterior mean (G = 1: conditionally independent
    trials, which ignores how trials at one k inform each other about the rate).
    """

    weights: np.ndarray
    bad: np.ndarray
    good: np.ndarray | None
    n: int


class Posterior:
    """Counts per candidate and the posterior over the culprit index they imply.

    ``bad`` is the prior on the shared bad-side rate: a Beta ``(a, b)`` or a :class:`RatePrior`
    (then the joint posterior over (culprit, rate) lives on the prior's grid).
    """

    def __init__(self, n: int, bad: tuple[float, float] | RatePrior,
                 good: tuple[float, float] | None, allow_none: bool):
        self.n, self.hyp = n, n + int(allow_none)
        self.bad, self.good = bad, good
        self._bad_rate = GridRate(bad) if isinstance(bad, RatePrior) else _BetaRate(*bad)
        self._good_lb = _LogBeta(*good) if good is not None else None
        self.fails = np.zeros(n, dtype=np.int64)
        self.totals = np.zeros(n, dtype=np.int64)
        self._cache: tuple[np.ndarray, ...] | None = None
        self._bad_cache: tuple[np.ndarray, np.ndarray] | None = None

    def observe(self, j: int, failed: bool) -> None:
        self.fails[j] += int(failed)
        self.totals[j] += 1
        self._cache = self._bad_cache = None

    def _bad(self) -> tuple[np.ndarray, np.ndarray]:
        """Per hypothesis: log marginal likelihood of the bad-side counts, posterior-mean rate."""
        if self._bad_cache is None:
            _, _, fr, sr = self._pools()
            self._bad_cache = self._bad_rate.evaluate(fr, sr)
        return self._bad_cache

    def _pools(self) -> tuple[np.ndarray, ...]:
        """(fails, passes) pooled left of k and at/right of k, for every hypothesis k."""
        if self._cache is None:
            fl = np.zeros(self.n + 1, dtype=np.int64)
            nl = np.zeros(self.n + 1, dtype=np.int64)
            np.cumsum(self.fails, out=fl[1:])
            np.cumsum(self.totals, out=nl[1:])
            fr, nr = fl[-1] - fl, nl[-1] - nl
            h = self.hyp
            self._cache = (fl[:h], (nl - fl)[:h], fr[:h], (nr - fr)[:h])
        return self._cache

    def probabilities(self) -> np.ndarray:
        """Posterior over k (length ``hyp``); sums to 1."""
        fl, sl, _, _ = self._pools()
        good = np.where(fl == 0, 0.0, -np.inf) if self._good_lb is None else self._good_lb(fl, sl)
        ll = good + self._bad()[0]
        w = np.exp(ll - ll.max())
        return w / w.sum()

    def predictive(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Per hypothesis k: P(next trial fails) on a bad candidate, and on a good one
        (``None`` when good candidates never fail)."""
        fl, sl, _, _ = self._pools()
        pb = self._bad()[1]
        if self.good is None:
            return pb, None
        ga, gb = self.good
        return pb, (ga + fl) / (ga + gb + fl + sl)

    def information(self, post: np.ndarray) -> np.ndarray:
        """Expected entropy drop (bits) over k from one more trial at each candidate j.

        Probing j: hypotheses ``k <= j`` make c_j bad.  I(j) = H(Y_j) - E_k H(Y_j | k), which
        equals H(post) - E[H(post after the trial)]; computed in O(n) with prefix sums.
        """
        pb, pg = self.predictive()
        hg = None if pg is None else post * _binary_entropy(pg)
        p_fail = _split_sum(post * pb, None if pg is None else post * pg, self.n)
        cond = _split_sum(post * _binary_entropy(pb), hg, self.n)
        return np.maximum(_binary_entropy(p_fail) - cond, 0.0)

    def grid(self, post: np.ndarray) -> HypothesisGrid:
        """``post`` (from :meth:`probabilities`) spread over each culprit's rate posterior."""
        pb, pg = self.predictive()
        if isinstance(self._bad_rate, GridRate):
            _, _, fr, sr = self._pools()
            weights = post[:, None] * self._bad_rate.posterior(fr, sr)
            bad = np.asarray(self._bad_rate.prior.rates)[None, :]
        else:
            weights, bad = post[:, None], pb[:, None]
        return HypothesisGrid(weights, bad, pg, self.n)

    def rates(self, post: np.ndarray) -> tuple[float, float]:
        """Posterior-mean failure rates (bad side, good side)."""
        pb, pg = self.predictive()
        return float(post @ pb), 0.0 if pg is None else float(post @ pg)


def _split_sum(bad: np.ndarray, good: np.ndarray | None, n: int) -> np.ndarray:
    """For each probe j < n: sum(bad[k] for k <= j) + sum(good[k] for k > j)."""
    cb = np.cumsum(bad)[:n]
    if good is None:
        return cb
    cg = np.cumsum(good)
    return cb + (cg[-1] - cg[:n])


def choose(info: np.ndarray, rng: np.random.Generator) -> int:
    """Index of the most informative probe; exact-ish ties broken by ``rng``."""
    best = info.max()
    ties = np.flatnonzero(info >= best * (1 - 1e-9)) if best > 0 else np.arange(info.size)
    return int(ties[0]) if ties.size == 1 else int(rng.choice(ties))
