"""The investigation pipeline: reproduce a failure in seeded bursts or a sweep of shapes, bisect
it over commits or a patch series, and ``investigate`` an unknown bug end to end (studies built
on it live in ``workbench.studies``). Each returns a typed result; an outcome (nothing found,
not localized, not converged, the engine died) is a result, never an exception."""

from workbench.investigate.bursts import Burst, Reproduction, StopOn
from workbench.investigate.claims import culprit_findings, localization_findings
from workbench.investigate.commits import bisect_commits
from workbench.investigate.investigation import diagnose, investigate, localize_flagged
from workbench.investigate.outcome import Diagnosis, Investigation, Outcome
from workbench.investigate.race_claims import (
    control_findings,
    leak_findings,
    parser_findings,
    symptom_findings,
    symptom_table,
)
from workbench.investigate.reproduce import Sweep, rates_table, reproduce, sweep
from workbench.investigate.series import PatchSeries, bisect_patch_series
from workbench.investigate.shrink import ShrinkResult, WitnessRate, shrink, witness_rate
from workbench.investigate.spec import BisectSpec, InvestigationSpec
from workbench.investigate.steps import (
    BUGGY,
    RACE_ENGINE,
    RACE_FAULTS,
    first_flags,
    flagged_requests,
    race_counts,
)

__all__ = ["BUGGY", "RACE_ENGINE", "RACE_FAULTS", "BisectSpec", "Burst", "Diagnosis",
           "Investigation", "InvestigationSpec", "Outcome", "PatchSeries", "Reproduction",
           "ShrinkResult", "StopOn", "Sweep", "WitnessRate",
           "bisect_commits", "bisect_patch_series", "control_findings", "culprit_findings",
           "diagnose", "first_flags", "flagged_requests", "investigate", "leak_findings",
           "localization_findings", "localize_flagged", "parser_findings", "race_counts",
           "rates_table", "reproduce", "shrink", "sweep", "symptom_findings", "symptom_table",
           "witness_rate"]
