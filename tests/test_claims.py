"""The library's claims (``FindingDraft``s notebooks record without computing a check): each
holds on the result it describes and fails, with the reason, on one that does not support it."""

from __future__ import annotations

import hashlib

from engine.patches import SEED_RACE
from workbench import sim
from workbench.investigate import PatchSeries, culprit_findings, localization_findings
from workbench.search import bisect
from workbench.studies import confirm


def _uniform(seed: int) -> float:
    return int.from_bytes(hashlib.sha256(str(seed).encode()).digest()[:8], "big") / 2**64


def test_a_series_bisection_blames_the_patch_it_converged_on():
    series = ("a", "b", "c")
    labels = PatchSeries(series).labels()  # base, +a, +a+b, +a+b+c: "b" breaks it

    def trial(candidate: str, seed: int) -> bool:
        return labels.index(candidate) >= 2 and _uniform(seed) < 0.8

    res = bisect(labels, trial, seed=1, confidence=0.95)
    right, = culprit_findings(res, series, 0.95, expected="b")
    assert all(right.checks.values()) and right.evidence["added"] == "b", right
    wrong, = culprit_findings(res, series, 0.95, expected="c")
    assert wrong.checks == {"bisection converged": True, "posterior >= 0.95": True,
                            "culprit adds c": False}


def test_no_localized_room_supports_no_localization_claim():
    where, copy = localization_findings([])
    assert where.title == "first divergence: no room localized"
    assert not any(where.checks.values()) and not any(copy.checks.values())


def test_a_simulated_failure_claim_holds_on_its_replays_and_not_without_them():
    small = sim.Workload(sessions=2)
    found = sim.explore(SEED_RACE, range(4), small, workers=1, progress=False).first_failure
    fixed = sim.explore((), range(2), small, workers=1, stop_on_failure=False, progress=False)
    held, = confirm.replay_findings(found, [sim.replay(found)], fixed)
    assert all(held.checks.values()), held
    unreplayed, = confirm.replay_findings(found, [], fixed)
    assert unreplayed.checks["every replay is identical"] is False
