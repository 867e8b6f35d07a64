"""Joint design of a round of probes for parallel bisection.

With ``k`` deployments a round runs ``k`` trials at once, chosen before any of their outcomes is
seen.  Copying the best single probe ``k`` times, or taking the ``k`` best single probes, wastes
trials whenever their outcomes are redundant; :func:`choose_batch` instead greedily adds the
probe (repeats allowed) that most raises the mutual information ``I(Y_1..Y_m; culprit)`` of the
whole round, the bad-side rate integrated out.  With ``m = 1`` that is exactly
:meth:`Posterior.information`, so a one-probe round is today's single-probe choice.

How: a :class:`HypothesisGrid` gives ``P(culprit k, rate i)``; given ``(k, i)`` the round's
trials are independent, so for each outcome prefix ``y`` of the probes chosen so far (``2^m`` of
them) we keep ``w[y, k, i] = P(y, k, i)``.  Probing ``c_j`` next, a trial fails with the bad rate
when ``k <= j`` and with the good-side rate otherwise, so every prefix's failure mass over all
``j`` at once is a cumulative sum over ``k``: one greedy step costs ``O(2^m |grid|)``, not times
``n``.  ``H(Y | culprit)`` is the same cumulative sum of per-culprit entropies (the rate stays
mixed within a culprit, so trials at one candidate inform each other through it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.search.posterior import HypothesisGrid, choose

_NEGLIGIBLE = 1e-13
"""Grid columns and outcome prefixes below this probability are dropped: their entropy terms
are below 1e-11 bits, far under any gain the greedy compares."""


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


class JointRound:
    """The outcome-prefix weights of a partly chosen round and the information of extending it.

    Invariant: ``w.sum() == 1`` up to the dropped negligible prefixes; ``information`` is the
    mutual information of the probes added so far.
    """

    def __init__(self, grid: HypothesisGrid):
        keep = grid.weights.sum(axis=0) > _NEGLIGIBLE
        self.w = grid.weights[None, :, keep]
        self.bad = grid.bad[:, keep]
        self.good, self.n = grid.good, grid.n
        culprit = grid.weights.sum(axis=1)
        self._culprit_entropy = -float(_xlogx(culprit).sum())
        self.probes: list[int] = []
        self.information = 0.0

    def _masses(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (prefix, culprit): total mass, and the mass of a failure on a bad / good probe."""
        w = self.w
        total = w.sum(axis=-1)
        bad = w @ self.bad[0] if self.bad.shape[0] == 1 else (w * self.bad).sum(axis=-1)
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
        # H(Y | k) = H(Y, k) - H(k): ``given`` is H(Y, k) per j
        return joint - given + self._culprit_entropy

    def add(self, j: int, information: float) -> None:
        """Append probe ``c_j`` (its round information precomputed by :meth:`gains`)."""
        culprits = np.arange(self.w.shape[1])[:, None]
        good = 0.0 if self.good is None else self.good[:, None]
        p = np.where(culprits <= j, self.bad, good)
        w = np.concatenate([self.w * (1.0 - p), self.w * p])
        self.w = w[w.sum(axis=(1, 2)) > _NEGLIGIBLE]
        self.probes.append(j)
        self.information = information


def choose_batch(grid: HypothesisGrid, rng: np.random.Generator, size: int) -> BatchDesign:
    """``size`` probes chosen greedily, each maximising the round's joint information given the
    ones before it (ties broken by ``rng`` as :func:`choose` does).  Deterministic given the
    grid and the rng's state."""
    if size < 1:
        raise ValueError(f"a round needs at least one probe, got {size}")
    state = JointRound(grid)
    for _ in range(size):
        info = state.gains()
        j = choose(np.maximum(info - state.information, 0.0), rng)
        state.add(j, float(info[j]))
    return BatchDesign(tuple(state.probes), state.information)
