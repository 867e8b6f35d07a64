"""Joint design of a round of probes for parallel bisection.

With ``k`` deployments a round runs ``k`` trials at once, chosen before any of their outcomes is
seen.  Copying the best single probe ``k`` times, or taking the ``k`` best single probes, wastes
trials whenever their outcomes are redundant; :func:`choose_batch` instead greedily adds the
probe (repeats allowed) that most raises the mutual information ``I(Y_1..Y_m; culprit)`` of the
whole round, the bad-side rate integrated out.  With ``m = 1`` that is exactly
:meth:`Posterior.information`, so a one-probe round is today's single-probe choice.

How: a :class:`HypothesisGrid` gives ``P(culprit k, rate i)``; given ``(k, i)`` the round's
trials are independent, so each outcome prefix ``y`` of the probes chosen so far (``2^m`` of
them) has ``P(y, k)`` in closed form (see :class:`JointRound`).  Probing ``c_j`` next, a trial
fails with the bad rate when ``k <= j`` and with the good-side rate otherwise, so every
prefix's failure mass over all ``j`` at once is a cumulative sum over ``k``: one greedy step
costs ``O(2^m n)``, neither times ``n`` again nor times the rate grid's size.
``H(Y | culprit)`` is the same cumulative sum of per-culprit entropies (the rate stays mixed
within a culprit, so trials at one candidate inform each other through it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.search.posterior import HypothesisGrid, choose

_NEGLIGIBLE = 1e-13
"""Outcome prefixes below this probability are dropped: their entropy terms are below 1e-11
bits, far under any gain the greedy compares."""


@dataclass(frozen=True)
class BatchDesign:
    """One round: ``probes`` (candidate indices, in the order their trials are claimed and
    observed; repeats allowed) and ``information``, the round's joint mutual information with
    the culprit in bits (>= 0, at most the culprit posterior's entropy)."""

    probes: tuple[int, ...]
    information: float


def _xlogx(x: np.ndarray) -> np.ndarray:
    return x * np.log2(np.maximum(x, 1e-300))


def _split_entropy(fail: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``-[f log f + (t - f) log (t - f)]`` elementwise: the entropy terms of a prefix's two
    extensions (joint probabilities, so they sum to a joint entropy)."""
    return -(_xlogx(fail) + _xlogx(np.maximum(total - fail, 0.0)))


def _moments(grid: HypothesisGrid, d: int) -> np.ndarray:
    """``T[k, f, s] = sum_i weights[k, i] bad[k, i]^f (1 - bad[k, i])^s`` for f, s < d."""
    w, hyp = grid.weights, grid.weights.shape[0]
    powers = np.arange(d)
    if grid.bad.shape[0] == 1:  # one rate grid for every culprit: a single matrix product
        r = grid.bad[0][:, None]
        terms = (r ** powers)[:, :, None] * ((1.0 - r) ** powers)[:, None, :]
        return (w @ terms.reshape(r.size, d * d)).reshape(hyp, d, d)
    r = grid.bad[..., None]
    return np.einsum("kg,kgf,kgs->kfs", w, r ** powers, (1.0 - r) ** powers)


class JointRound:
    """The outcome prefixes of a partly chosen round and the information of extending it.

    Given culprit k, a prefix's probability depends on the rate only through its fails and
    passes on bad probes (``c_j`` with ``j >= k``), so it is ``alive[y, k] * T[k, f, s]`` with
    ``T[k, f, s] = sum_i P(k, rate_i) r_i^f (1 - r_i)^s`` tabulated once per round (f + s <=
    ``size``): each step costs O(2^m n), independent of the rate grid.  ``alive`` carries the
    good probes' factor (0 once a good probe failed and good never fails).  Invariant:
    ``information`` is the mutual information of the probes added so far.
    """

    def __init__(self, grid: HypothesisGrid, size: int):
        self.table = _moments(grid, size + 2)  # gains() after the last add looks one further
        hyp = grid.weights.shape[0]
        self.culprits = np.arange(hyp)
        self.fails = np.zeros((1, hyp), dtype=np.int64)
        self.passes = np.zeros((1, hyp), dtype=np.int64)
        self.alive = np.ones((1, hyp))
        self.good, self.n = grid.good, grid.n
        self._culprit_entropy = -float(_xlogx(grid.weights.sum(axis=1)).sum())
        self.probes: list[int] = []
        self.information = 0.0

    def _masses(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (prefix, culprit): total mass, and the mass of a failure on a bad / good probe."""
        k = self.culprits
        total = self.alive * self.table[k, self.fails, self.passes]
        bad = self.alive * self.table[k, self.fails + 1, self.passes]
        good = np.zeros_like(total) if self.good is None else total * self.good
        return total, bad, good

    def gains(self) -> np.ndarray:
        """For each candidate ``j < n``: the round's mutual information if ``c_j`` were added."""
        total, bad, good = self._masses()
        n = self.n
        fail = np.cumsum(bad[:, :n], axis=1) + (good.sum(axis=1, keepdims=True)
                                               - np.cumsum(good[:, :n], axis=1))
        joint = _split_entropy(fail, total.sum(axis=1, keepdims=True)).sum(axis=0)
        on_bad = _split_entropy(bad, total).sum(axis=0)
        on_good = _split_entropy(good, total).sum(axis=0)
        given = np.cumsum(on_bad)[:n] + (on_good.sum() - np.cumsum(on_good)[:n])
        # H(Y | k) = H(Y, k) - H(k): ``given`` is H(Y, k) for each j
        return joint - given + self._culprit_entropy

    def add(self, j: int, information: float) -> None:
        """Append probe ``c_j`` (its round information precomputed by :meth:`gains`)."""
        bad = (self.culprits <= j).astype(np.int64)
        g = np.zeros(bad.size) if self.good is None else self.good
        self.fails = np.concatenate([self.fails, self.fails + bad])
        self.passes = np.concatenate([self.passes + bad, self.passes])
        self.alive = np.concatenate([self.alive * np.where(bad, 1.0, 1.0 - g),
                                     self.alive * np.where(bad, 1.0, g)])
        keep = self._masses()[0].sum(axis=1) > _NEGLIGIBLE
        self.fails, self.passes, self.alive = self.fails[keep], self.passes[keep], self.alive[keep]
        self.probes.append(j)
        self.information = information


def choose_batch(grid: HypothesisGrid, rng: np.random.Generator, size: int) -> BatchDesign:
    """``size`` probes chosen greedily, each maximising the round's joint information given the
    ones before it (ties broken by ``rng`` as :func:`choose` does).  Deterministic given the
    grid and the rng's state."""
    if size < 1:
        raise ValueError(f"a round needs at least one probe, got {size}")
    state = JointRound(grid, size)
    for _ in range(size):
        info = state.gains()
        j = choose(np.maximum(info - state.information, 0.0), rng)
        state.add(j, float(info[j]))
    return BatchDesign(tuple(state.probes), state.information)
