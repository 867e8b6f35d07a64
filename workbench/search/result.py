"""What a bisection returns: the posterior, the trials, its typed ``BisectOutcome`` and an honest
headline (a culprit is named only when the bisection converged)."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field

import polars as pl

CONFIDENCE = 0.95  # the posterior a culprit must reach, unless a run's spec says otherwise


class BisectOutcome(enum.Enum):
    """How a bisection ended. Only ``CONVERGED`` supports naming a culprit (or "no culprit")."""

    CONVERGED = "converged"
    NOT_CONVERGED = "not converged"
    BAD_END_PASSES = "the bad end never failed"
    GOOD_END_FAILS = "the good end fails too"


@dataclass(frozen=True)
class TrialUpdate:
    """What ``bisect(on_trial=...)`` reports after each trial: the ``step``-th trial ran at
    ``candidate`` and ``failed`` or not; ``posterior`` is P(first bad) per candidate after it, in
    candidate order (plus "no culprit" last when the search allows it)."""

    step: int
    candidate: str
    failed: bool
    posterior: tuple[float, ...]


def default_repeats(fail_rate: float = 0.05, alpha: float = 0.05) -> int:
    """Clean trials needed to call a candidate good: ``ceil(log(alpha) / log(1 - p))``.

    This is the smallest r with ``(1 - p)^r <= alpha`` (59 for p = alpha = 0.05).
    """
    if not 0 < fail_rate < 1 or not 0 < alpha < 1:
        return 1
    return max(1, math.ceil(math.log(alpha) / math.log1p(-fail_rate)))


_HASH = re.compile(r"[0-9a-f]{40}")


def short(candidate: str) -> str:
    """A candidate as a headline shows it: a full commit hash cut to 12 characters."""
    return candidate[:12] if _HASH.fullmatch(candidate) else candidate


@dataclass(frozen=True)
class BisectResult:
    """Outcome of a bisection.

    Invariants: ``posterior`` maps every candidate to P(it is the first bad one | trials), and
    ``sum(posterior.values()) + no_culprit_probability == 1`` (up to float rounding);
    ``culprit`` is the most probable hypothesis (``None`` = no culprit) and ``confidence`` its
    posterior, whether or not the search converged: a culprit is *claimed* only when
    ``outcome is BisectOutcome.CONVERGED`` (``claimed``; ``headline()`` says which);
    ``converged == (outcome is CONVERGED)``; ``trials_spent == history.height``.  ``history``
    has one row per trial with columns ``step, candidate, failed, max_posterior, entropy``
    (bits, after that trial).  ``target``: the confidence the search stopped at (None: the
    method has none); ``advice``: what to try when it did not converge (set by the caller that
    knows the knobs, e.g. ``bisect_commits``).  ``rounds``: how many times the search waited
    for trials (one per trial when one runs at a time, one per batch of parallel trials; None:
    the method does not count them), so ``rounds <= trials_spent``. ``spec``: the run's spec.
    """

    culprit: str | None
    posterior: dict[str, float]
    confidence: float
    trials_spent: int
    estimated_fail_rate_bad: float
    estimated_fail_rate_good: float
    history: pl.DataFrame = field(compare=False, repr=False)
    no_culprit_probability: float = 0.0
    converged: bool = True
    method: str = "bayes"
    trace: pl.DataFrame = field(default_factory=pl.DataFrame, compare=False, repr=False)
    """Posterior after every trial, long form: ``step, candidate, probability``."""
    outcome: BisectOutcome | None = None  # None: derived from ``converged``
    target: float | None = None
    advice: tuple[str, ...] = ()
    rounds: int | None = None
    spec: object | None = field(default=None, compare=False)
    """The frozen spec of the run that produced it (e.g. ``BisectSpec``; None: a bare call)."""

    def __post_init__(self) -> None:
        if self.outcome is None:
            derived = BisectOutcome.CONVERGED if self.converged else BisectOutcome.NOT_CONVERGED
            object.__setattr__(self, "outcome", derived)
        if self.converged != (self.outcome is BisectOutcome.CONVERGED):
            raise ValueError(f"converged={self.converged} contradicts outcome {self.outcome}")

    @property
    def claimed(self) -> str | None:
        """The culprit this result supports claiming: ``culprit`` when converged, else None."""
        return self.culprit if self.outcome is BisectOutcome.CONVERGED else None

    def fixed_repeat_bound(self, min_rate: float = 0.05, alpha: float = 0.05) -> tuple[int, int]:
        """What fixed-repeat bisection would pay at most at the estimated bad-side rate (floored
        at ``min_rate``): ``(clean trials per good call, total over log2(candidates) probes)``."""
        per_probe = default_repeats(max(self.estimated_fail_rate_bad, min_rate), alpha)
        return per_probe, per_probe * math.ceil(math.log2(max(2, len(self.posterior))))

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per candidate tried: ``(failed, trials)``, from ``history``."""
        if not self.history.height:
            return {}
        g = self.history.group_by("candidate").agg(pl.col("failed").sum().alias("f"),
                                                   pl.len().alias("n"))
        return {c: (int(f), int(n)) for c, f, n in g.iter_rows()}

    def headline(self, top: int = 5) -> str:
        """An honest account in a few lines: the culprit only when converged; otherwise a line
        starting with "not converged", the ``top`` candidates with their posterior and trial
        counts, the trials spent and ``advice``."""
        first = self.lead()
        if self.outcome is BisectOutcome.CONVERGED:
            return first
        return "\n".join([first, *self.table(top), *(f"  try: {a}" for a in self.advice)])

    def lead(self) -> str:
        """The headline's first line (a culprit only when converged)."""
        return _FIRST[self.outcome](self)

    def table(self, top: int = 5) -> list[str]:
        """The ``top`` most probable candidates, one line each (posterior, failed/trials)."""
        counts = self.counts()
        ranked = sorted(self.posterior.items(), key=lambda kv: -kv[1])[:top]
        lines = [f"  posterior (top {len(ranked)} of {len(self.posterior)} candidates, "
                 f"{self.trials_spent} trials):"]
        for cand, p in ranked:
            f, n = counts.get(cand, (0, 0))
            lines.append(f"    {short(cand):<24} {p:6.3f}   failed {f} of {n}")
        if self.no_culprit_probability:
            lines.append(f"    {'(no culprit)':<24} {self.no_culprit_probability:6.3f}")
        return lines

    def _ends(self) -> tuple[str, str]:
        names = list(self.posterior)
        return short(names[0]), short(names[-1])


def _converged(r: BisectResult) -> str:
    if r.culprit is None:
        return (f"no culprit in the range (P(no culprit) = {r.no_culprit_probability:.3f}, "
                f"{r.trials_spent} trials)")
    target = f" >= {r.target}" if r.target is not None else ""
    return (f"culprit {short(r.culprit)} (posterior {r.confidence:.3f}{target}, "
            f"{r.trials_spent} trials)")


def _not_converged(r: BisectResult) -> str:
    lead = short(r.culprit) if r.culprit else "no culprit"
    target = f" < target {r.target}" if r.target is not None else ""
    return (f"not converged after {r.trials_spent} trials: no culprit claimed (leading "
            f"{lead} at posterior {r.confidence:.3f}{target})")


def _bad_end_passes(r: BisectResult) -> str:
    f, n = r.counts().get(list(r.posterior)[-1], (0, 0))
    return (f"not converged: the bad end {r._ends()[1]} never failed ({f} of {n} trials); "
            "nothing bisected, no culprit claimed")


def _good_end_fails(r: BisectResult) -> str:
    f, n = r.counts().get(list(r.posterior)[0], (0, 0))
    return (f"not converged: the good end {r._ends()[0]} fails too ({f} of {n} trials); the "
            "failure predates the range, no culprit claimed")


_FIRST = {BisectOutcome.CONVERGED: _converged, BisectOutcome.NOT_CONVERGED: _not_converged,
          BisectOutcome.BAD_END_PASSES: _bad_end_passes,
          BisectOutcome.GOOD_END_FAILS: _good_end_fails}
