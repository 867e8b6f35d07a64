"""What the API-feature oracles measured on a deployment, as a finding that holds whatever they
found (a real engine is recorded as it is): ``feature_findings(load, deployment)``."""

from __future__ import annotations

import polars as pl

from workbench.drive import LoadResult
from workbench.judge import FindingDraft
from workbench.judge.features import ORACLES


def oracle_table(load: LoadResult) -> pl.DataFrame:
    """One row per feature oracle: ``oracle``, ``judged``, ``failed``, ``rate`` (None: none
    judged)."""
    df, rows = load.requests, []
    for name in ORACLES:
        col = df[f"v_{name}_ok"] if f"v_{name}_ok" in df.columns else pl.Series([], dtype=bool)
        judged, failed = int(col.is_not_null().sum()), int((col == False).sum())  # noqa: E712
        rows.append({"oracle": name, "judged": judged, "failed": failed,
                     "rate": failed / judged if judged else None})
    return pl.DataFrame(rows, schema={"oracle": pl.Utf8, "judged": pl.Int64,
                                      "failed": pl.Int64, "rate": pl.Float64})


def feature_findings(load: LoadResult, deployment: str) -> list[FindingDraft]:
    """The oracles' failed/judged counts on ``deployment``, in the title; its checks say only
    that the load was answered and that some oracle judged it (what was found is evidence)."""
    table = oracle_table(load)
    ran = table.filter(pl.col("judged") > 0)
    said = ", ".join(f"{r['oracle']} {r['failed']}/{r['judged']}"
                     for r in ran.iter_rows(named=True))
    never = sorted(set(ORACLES) - set(ran["oracle"]))
    title = (f"{deployment}: feature oracles failed/judged: {said or 'none judged'}"
             + (f"; not applicable: {', '.join(never)}" if never else ""))
    s = load.summary
    return [FindingDraft(title, {"the load's requests were answered": s.completed > 0,
                                 "some feature oracle judged requests": ran.height > 0},
                         {"oracles": table, "requests": s.requests, "completed": s.completed,
                          "errors": s.errors})]
