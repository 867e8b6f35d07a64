"""Commit bisection: which commit between a good and a bad one introduced the failure?

Each candidate commit gets a cached git worktree (``Worktrees``); a trial runs on a deployment
launched from that tree (``workbench.investigate.fleet``: a PD pair kept warm for the candidate's
later trials, k of them at once with ``deployments=k``), one seeded burst of a shape, and fails
when the burst shows an anomaly. The oracle runs in this
process, from this checkout: it is pinned to the tree doing the bisecting, never the code under
test. Trials are stored and resumable like every ``bisect``.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

from workbench.drive import Shape, cell_of
from workbench.investigate.fleet import DeploymentSpec, Fleet
from workbench.investigate.spec import BisectSpec
from workbench.scale import executor_for
from workbench.search import BisectOutcome, BisectResult, TrialStore, bisect

log = logging.getLogger(__name__)
BURST_PRIOR = (1.0, 1.0)  # a burst of many requests fails a sizeable fraction of trials


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


def bisect_commits(spec: BisectSpec) -> BisectResult:
    """Bayesian bisection of ``spec`` (``BisectSpec``: the range, shape, patches, budgets and
    where it runs); the result keeps ``spec``.

    Both ends are tried first, as stored trials that count in the posterior: ``bad`` gets up to
    ``ends_budget`` bursts to fail once (else ``BAD_END_PASSES``, nothing bisected), then
    ``good`` a few (a failure: ``GOOD_END_FAILS``, the anomaly predates the range). Only a
    ``CONVERGED`` result names a culprit; the others carry ``advice`` for their headline.

    With ``deployments`` k > 1, k pairs run at once (a ``Fleet`` on ``executor_for(workers,
    address)``: Ray actors, or objects here with ``workers=1``); each round of the search then
    runs k probes chosen together. Trials stay in one store, written by this process only."""
    repo = Path(spec.source).resolve()
    commits = commit_range(repo, *spec.good_bad)
    root = Path(spec.worktrees) if spec.worktrees else Path(
        git(repo, "rev-parse", "--absolute-git-dir")) / "pdwb-worktrees"
    sh, trees = cell_of(spec.shape), Worktrees(repo, root)
    logs = Path(spec.log_dir) if spec.log_dir else None

    def spec_for(commit: str) -> DeploymentSpec:
        return DeploymentSpec(sh, spec.patches, trees.path(commit),
                              logs / commit[:12] if logs else None, spec.judge)
    fleet = Fleet(executor_for(spec.workers, spec.address), spec_for, spec.deployments)
    db = TrialStore(spec.store) if spec.store else None
    try:
        res = bisect(commits, fleet.trial, confidence=spec.confidence,
                     max_trials=spec.max_trials, seed=spec.seed, store=db,
                     experiment=spec.experiment or f"commits:{commits[0][:12]}.."
                                                   f"{commits[-1][:12]}",
                     prior_fail_rate=BURST_PRIOR, ends_budget=spec.ends_budget,
                     parallel=spec.deployments)
    finally:
        fleet.close()
        if db is not None:
            db.close()
    return dataclasses.replace(res, spec=spec, advice=advice(res, sh, spec.judge,
                                                             spec.max_trials, spec.ends_budget))


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
