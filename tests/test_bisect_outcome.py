"""The outcome of a bisection and its honest headline, on synthetic seeded trials (pure: no
servers): both ends are checked first, a culprit is named only when the search converged."""

from __future__ import annotations

import pytest

from workbench.search import BisectOutcome, BisectResult, TrialStore, bisect

CANDIDATES = [f"c{i:02d}" for i in range(10)]


def flaky(culprit: int | None, rate: float, calls: list | None = None):
    """Candidates at/after ``culprit`` fail with ``rate`` (None: nothing fails), seeded."""
    def trial(candidate: str, seed: int) -> bool:
        if calls is not None:
            calls.append(candidate)
        return culprit is not None and CANDIDATES.index(candidate) >= culprit \
            and (seed >> 10) / 2.0**53 < rate
    return trial


def test_a_bad_end_that_never_fails_stops_before_bisecting_and_names_no_culprit():
    calls: list[str] = []
    res = bisect(CANDIDATES, flaky(None, 0.0, calls), ends_budget=8, max_trials=40)
    assert res.outcome is BisectOutcome.BAD_END_PASSES and not res.converged
    assert calls == ["c09"] * 8 and res.trials_spent == 8 and res.claimed is None
    text = res.headline()
    assert text.startswith("not converged: the bad end c09 never failed (0 of 8 trials)")
    assert "culprit c0" not in text and "posterior (top 5 of 10" in text


def test_a_rare_failure_with_few_trials_is_not_converged_and_shows_the_posterior():
    res = bisect(CANDIDATES, flaky(4, 0.15), ends_budget=40, max_trials=20, seed=2)
    assert res.outcome is BisectOutcome.NOT_CONVERGED and res.trials_spent == 20
    res = BisectResult(**{**res.__dict__, "advice": ("more trials (--max-trials 80)",)})
    lines = res.headline(top=3).splitlines()
    assert lines[0].startswith("not converged after 20 trials: no culprit claimed (leading ")
    assert "< target 0.95" in lines[0] and res.claimed is None
    assert lines[1] == "  posterior (top 3 of 10 candidates, 20 trials):"
    assert len(lines) == 6 and lines[-1] == "  try: more trials (--max-trials 80)"
    top = sorted(res.posterior.values(), reverse=True)[0]
    assert f"{top:6.3f}" in lines[2] and "failed" in lines[2]


def test_a_good_end_that_fails_too_is_reported_not_blamed():
    res = bisect(CANDIDATES, flaky(0, 1.0), ends_budget=8)
    assert res.outcome is BisectOutcome.GOOD_END_FAILS and res.claimed is None
    assert res.history["candidate"].to_list() == ["c09", "c00"]
    assert res.headline().startswith("not converged: the good end c00 fails too (1 of 1 trials)")


def test_a_normal_bisection_names_its_culprit_after_checking_both_ends():
    res = bisect(CANDIDATES, flaky(6, 0.5), ends_budget=8, seed=1)
    assert res.outcome is BisectOutcome.CONVERGED and res.claimed == "c06"
    first = res.history["candidate"].to_list()
    assert first[0] == "c09" and "c00" in first[:10]  # the ends' trials, then the search
    assert res.headline() == (f"culprit c06 (posterior {res.confidence:.3f} >= 0.95, "
                              f"{res.trials_spent} trials)")


def test_the_ends_trials_are_stored_and_replayed_like_any_other(tmp_path):
    with TrialStore(tmp_path / "t.sqlite") as db:
        first = bisect(CANDIDATES, flaky(3, 0.4), ends_budget=8, store=db, seed=5)
        calls: list[str] = []
        again = bisect(CANDIDATES, flaky(3, 0.4, calls), ends_budget=8, store=db, seed=5)
    assert calls == [] and again == first and first.claimed == "c03"


def test_an_outcome_contradicting_converged_is_refused():
    with pytest.raises(ValueError, match="contradicts"):
        BisectResult("c01", {"c01": 1.0}, 1.0, 1, 0.5, 0.0, None, converged=True,
                     outcome=BisectOutcome.NOT_CONVERGED)
    assert BisectResult("c01", {"c01": 1.0}, 1.0, 1, 0.5, 0.0, None,
                        converged=False).outcome is BisectOutcome.NOT_CONVERGED


def test_commit_bisection_advice_names_the_knobs_to_turn():
    from workbench.drive import shape_of
    from workbench.investigate.commits import advice

    kills = shape_of("kills")
    passes = bisect(CANDIDATES, flaky(None, 0.0), ends_budget=8)
    text = " | ".join(advice(passes, kills, 2, 40, 8))
    assert "--judge all; now 2" in text and "--ends-budget (now 8)" in text and "'kills'" in text
    short = bisect(CANDIDATES, flaky(4, 0.15), ends_budget=40, max_trials=20, seed=2)
    text = " | ".join(advice(short, kills, None, 20, 40))
    assert "--max-trials 40; now 20" in text and "--judge" not in text
    done = bisect(CANDIDATES, flaky(6, 0.5), ends_budget=8, seed=1)
    assert advice(done, kills, 2, 40, 8) == ()
