"""The bug zoo (issue 11): every bug variant is found blind, localized, and bisected by commit.

Fast tests check the pieces (histories, diagnosis rules, localization order); the slow ones run
real PD pairs: a CI-sized zoo (bugs the first shape catches, and the fixed control), one commit
bisection over a planted history, and ``wb investigate`` end to end on one zoo bug.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import torch

from engine.core.dump import DumpKey
from engine.patches import PATCHES, ZOO
from workbench.drive import SHAPES, SWEEP_ORDER, Shape
from workbench.investigate import BisectSpec, Investigation, diagnose
from workbench.investigate.bursts import BURST_COLUMNS, Burst, Reproduction, StopOn
from workbench.investigate.commits import Worktrees, bisect_commits, commit_range, git
from workbench.observe import BufferDump
from workbench.observe.evidence import Drain, Evidence, reason_kind
from workbench.observe.localize import Stage, _divergences, _first_token
from workbench.studies.zoo import HARMLESS, plant_history

ROOT = Path(__file__).resolve().parent.parent


def test_the_zoo_has_twelve_bugs_each_described_and_off_by_default():
    assert len(ZOO) >= 12
    for name in ZOO:
        p = PATCHES.get(name)
        assert p.description and p.bug_class and p.mirrors and not p.modifier
    assert {"bf16_index_k", "overlap_schedule"}.isdisjoint(ZOO)
    assert set(SWEEP_ORDER) == set(SHAPES.names())
    with pytest.raises(ValueError):
        Shape("bad", "", sessions=0)


def test_plant_history_puts_one_culprit_in_a_real_git_history(tmp_path):
    hist = plant_history(ROOT, "chunk_prev_token_dropped", tmp_path / "h", commits=6, culprit=3)
    assert commit_range(hist.path, hist.good, hist.bad) == list(hist.commits)
    for i, c in enumerate(hist.commits[1:], start=1):
        files = git(hist.path, "show", "--name-only", "--format=", c).split()
        if i == 3:
            assert files == ["engine/config.py"]
        else:
            assert set(files) <= set(HARMLESS), (i, files)
    truth = json.loads((tmp_path / "h.truth.json").read_text())
    assert truth["culprit"] == hist.culprit == hist.commits[3]
    tree = Worktrees(hist.path, tmp_path / "trees").path(hist.culprit)
    assert '{"chunk_prev_token_dropped"}' in (tree / "engine/config.py").read_text()
    assert "chunk_prev_token_dropped" not in (
        Worktrees(hist.path, tmp_path / "trees").path(hist.good) / "engine/config.py"
    ).read_text().split("PatchSet.parse(self.patches).enabled")[1].splitlines()[0]
    with pytest.raises(ValueError, match="modifier"):
        plant_history(ROOT, "bf16_index_k", tmp_path / "m")
    with pytest.raises(ValueError, match="not an ancestor"):
        commit_range(hist.path, hist.bad, hist.good)


def _rep(shape: str = "baseline", reasons=None, left=None, **burst) -> Reproduction:
    row = Burst(seed=0, requests=10, flagged=1, leaked=0, mismatched=1, dropped=0, **burst)
    frame = pl.DataFrame([row.__dict__], schema=BURST_COLUMNS)
    drains = (Drain(not left, 0.0, left or {}),)
    return Reproduction("v", (), (0,), frame, pl.DataFrame(), (), 0.0, 1.0, {}, {}, shape,
                        reasons or {}, drains, expect_aborts=SHAPES.get(shape).expect_aborts)


def test_diagnose_orders_evidence_from_most_direct():
    assert diagnose(_rep(stale_kv_reads=3), []).stage is Stage.PREFILL
    assert diagnose(_rep(stale_kv_reads=3), []).kind == "kv_read"
    aux = diagnose(_rep(reasons={"aux room N != N": 2, "client abort": 5}), [])
    assert (aux.stage, aux.kind, aux.basis) == (Stage.TRANSFER, "aux", "failures")
    left = diagnose(_rep(left={"decode:stuck_rooms": 4}), [])
    assert (left.stage, left.kind) == (Stage.DECODE, "stuck_rooms")
    timeouts = _rep("peer_pause", reasons={"waiting timeout": 3}, left={"decode:pages_in_use": 9})
    assert diagnose(timeouts, []).basis == "leftovers"  # timeouts are the shape's, not a bug
    late = diagnose(_rep(late_writes=2), [])
    assert (late.stage, late.kind) == (Stage.DECODE, "late_writes")
    assert diagnose(_rep(), []).stage is None


def test_evidence_since_and_reason_kinds():
    a = Evidence({"stale_reads": 1, "stale_sends": 0, "stale_kv_reads": 0, "stale_kv_sends": 0},
                 2, frozenset({("decode", 1, "client abort")}))
    b = Evidence({"stale_reads": 4, "stale_sends": 1, "stale_kv_reads": 2, "stale_kv_sends": 0},
                 5, a.failed | {("decode", 7, "aux room 7 != 9")})
    d = b.since(a)
    assert d.row() == {"stale_reads": 3, "stale_sends": 1, "stale_kv_reads": 2,
                       "stale_kv_sends": 0, "late_writes": 3, "failed_rooms": 1}
    assert d.reasons() == Counter({"aux room N != N": 1}) and reason_kind("x 12") == "x N"
    assert StopOn.ANOMALIES.count(Burst(0, 5, 0, 0, 0, 0, errors=1, leftover=3)) == 2


def _dump(tokens: int, seed: int, output=(5,), num_cached: int = 0) -> BufferDump:
    g = torch.Generator().manual_seed(seed)
    t = {str(DumpKey(layer, name)): torch.randn(tokens, 2, 4, generator=g)
         for layer in range(2) for name in ("k", "v")}
    return BufferDump("x", list(range(tokens)), t, num_cached, tuple(output))


def test_localization_orders_divergences_causally():
    pre, ref = _dump(40, 0), _dump(40, 0)
    dec = BufferDump("d", pre.tokens, {k: v.clone() for k, v in pre.tensors.items()}, 0, (7,))
    dec.tensors["layer1.k"][20] += 1.0  # the transfer corrupted layer 1 at position 20
    pre.tensors["layer1.v"][32] += 1.0  # and the prefill got layer 1 wrong at 32 (a chunk edge)
    ctx = (16, 32)
    divs = sorted(_divergences(Stage.PREFILL, pre.tensors, ref.tensors, 0, 40, ctx, 1e-5)
                  + _divergences(Stage.TRANSFER, dec.tensors, pre.tensors, 0, 40, ctx, 1e-5)
                  + _first_token(pre, dec, 40))
    assert [(d.stage, d.layer, d.buffer) for d in divs] == [
        (Stage.PREFILL, 1, "v"), (Stage.TRANSFER, 0, "aux_first_token"),
        (Stage.TRANSFER, 1, "k"), (Stage.TRANSFER, 1, "v")]
    assert divs[0].chunk_boundary and not divs[0].in_cached_prefix
    assert divs[2].position == 20 and not divs[2].chunk_boundary


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.servers
@pytest.mark.nixl
@pytest.mark.parametrize(("bug", "shape"), [("sender_stale_prefix_pages", "baseline"),
                                            ("late_notification_recreates_room", "slow_transfer")])
def test_ci_zoo_finds_and_localizes_blind(tmp_path, bug, shape):
    from bench.zoo import TRUTH
    from workbench.investigate import investigate

    inv = investigate(patches=[bug], runs_dir=str(tmp_path), shapes=[shape], modes=())
    assert inv.found and inv.sweep.fired == shape, inv.summary()
    assert inv.diagnosis.stage in TRUTH[bug], inv.diagnosis


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.servers
@pytest.mark.nixl
def test_a_bug_of_one_engine_mode_is_found_by_the_cell_that_turns_it_on(tmp_path):
    from bench.zoo import TRUTH
    from workbench.investigate import investigate

    bug = "overlap_future_token_slot_shift"
    inv = investigate(patches=[bug], runs_dir=str(tmp_path), shapes=["baseline"],
                      modes=["overlap", "hicache_off"], pairs=False)
    cov = inv.coverage()
    assert inv.sweep.fired == "baseline+overlap", cov
    assert cov["status"].to_list() == ["clean", "fired", "not run"]
    assert cov["responses"][0] > 0  # the default cell ran and judged, and stayed clean
    assert inv.diagnosis.stage in TRUTH[bug], inv.diagnosis
    assert "coverage:" in inv.report() and "oracle:" in inv.report()


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.servers
@pytest.mark.nixl
def test_fixed_control_has_no_anomaly_on_the_baseline_shape(tmp_path):
    from workbench.investigate import investigate

    inv = investigate(runs_dir=str(tmp_path), shapes=["baseline"], modes=())
    assert not inv.found and inv.judged > 0 and inv.judged_rooms > 0, inv.summary()


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.servers
@pytest.mark.nixl
def test_bisect_commits_names_the_planted_culprit(tmp_path):
    hist = plant_history(ROOT, "chunk_prev_token_dropped", tmp_path / "h", commits=8, seed=1)
    # chunks of 64: every prompt crosses a boundary, so each judged room of a bad commit shows
    # the corruption (with 256, ~1 burst in 5 had a judged prompt long enough; 24 trials did
    # not converge in CI)
    shape = Shape("ci", "3 single-turn sessions, 64-token chunks",
                  {**SHAPES.get("baseline").engine, "chunk_size": 64},
                  sessions=3, turns=1, max_tokens=24)
    spec = BisectSpec(f"{hist.good}..{hist.bad}", hist.path, shape, confidence=0.95,
                      max_trials=24, store=tmp_path / "b.sqlite", worktrees=tmp_path / "trees")
    res = bisect_commits(spec)
    assert res.culprit == hist.culprit and res.converged, res.history
    assert res.spec is spec


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.servers
@pytest.mark.nixl
def test_wb_investigate_end_to_end_on_a_zoo_bug(tmp_path):
    """The CLI runs the investigation (a library call) blind on one bug: it finds, localizes,
    records the finding with the investigated tree's commit and writes its report; ``--judge
    all`` reaches the report's resolution, and ``--report`` renders the result it computed
    (notebook 05 loads it: no second sweep). The spec read back from the ledger replays the
    same verdicts."""
    from workbench.cli import main
    from workbench.investigate import InvestigationSpec, investigate
    from workbench.judge import read_findings

    ledger, runs = tmp_path / "findings.jsonl", tmp_path / "runs"
    main(["investigate", "--patches", "index_k_scale_not_sent", "--shapes", "baseline",
          "--modes", "", "--judge", "all", "--runs-dir", str(runs),
          "--reports-dir", str(tmp_path / "reports"), "--ledger", str(ledger), "--report"])
    text = (tmp_path / "reports" / "investigation.txt").read_text()
    assert "outcome: found and localized" in text and "diagnosis: transfer" in text, text
    assert "every room" in text, text
    found = read_findings(ledger)
    assert found.height == 1 and found["held"].all(), found
    assert found["commit"][0] is not None and found["source"][0] == "wb investigate"
    html = (tmp_path / "reports" / "05_investigation_template.html").read_text()
    assert text.splitlines()[0] in html  # the same elapsed seconds: the result, not a rerun
    assert "every room" in html

    spec = InvestigationSpec.from_replay(json.loads(found["replay"][0]))
    assert spec.judge is None and spec.patches == ("index_k_scale_not_sent",)
    again = investigate(spec, runs_dir=str(tmp_path / "again"))
    first = Investigation.load(runs / "investigation.pickle")
    cols = ["seed", "session", "turn", "flagged", "v_leaked", "v_ref_match"]
    assert again.sweep.fired == first.sweep.fired
    assert again.sweep.hit.requests.select(cols).equals(first.sweep.hit.requests.select(cols))
