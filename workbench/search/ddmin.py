"""Delta debugging (Zeller's ddmin) to a 1-minimal failing subset, robust to flaky trials.

A subset *fails* if any of up to ``repeats`` trials fails (stopping at the first failure);
failures are taken as real (a passing configuration never fails).  A subset that survives all
``repeats`` trials *passes*, but only probably: with assumed failure rate ``p`` and prior
``prior_pass``, P(really passes | m clean trials) = prior_pass / (prior_pass + (1 -
prior_pass) (1 - p)^m).  The result's confidence is the product of that probability over the
complements ``minimal - {x}`` that establish 1-minimality.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import polars as pl

from workbench.search.bisect import default_repeats
from workbench.search.trials import derive_seed

log = logging.getLogger(__name__)

SubsetTrial = Callable[[frozenset[str], int], bool]
"""``trial(subset, seed) -> failed`` for the configuration made of ``subset``."""

_HISTORY_SCHEMA = {"step": pl.Int64, "subset": pl.Utf8, "size": pl.Int64, "failed": pl.Boolean,
                   "trials": pl.Int64, "pass_confidence": pl.Float64}


@dataclass(frozen=True)
class DdminResult:
    """Outcome of :func:`ddmin`.

    Invariants: ``minimal`` is a subset of the input in input order and was observed to fail
    (so it truly fails, given failures are real); ``complete`` means every ``minimal - {x}``
    was tested and passed, i.e. ``minimal`` is 1-minimal with probability ``confidence``
    under the assumed failure rate.  ``trials_spent <= budget`` and equals
    ``history["trials"].sum()``.
    """

    minimal: tuple[str, ...]
    confidence: float
    trials_spent: int
    history: pl.DataFrame = field(compare=False, repr=False)
    complete: bool = True


@dataclass(frozen=True)
class _Verdict:
    failed: bool
    clean: int


class _Budget(Exception):
    """The trial budget ran out in the middle of a subset test."""


class _Tester:
    """Runs and caches subset verdicts; each subset is tested at most once."""

    def __init__(self, order: dict[str, int], trial: SubsetTrial, repeats: int, budget: int,
                 seed: int, fail_rate: float, prior_pass: float):
        self.order, self.trial, self.repeats, self.budget = order, trial, repeats, budget
        self.namespace = f"ddmin:seed={seed}"
        self.fail_rate, self.prior_pass = fail_rate, prior_pass
        self.cache: dict[frozenset[str], _Verdict] = {}
        self.spent = 0
        self.rows: dict[str, list] = {c: [] for c in _HISTORY_SCHEMA}

    def key(self, subset: frozenset[str]) -> str:
        return ",".join(sorted(subset, key=self.order.__getitem__))

    def fails(self, subset: Sequence[str]) -> bool:
        """True if ``subset`` failed in any of its trials; raises :class:`_Budget` if out."""
        s = frozenset(subset)
        if s not in self.cache:
            self.cache[s] = self._run(s)
        return self.cache[s].failed

    def _run(self, s: frozenset[str]) -> _Verdict:
        key = self.key(s)
        for i in range(self.repeats):
            if self.spent >= self.budget:
                raise _Budget
            self.spent += 1
            if self.trial(s, derive_seed(self.namespace, key, i)):
                self._log(key, len(s), True, i + 1)
                return _Verdict(True, i)
        self._log(key, len(s), False, self.repeats)
        return _Verdict(False, self.repeats)

    def pass_confidence(self, s: frozenset[str]) -> float:
        """P(``s`` really passes | its clean trials); 1.0 for the empty set, 0.0 if it failed."""
        if not s:
            return 1.0
        v = self.cache.get(s)
        if v is not None and v.failed:
            return 0.0
        miss = (1.0 - self.prior_pass) * (1.0 - self.fail_rate) ** (v.clean if v else 0)
        return self.prior_pass / (self.prior_pass + miss)

    def _log(self, key: str, size: int, failed: bool, trials: int) -> None:
        conf = 0.0 if failed else self.prior_pass / (
            self.prior_pass + (1 - self.prior_pass) * (1 - self.fail_rate) ** trials)
        values = (len(self.rows["step"]) + 1, key, size, failed, trials, conf)
        for column, value in zip(self.rows.values(), values, strict=True):
            column.append(value)


def _split(items: list[str], n: int) -> list[list[str]]:
    """``items`` cut into ``n`` contiguous, non-empty, near-equal chunks."""
    bounds = [len(items) * i // n for i in range(n + 1)]
    return [items[bounds[i]: bounds[i + 1]] for i in range(n)]


def _reduce_once(tester: _Tester, current: list[str], n: int) -> tuple[list[str], int] | None:
    """One ddmin round: a failing chunk, else a failing complement; None if neither fails."""
    chunks = _split(current, n)
    for chunk in chunks:
        if tester.fails(chunk):
            return chunk, 2
    if n == 2:
        return None
    for chunk in chunks:
        complement = [x for x in current if x not in set(chunk)]
        if tester.fails(complement):
            return complement, max(n - 1, 2)
    return None


def _search(tester: _Tester, current: list[str]) -> list[str]:
    """Zeller's ddmin loop from a failing ``current``; raises :class:`_Budget` when out."""
    n = 2
    while len(current) >= 2:
        step = _reduce_once(tester, current, n)
        if step is not None:
            current, n = step
        elif n >= len(current):
            break
        else:
            n = min(len(current), 2 * n)
    return current


def ddmin(
    items: Sequence[str],
    trial: SubsetTrial,
    *,
    repeats: int | None = None,
    assumed_fail_rate: float = 0.1,
    alpha: float = 0.05,
    budget: int = 10_000,
    prior_pass: float = 0.5,
    seed: int = 0,
) -> DdminResult:
    """Shrink the failing configuration ``items`` to a 1-minimal failing subset.

    ``repeats`` (default ``default_repeats(assumed_fail_rate, alpha)``) bounds the trials per
    subset; each subset is tested at most once per call.  Trial seeds are
    ``derive_seed("ddmin:seed=<seed>", subset, i)``: reruns with the same seed are identical.
    Raises ValueError if ``items`` itself does not fail within ``repeats`` trials.  If the
    ``budget`` runs out, returns the smallest failing subset found with ``complete=False``.
    """
    order = {x: i for i, x in enumerate(items)}
    if len(order) != len(items):
        raise ValueError("items must be distinct")
    repeats = repeats or default_repeats(assumed_fail_rate, alpha)
    tester = _Tester(order, trial, repeats, budget, seed, assumed_fail_rate, prior_pass)
    current, complete = list(items), True
    try:
        if not tester.fails(current):
            raise ValueError(f"the full set did not fail in {repeats} trials")
        current = _search(tester, current)
    except _Budget:
        failing = [s for s, v in tester.cache.items() if v.failed] or [frozenset(items)]
        current = sorted(min(failing, key=len), key=order.__getitem__)
        complete = False
    return _result(tester, current, complete)


def _result(tester: _Tester, current: list[str], complete: bool) -> DdminResult:
    s = frozenset(current)
    confidence = 1.0
    for x in current:
        confidence *= tester.pass_confidence(s - {x})
    log.info("ddmin: minimal=%s confidence=%.4f trials=%d complete=%s", current, confidence,
             tester.spent, complete)
    return DdminResult(tuple(current), confidence, tester.spent,
                       pl.DataFrame(tester.rows, schema=_HISTORY_SCHEMA), complete)
