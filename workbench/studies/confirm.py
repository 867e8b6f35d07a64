"""Claims of a simulate-then-confirm study (notebook 07): a failing schedule that replays
exactly while the fixed code passes, and a real PD pair showing the same failure."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.judge import FindingDraft


def replay_findings(found, replays: Sequence, fixed) -> list[FindingDraft]:
    """``found``: the first failing ``SimRun`` (or None); ``replays``: ``sim.replay(found)``
    results; ``fixed``: the fixed code's ``Exploration`` over the same kind of schedules."""
    return [FindingDraft(
        "the simulated failure replays exactly and the fixed code passes",
        {"a schedule failed": found is not None and found.flagged > 0,
         "every replay is identical": found is not None and bool(replays)
         and all(a.fingerprint == found.fingerprint for a in replays),
         "fixed code: no failing schedule": not fixed.failures},
        {"seed": getattr(found, "seed", None), "fingerprint": getattr(found, "fingerprint", None),
         "flagged": getattr(found, "flagged", 0), "replays": len(replays),
         "fixed_schedules": len(fixed.runs)})]


def real_pair_findings(real) -> list[FindingDraft]:
    """``real``: a ``Reproduction`` of the same patches on a launched pair."""
    return [FindingDraft("a real PD pair confirms the simulated failure",
                         {"the real pair flags responses": real.flagged > 0},
                         {"bursts": real.bursts})]


def late_write_findings(found, replayed, fixed, real) -> list[FindingDraft]:
    """A simulated PD pair's late write after an abort: ``found`` its failing ``SimRun``,
    ``replayed`` ``sim.replay(found)``, ``fixed`` the fixed code on the same seed, ``real`` a
    ``Reproduction`` on a launched pair."""
    late = int(real.bursts["late_writes"].sum())
    return [FindingDraft(
        "a simulated PD pair finds the late write after an abort; a real pair confirms it",
        {"a schedule wrote late": found is not None and found.evidence.late_writes > 0,
         "its seed replays exactly": found is not None
         and replayed.fingerprint == found.fingerprint,
         "the fixed code passes the same schedule": fixed.anomalies == 0,
         "the real pair writes late too": late > 0},
        {"seed": getattr(found, "seed", None), "sim": str(getattr(found, "evidence", "")),
         "real_late_writes": late})]
