"""One spec per kind of run (issue 40): ``wb investigate``'s flags are generated from
``InvestigationSpec`` (no second spelling of a default), the spec survives the ledger, and the
result renders without running again."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.cli.flags import flag
from workbench.cli.parser import build_parser
from workbench.investigate import Investigation, InvestigationSpec
from workbench.investigate.reproduce import Sweep
from workbench.judge import JUDGED_ROOMS, read_findings, record_drafts
from workbench.search import CONFIDENCE


def _investigate_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    return sub.choices["investigate"]


def test_every_flag_default_is_the_specs():
    p = _investigate_parser()
    by_dest = {a.dest: a for a in p._actions}
    for f in dataclasses.fields(InvestigationSpec):
        assert f.name in by_dest, f"no flag for {f.name}"
        assert by_dest[f.name].default == f.default, f.name
        assert any(s.startswith(flag(f.name)) or s == flag(f"no_{f.name}")
                   for s in by_dest[f.name].option_strings), f.name
    assert InvestigationSpec().confidence == CONFIDENCE == 0.95
    assert InvestigationSpec().judge == JUDGED_ROOMS


def test_flags_build_the_spec_they_name():
    args = build_parser().parse_args(
        ["investigate", "--patches", "a,b", "--judge", "all", "--modes", "", "--no-pairs",
         "--commits", "g..b", "--confidence", "0.99", "--cap-s", "30"])
    from workbench.cli.flags import spec_from_args

    spec = spec_from_args(InvestigationSpec, args)
    assert spec == InvestigationSpec(patches=("a", "b"), judge=None, modes=(), pairs=False,
                                     commits="g..b", confidence=0.99, cap_s=30.0)
    assert spec.good_bad == ("g", "b")


def test_bad_values_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="GOOD..BAD"):
        InvestigationSpec(commits="main")
    with pytest.raises(ValueError, match="confidence"):
        InvestigationSpec(confidence=1.5)
    with pytest.raises(SystemExit, match="GOOD..BAD"):
        from workbench.cli.flags import spec_from_args

        spec_from_args(InvestigationSpec, build_parser().parse_args(
            ["investigate", "--commits", "main"]))


def test_the_spec_survives_the_ledger_and_the_result_file(tmp_path):
    spec = InvestigationSpec(patches=("x",), shapes=("baseline",), modes=(), judge=None,
                             seed=7, commits="a..b", runs_dir=str(tmp_path))
    inv = Investigation(Sweep((), (), None, 0.0), _none(), (), None, 1.0, spec=spec)
    assert inv.judge is None and inv.resolution.judge is None
    record_drafts([_draft()], replay=inv.replay(), ledger=tmp_path / "f.jsonl")
    import json

    replay = json.loads(read_findings(tmp_path / "f.jsonl")["replay"][0])
    assert InvestigationSpec.from_replay(replay) == spec
    back = Investigation.load(inv.save(tmp_path / "inv.pickle"))
    assert back.spec == spec and back.report() == inv.report()


def _none():
    from workbench.investigate import Diagnosis

    return Diagnosis(None, "none", "nothing ran", "none")


def _draft():
    from workbench.judge import FindingDraft

    return FindingDraft("a claim", {"holds": True}, {})
