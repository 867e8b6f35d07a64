"""Findings ledger: checked claims, append-only records, typed failures, the ``wb`` listing."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from workbench import read_findings, record_finding
from workbench.cli import main as wb
from workbench.judge import FindingNotSupported


def test_a_held_finding_is_recorded_with_evidence_replay_and_commit(tmp_path):
    ledger = tmp_path / "f.jsonl"
    rates = pl.DataFrame({"variant": ["buggy", "fixed"], "leaked": [3, 0]})
    f = record_finding("buggy leaks, fixed does not",
                       {"buggy leaked": rates["leaked"][0] > 0, "fixed clean": True},
                       evidence={"rates": rates, "rate": np.float64(0.25), "inf": float("inf"),
                                 "rooms": rates["leaked"], "pos": torch.tensor([3, 5]),
                                 "where": tmp_path},
                       replay={"patches": ("a", "b"), "seeds": range(2)}, source="nb01",
                       ledger=ledger)
    assert f.held and f.failed == ()
    assert f.evidence["rates"] == [{"variant": "buggy", "leaked": 3},
                                   {"variant": "fixed", "leaked": 0}]
    assert f.evidence["rate"] == 0.25 and f.evidence["inf"] is None
    assert f.evidence["rooms"] == [3, 0] and f.evidence["pos"] == [3, 5]
    assert f.evidence["where"] == str(tmp_path)
    assert f.replay == {"patches": ["a", "b"], "seeds": [0, 1]}
    assert f.commit and len(f.commit) >= 7  # the tests run inside the git checkout
    record = json.loads(ledger.read_text())
    assert record["title"] == f.title and record["checks"] == f.checks
    assert "[HELD] buggy leaks, fixed does not" in str(f)


def test_an_unsupported_finding_is_recorded_then_raises_naming_the_failed_checks(tmp_path):
    ledger = tmp_path / "f.jsonl"
    record_finding("first", {"ok": True}, ledger=ledger)
    with pytest.raises(FindingNotSupported, match="failed checks: fixed clean") as info:
        record_finding("second", {"buggy leaked": True, "fixed clean": np.bool_(False)},
                       evidence={"fixed leaked": 2}, ledger=ledger)
    assert isinstance(info.value, AssertionError) and info.value.finding.failed == ("fixed clean",)
    df = read_findings(ledger)
    assert df["title"].to_list() == ["first", "second"]  # append-only, in order
    assert df["held"].to_list() == [True, False]
    assert df["failed"].to_list() == [[], ["fixed clean"]]
    assert json.loads(df["evidence"][1]) == {"fixed leaked": 2}


def test_bad_findings_are_rejected_before_anything_is_written(tmp_path):
    ledger = tmp_path / "f.jsonl"
    with pytest.raises(ValueError, match="at least one named check"):
        record_finding("t", {}, ledger=ledger)
    with pytest.raises(TypeError, match="must be a bool, got int"):
        record_finding("t", {"count": 3}, ledger=ledger)
    with pytest.raises(TypeError, match="evidence must be a mapping of name -> value, got Data"):
        record_finding("t", {"ok": True}, evidence=pl.DataFrame({"a": [1]}), ledger=ledger)
    with pytest.raises(ValueError, match="needs a title"):
        record_finding("  ", {"ok": True}, ledger=ledger)
    assert not ledger.exists()
    assert record_finding("no ledger", {"ok": True}, ledger=None).held


def test_a_corrupt_ledger_line_is_a_clear_error(tmp_path):
    ledger = tmp_path / "f.jsonl"
    record_finding("fine", {"ok": True}, ledger=ledger)
    with ledger.open("a") as fh:
        fh.write('{"not": "a finding"}\n')
    with pytest.raises(ValueError, match=r"f.jsonl:2: not a finding record"):
        read_findings(ledger)


def test_wb_findings_lists_the_ledger_and_writes_parquet(tmp_path, caplog):
    ledger, out = tmp_path / "f.jsonl", tmp_path / "f.parquet"
    record_finding("one", {"ok": True}, ledger=ledger)
    with pytest.raises(FindingNotSupported):
        record_finding("two", {"ok": False}, ledger=ledger)
    with caplog.at_level("INFO", logger="wb"):
        wb(["findings", "--ledger", str(ledger), "--out", str(out)])
    assert "2 findings recorded, 1 held, 1 not supported" in caplog.text
    assert pl.read_parquet(out)["title"].to_list() == ["one", "two"]
