"""Investigations: reproduce a failure in seeded bursts or a sweep of shapes, bisect it over
commits or a patch series, compare kernels, run a kill storm study, and ``investigate`` an
unknown bug end to end. Each returns a typed result; an outcome (nothing found, not localized,
not converged, the engine died) is a result, never an exception."""

from workbench.investigate.bursts import Burst, Reproduction, StopOn
from workbench.investigate.commits import bisect_commits
from workbench.investigate.investigation import diagnose, investigate
from workbench.investigate.outcome import Diagnosis, Investigation, Outcome
from workbench.investigate.reproduce import Sweep, rates_table, reproduce, sweep
from workbench.investigate.series import PatchSeries, bisect_patch_series
from workbench.investigate.steps import (
    BUGGY,
    RACE_ENGINE,
    RACE_FAULTS,
    first_flags,
    flagged_requests,
    race_counts,
)

__all__ = ["BUGGY", "RACE_ENGINE", "RACE_FAULTS", "Burst", "Diagnosis", "Investigation",
           "Outcome", "PatchSeries", "Reproduction", "StopOn", "Sweep", "bisect_commits",
           "bisect_patch_series", "diagnose", "first_flags", "flagged_requests", "investigate",
           "race_counts", "rates_table", "reproduce", "sweep"]
