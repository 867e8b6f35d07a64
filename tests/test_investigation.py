"""The investigation's decisions without servers: each outcome is a result with the claims its
data supports (nothing found, found but not localized, localized, a bisection that converged or
did not), recorded in the ledger with the investigated tree's commit; an engine that cannot
start is an outcome, measured on a real launch of a tree that has no engine."""

from __future__ import annotations

import dataclasses
import subprocess
from collections import Counter

import polars as pl
import pytest

from workbench.investigate import (
    Diagnosis,
    Investigation,
    InvestigationSpec,
    Outcome,
    Reproduction,
    Sweep,
    diagnose,
    investigate,
)
from workbench.investigate.bursts import BURST_COLUMNS, Burst
from workbench.judge import read_findings, record_drafts
from workbench.judge.findings import tree_state
from workbench.observe import Stage
from workbench.search import BisectOutcome, BisectResult, bisect


def _rep(shape: str, **burst) -> Reproduction:
    counts = {"flagged": 0, "leaked": 0, "mismatched": 0, "dropped": 0, **burst}
    row = dataclasses.asdict(Burst(seed=0, requests=40, judged_rooms=2, t_s=3.0, **counts))
    return Reproduction(shape, (), (0,), pl.DataFrame([row], schema=BURST_COLUMNS),
                        pl.DataFrame(), (), 1.0, 3.0 if burst else None, {}, {}, shape=shape,
                        reasons=Counter())


def _inv(runs: list[Reproduction], fired: str | None, bisection=None, **kw) -> Investigation:
    sw = Sweep(tuple(r.shape for r in runs), tuple(runs), fired, 9.0,
               tuple(float(i) for i in range(len(runs))))
    hit = sw.hit
    diag = diagnose(hit, []) if hit is not None else Diagnosis(None, "none", "none", "none")
    outcome = (Outcome.NOTHING_FOUND if hit is None else Outcome.LOCALIZED
               if diag.stage is not None else Outcome.NOT_LOCALIZED)
    return Investigation(sw, diag, (), bisection, 9.0, outcome, spec=InvestigationSpec(seed=3),
                         **kw)


def _bisection(culprit: str | None, confidence: float, converged: bool) -> BisectResult:
    return BisectResult(culprit, {"a" * 40: 1 - confidence, "b" * 40: confidence}, confidence,
                        12, 0.4, 0.0, pl.DataFrame(), 0.0, converged)


def test_nothing_found_states_its_power_and_records():
    inv = _inv([_rep("baseline"), _rep("kills")], None)
    [claim] = inv.findings()
    assert inv.outcome is Outcome.NOTHING_FOUND and all(claim.checks.values())
    assert "80 judged responses" in claim.title and f"{inv.flag_upper_95:.1%}" in claim.title
    assert inv.flag_upper_95 == pytest.approx(0.0458, abs=1e-3)  # Wilson, 0 of 80


def test_a_sweep_that_judged_nothing_claims_nothing():
    empty = _inv([], None)
    assert empty.findings() == [] and "nothing found" in empty.report()


def test_found_but_not_localized_is_a_held_claim_not_an_exception(tmp_path):
    inv = _inv([_rep("baseline"), _rep("kills", flagged=2)], "kills")
    assert inv.outcome is Outcome.NOT_LOCALIZED and inv.diagnosis.stage is None
    [claim] = inv.findings()
    assert "not localized" in claim.title and claim.checks == {"anomaly reproduced": True}
    found = record_drafts(inv.findings(), replay=inv.replay(), ledger=tmp_path / "f.jsonl")
    assert found[0].held and read_findings(tmp_path / "f.jsonl")["held"].all()


def test_localized_names_the_stage():
    inv = _inv([_rep("hicache_race", flagged=1, stale_reads=5)], "hicache_race")
    assert inv.outcome is Outcome.LOCALIZED and inv.diagnosis.stage is Stage.PREFILL
    [claim] = inv.findings()
    assert claim.checks == {"anomaly reproduced": True, "localized to a stage": True}
    assert "prefill (index_k_read)" in claim.title


def test_a_culprit_is_claimed_only_from_a_converged_bisection():
    hit = [_rep("baseline", flagged=1)]
    done = _inv(hit, "baseline", _bisection("b" * 40, 0.97, True)).findings()[1]
    assert done.title.startswith("commit bbbbbbbbbbbb introduced it") and all(done.checks.values())
    short = _inv(hit, "baseline", _bisection("b" * 40, 0.70, False)).findings()[1]
    assert "did not converge" in short.title and "no culprit claimed" in short.title
    assert all(short.checks.values()) and short.evidence["converged"] is False
    none = _inv(hit, "baseline", _bisection(None, 0.0, True)).findings()[1]
    assert "no culprit in the range" in none.title and all(none.checks.values())


@pytest.mark.parametrize(("fails", "outcome", "claim"), [
    (False, BisectOutcome.BAD_END_PASSES, "the bad end cccccccccccc did not fail in 8 trials"),
    (True, BisectOutcome.GOOD_END_FAILS, "the good end aaaaaaaaaaaa fails too (1 of 1 trials)")])
def test_a_bisection_stopped_at_an_end_says_so_and_claims_no_culprit(fails, outcome, claim):
    commits = [c * 40 for c in "abc"]
    res = bisect(commits, lambda c, s: fails, ends_budget=8)
    inv = _inv([_rep("baseline", flagged=1)], "baseline", res)
    assert res.outcome is outcome and res.claimed is None
    found = inv.findings()[1]
    assert found.title.startswith(claim) and all(found.checks.values()), found
    report = inv.report()
    assert "bisection: not converged: the " in report and "introduced it" not in report


def test_the_report_shows_the_bisection_headline():
    report = _inv([_rep("baseline", flagged=1)], "baseline",
                  _bisection("b" * 40, 0.70, False)).report()
    assert "bisection: not converged after 12 trials: no culprit claimed" in report
    assert "posterior (top 2 of 2 candidates, 12 trials):" in report
    done = _inv([_rep("baseline", flagged=1)], "baseline", _bisection("b" * 40, 0.97, True))
    assert "bisection: culprit bbbbbbbbbbbb (posterior 0.970, 12 trials)" in done.report()


def test_findings_record_the_investigated_tree_not_the_workbench(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for cmd in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", "-C", str(tree), *cmd], check=True)
    (tree / "f.txt").write_text("one\n")
    subprocess.run(["git", "-C", str(tree), "add", "f.txt"], check=True)
    subprocess.run(["git", "-C", str(tree), "commit", "-qm", "one"], check=True)
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert tree_state(tree).commit == head and tree_state(tree).dirty is False
    (tree / "f.txt").write_text("two\n")
    state = tree_state(tree)
    assert state.dirty is True and "uncommitted" in state.describe()
    inv = _inv([_rep("baseline")], None, tree=state)
    record_drafts(inv.findings(), tree=inv.tree, ledger=tmp_path / "f.jsonl")
    row = read_findings(tmp_path / "f.jsonl").row(0, named=True)
    assert row["commit"] == head and row["dirty"] is True
    assert tree_state(tmp_path).commit is None  # not a git tree


def test_an_engine_that_cannot_start_is_an_outcome(tmp_path):
    """A real launch of a tree without the engine: the servers exit, the sweep stops, and the
    investigation returns LAUNCH_FAILED with the launcher's message and a held claim."""
    inv = investigate(source=str(tmp_path), shapes=["baseline"], modes=(),
                      runs_dir=str(tmp_path / "runs"), cap_s=120)
    assert inv.outcome is Outcome.LAUNCH_FAILED and not inv.found
    assert "engine" in inv.error, inv.error
    [claim] = inv.findings()
    assert claim.title.startswith("the engine under test did not start")
    assert all(claim.checks.values()) and "did not start" in inv.report()
