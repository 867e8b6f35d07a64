"""Commit bisection: which commit between a good and a bad one introduced the failure?

Each candidate commit gets a cached git worktree (``Worktrees``); a trial launches a PD pair from
that tree (``launch_pd_pair(source=...)``), keeps it warm for the candidate's later trials, runs
one seeded burst of a shape and fails when the burst shows an anomaly. The oracle runs in this
process, from this checkout: it is pinned to the tree doing the bisecting, never the code under
test. Trials are stored and resumable like every ``bisect``.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from workbench.deploy import PDPair, launch_pd_pair
from workbench.drive import Shape, cell_of
from workbench.investigate.bursts import run_burst
from workbench.observe import ReferenceBuffers
from workbench.search import BisectOutcome, BisectResult, TrialStore, bisect

log = logging.getLogger(__name__)
BURST_PRIOR = (1.0, 1.0)  # a burst of many requests fails a sizeable fraction of trials
ENDS_BUDGET = 8  # bursts the bad end gets to fail once before anything is bisected


def git(repo: str | Path, *args: str) -> str:
    """Runs ``git -C repo args`` and returns its stripped stdout (CalledProcessError on failure,
    with git's message in ``stderr``)."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def commit_range(repo: str | Path, good: str, bad: str) -> list[str]:
    """Full hashes from ``good`` to ``bad`` along the ancestry path, oldest first, both ends
    included (index 0 is ``good``). Raises ValueError when ``good`` is not an ancestor."""
    g, b = git(repo, "rev-parse", f"{good}^{{commit}}"), git(repo, "rev-parse", f"{bad}^{{commit}}")
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", g, b]).returncode:
        raise ValueError(f"{good} is not an ancestor of {bad}")
    path = git(repo, "rev-list", "--reverse", "--ancestry-path", f"{g}..{b}").split()
    return [g, *path]


@dataclass(eq=False)
class Worktrees:
    """Detached worktrees of ``repo`` under ``root``, one per commit, created on first use and
    kept (a second bisection over the same history reuses them)."""

    repo: Path
    root: Path

    def path(self, commit: str) -> Path:
        full = git(self.repo, "rev-parse", f"{commit}^{{commit}}")
        where = self.root / full[:12]
        if not (where / ".git").exists():
            self.root.mkdir(parents=True, exist_ok=True)
            git(self.repo, "worktree", "add", "--detach", "--force", str(where), full)
        return where

    def remove_all(self) -> None:
        for tree in self.root.glob("*"):
            git(self.repo, "worktree", "remove", "--force", str(tree))
        git(self.repo, "worktree", "prune")


@dataclass(eq=False)
class CommitPairs:
    """Keeps the PD pair of the most recent candidate commit running (warm across its trials).
    ``judge``: unflagged rooms per burst the buffer oracle compares (0: off, None: all)."""

    trees: Worktrees
    shape: Shape
    patches: tuple[str, ...] = ()
    log_dir: Path | None = None
    judge: int | None = 2
    current: str | None = None
    pair: PDPair | None = None
    reference: ReferenceBuffers | None = None
    launches: int = field(default=0)

    def get(self, commit: str) -> PDPair:
        if commit != self.current:
            self.close()
            log_dir = self.log_dir / commit[:12] if self.log_dir else None
            patches = tuple(dict.fromkeys([*self.patches, *self.shape.patches]))
            self.pair = launch_pd_pair(patches=patches, engine=self.shape.engine,
                                       faults=self.shape.faults, log_dir=log_dir,
                                       decode_args=self.shape.decode_args,
                                       source=self.trees.path(commit))
            self.current, self.launches = commit, self.launches + 1
            if self.judge != 0 and self.reference is None:  # pinned: this checkout's reference
                self.reference = ReferenceBuffers(self.pair.spec.engine_config())
        return self.pair

    def close(self) -> None:
        if self.pair is not None:
            self.pair.close()
        self.pair, self.current = None, None


def commit_trial(pairs: CommitPairs):
    """``trial(commit, seed) -> failed``: one seeded burst of the pool's shape on ``commit``;
    failed when it shows any anomaly (flag, unkilled error, leftover after draining)."""
    def trial(commit: str, seed: int) -> bool:
        pair = pairs.get(commit)
        run = run_burst(pair, seed % 1_000_003, pairs.shape, None, 300.0, judge=pairs.judge,
                        reference=pairs.reference)
        log.info("trial %s seed %d: %d anomalies", commit[:12], seed, run.burst.anomalies)
        return run.burst.anomalies > 0
    return trial


def bisect_commits(repo: str | Path, good: str, bad: str, *, shape: str | Shape = "baseline",
                   patches: tuple[str, ...] = (), store: str | Path | None = None,
                   worktrees: str | Path | None = None, confidence: float = 0.95,
                   max_trials: int = 40, seed: int = 0, log_dir: str | Path | None = None,
                   experiment: str | None = None, judge: int | None = 2,
                   ends_budget: int = ENDS_BUDGET) -> BisectResult:
    """Bayesian bisection over the commits ``good..bad`` (``good`` included as candidate 0).
    Candidates are full hashes; ``worktrees`` (default ``<repo>/.git/pdwb-worktrees``) caches
    one tree per commit; ``store`` makes it resumable. ``patches`` are enabled on every
    candidate; ``judge`` is the buffer oracle's rooms per burst (None: all).

    Both ends are tried first, as stored trials that count in the posterior: ``bad`` gets up to
    ``ends_budget`` bursts to fail once (else ``BAD_END_PASSES``, nothing bisected), then
    ``good`` a few (a failure: ``GOOD_END_FAILS``, the anomaly predates the range). Only a
    ``CONVERGED`` result names a culprit; the others carry ``advice`` for their headline."""
    repo = Path(repo).resolve()
    commits = commit_range(repo, good, bad)
    root = Path(worktrees) if worktrees else Path(git(repo, "rev-parse", "--absolute-git-dir")) \
        / "pdwb-worktrees"
    sh = cell_of(shape)
    pairs = CommitPairs(Worktrees(repo, root), sh, tuple(patches),
                        Path(log_dir) if log_dir else None, judge)
    db = TrialStore(store) if store else None
    try:
        res = bisect(commits, commit_trial(pairs), confidence=confidence,
                     max_trials=max_trials, seed=seed, store=db,
                     experiment=experiment or f"commits:{commits[0][:12]}..{commits[-1][:12]}",
                     prior_fail_rate=BURST_PRIOR, ends_budget=ends_budget)
    finally:
        pairs.close()
        if db is not None:
            db.close()
    return dataclasses.replace(res, advice=advice(res, sh, judge, max_trials, ends_budget))


def advice(res: BisectResult, shape: Shape, judge: int | None, max_trials: int,
           ends_budget: int) -> tuple[str, ...]:
    """What to try after a commit bisection that named no culprit (empty when it converged)."""
    more_judge = () if judge is None else (
        f"judge more rooms per burst with the buffer oracle (--judge all; now {judge})",)
    fired = (f"a shape that fires more often (--shape; now {shape.name!r}; wb investigate "
             "names the one that fired first)")
    if res.outcome is BisectOutcome.BAD_END_PASSES:
        return (fired, *more_judge, f"a larger --ends-budget (now {ends_budget})",
                "the patches the failure needs on every candidate (--patches)")
    if res.outcome is BisectOutcome.GOOD_END_FAILS:
        return ("an older good commit: the anomaly is already there at the good end",)
    if res.outcome is BisectOutcome.NOT_CONVERGED:
        return (f"more trials (--max-trials {2 * max_trials}; now {max_trials})", *more_judge,
                fired)
    return ()
