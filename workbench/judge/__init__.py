"""Verdicts: the independent single-request oracle, the symptoms a response shows, which
requests count against the engine, and the findings ledger that records supported claims.

Invariant: a verdict depends only on the request, the response and the reference, never on
which deployment served it; a finding is recorded only with the checks that support it."""

from workbench.judge.findings import (
    FindingDraft,
    FindingNotSupported,
    read_findings,
    record_drafts,
    record_finding,
)
from workbench.judge.oracle import LOGPROB_TOLERANCE, ReferenceOracle, Verdict, judge
from workbench.judge.rules import JUDGED_ROOMS, judge_rooms, unexpected_errors
from workbench.judge.symptoms import Symptom, symptoms

__all__ = ["JUDGED_ROOMS", "LOGPROB_TOLERANCE", "FindingDraft", "FindingNotSupported",
           "ReferenceOracle", "Symptom", "Verdict", "judge", "judge_rooms", "read_findings",
           "record_drafts", "record_finding", "symptoms", "unexpected_errors"]
