"""Bisection over the engine's patch series: candidate i enables the first i patches.

A trial launches (or reuses) a PD pair for the candidate, runs a short seeded concurrency burst
and fails when any response differs from the single-request reference (corruption). One pair is
kept warm at a time, so consecutive trials of a candidate cost only the burst. A simulated trial
(``sim=``) runs one deterministic schedule of the candidate instead.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from engine.patches import SEED_STORY
from workbench.deploy import PDPair, launch_pd_pair
from workbench.drive import inject_concurrency
from workbench.drive.shapes import HICACHE, RACE_FAULTS
from workbench.search import CONFIDENCE, BisectOutcome, BisectResult, TrialStore, bisect
from workbench.sim import Workload
from workbench.sim import trial as sim_trial

log = logging.getLogger(__name__)

DEFAULT_SERIES = SEED_STORY
RACE_ENGINE = HICACHE

BURST_PRIOR = (1.0, 1.0)


@dataclass(frozen=True)
class PatchSeries:
    """An ordered patch series; candidate i enables its first i patches.

    Candidates are labelled ``"base"``, ``"+a"``, ``"+a+b"``, ... (the labels bisection and its
    trial store key on); ``patches_of`` and ``added_by`` look a label up, never parse it.
    """

    patches: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(set(self.patches)) != len(self.patches):
            raise ValueError(f"a patch series names each patch once: {self.patches}")

    def labels(self) -> list[str]:
        return ["base"] + ["+" + "+".join(self.patches[: i + 1])
                           for i in range(len(self.patches))]

    def patches_of(self, label: str) -> tuple[str, ...]:
        """The patches candidate ``label`` enables (ValueError for a label not in the series)."""
        return self.patches[: self._index(label)]

    def added_by(self, label: str) -> str | None:
        """The patch candidate ``label`` adds to its predecessor (None for ``"base"``)."""
        i = self._index(label)
        return self.patches[i - 1] if i else None

    def _index(self, label: str) -> int:
        try:
            return self.labels().index(label)
        except ValueError:
            raise ValueError(f"{label!r} is not a candidate of {self.labels()}") from None


def series_candidates(patches: tuple[str, ...] | list[str]) -> list[str]:
    """The candidate labels of ``PatchSeries(patches)``; index 0 is the baseline ``"base"``."""
    return PatchSeries(tuple(patches)).labels()


@dataclass(eq=False)
class PairPool:
    """Keeps the PD pair of the most recent candidate running."""

    engine: dict = field(default_factory=lambda: dict(RACE_ENGINE))
    faults: dict = field(default_factory=lambda: dict(RACE_FAULTS))
    log_dir: Path | None = None
    series: PatchSeries = PatchSeries(DEFAULT_SERIES)
    current: str | None = None
    pair: PDPair | None = None

    def get(self, candidate: str) -> PDPair:
        if candidate != self.current:
            self.close()
            log_dir = self.log_dir / candidate.strip("+") if self.log_dir else None
            self.pair = launch_pd_pair(patches=self.series.patches_of(candidate),
                                       engine=self.engine,
                                       faults=self.faults, log_dir=log_dir)
            self.current = candidate
        return self.pair

    def close(self) -> None:
        if self.pair is not None:
            self.pair.close()
        self.pair, self.current = None, None


def corruption_trial(pool: PairPool, sessions: int = 4, turns: int = 2):
    """``trial(candidate, seed) -> failed``: any reference mismatch in a seeded burst."""
    def trial(candidate: str, seed: int) -> bool:
        res = inject_concurrency(pool.get(candidate), sessions=sessions, turns=turns,
                                 seed=seed % 1_000_003, max_tokens=120, progress=False)
        log.info("trial %s seed %d: %s mismatches of %d", candidate, seed,
                 res.summary.ref_mismatch, res.summary.completed)
        return res.summary.ref_mismatch > 0
    return trial


def bisect_patch_series(series=DEFAULT_SERIES, store: str | Path | None = None,
                        sessions: int = 4, confidence: float = CONFIDENCE, seed: int = 0,
                        max_trials: int = 60, log_dir: str | Path | None = None,
                        experiment: str = "patch-series",
                        prior_fail_rate: tuple[float, float] = BURST_PRIOR,
                        sim: Workload | None = None, ends_budget: int = 0,
                        on_trial=None) -> BisectResult:
    """Bayesian bisection of the cumulative patch series; resumable through ``store``.

    A trial is a burst of many requests, so a bad candidate fails a sizeable fraction of
    trials: the default prior on that rate is flat (``BURST_PRIOR``), not the rare-failure
    prior ``bisect`` defaults to, which would spend several more passes per good candidate.
    With ``sim`` (a ``workbench.sim.Workload``) a trial is one simulated schedule instead of a
    burst on a PD pair: deterministic, so the whole bisection replays from ``seed``.
    ``ends_budget > 0`` first tries the full series (it must fail once in that many trials) and
    the base, as ``bisect`` does; a result that names no culprit carries ``advice``.
    ``on_trial`` is passed to ``bisect`` (a live view, ``workbench.report.timeline``).
    """
    ps = PatchSeries(tuple(series))
    pool = PairPool(log_dir=Path(log_dir) if log_dir else None, series=ps)
    db = TrialStore(store) if store else None
    if sim is None:
        trial = corruption_trial(pool, sessions)
    else:
        simulated = sim_trial(sim)

        def trial(candidate: str, seed: int) -> bool:
            return simulated(ps.patches_of(candidate), seed)
        experiment = f"{experiment}:sim:{sim}"  # never mixed with real trials in one store
    try:
        res = bisect(ps.labels(), trial, confidence=confidence, max_trials=max_trials,
                     seed=seed, store=db, experiment=experiment,
                     prior_fail_rate=prior_fail_rate, ends_budget=ends_budget,
                     on_trial=on_trial)
    finally:
        pool.close()
        if db is not None:
            db.close()
    return dataclasses.replace(res, advice=series_advice(res, sessions, max_trials))


def series_advice(res: BisectResult, sessions: int, max_trials: int) -> tuple[str, ...]:
    """What to try after a patch-series bisection that named no culprit (empty: converged)."""
    if res.outcome is BisectOutcome.BAD_END_PASSES:
        return (f"more sessions per burst (--sessions; now {sessions}) or a larger "
                "--ends-budget: the full series never failed",)
    if res.outcome is BisectOutcome.GOOD_END_FAILS:
        return ("the base fails without any patch of the series: bisect commits instead",)
    if res.outcome is BisectOutcome.NOT_CONVERGED:
        return (f"more trials (--max-trials {2 * max_trials}; now {max_trials})",
                f"more sessions per burst (--sessions; now {sessions})")
    return ()
