"""What an investigation returns: its ``Outcome``, the ``Diagnosis`` of where the anomaly
arises, and the ``Investigation`` with the claims its measurements support.

Invariants: every outcome (the engine did not start, nothing found, found but not localized,
found and localized) is a value, never an exception; ``findings()`` holds only claims whose
checks hold on the data (a culprit only from a converged bisection, a clean run only with the
number of judged responses and the 95% upper bound on their flag rate).
"""

from __future__ import annotations

import enum
import pickle
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from workbench.drive import wilson
from workbench.investigate.coverage import (
    Resolution,
    column_total,
    coverage_table,
    describe_features,
    feature_coverage,
    render,
    resolution,
)
from workbench.investigate.reproduce import Sweep
from workbench.investigate.spec import InvestigationSpec
from workbench.judge.findings import FindingDraft, TreeState
from workbench.observe import Localization, Stage
from workbench.search import BisectOutcome, BisectResult


class Outcome(enum.Enum):
    LAUNCH_FAILED = "the engine under test did not start"
    NOTHING_FOUND = "nothing found"
    NOT_LOCALIZED = "found, not localized"
    LOCALIZED = "found and localized"


@dataclass(frozen=True)
class Diagnosis:
    """Where the anomaly arises: ``stage`` (the component; None: not localized), ``kind`` (a
    buffer name or an evidence kind), ``detail`` (one sentence), ``basis`` (``"race"``,
    ``"identity"``, ``"buffers"``, ``"tokens"``, ``"failures"``, ``"leftovers"``,
    ``"late_writes"`` or ``"none"``), ``logs``: warning and error lines of the pair's logs around
    the flagged requests, each as ``"file: line"`` (``workbench.observe.logs``)."""

    stage: Stage | None
    kind: str
    detail: str
    basis: str
    logs: tuple[str, ...] = ()

    def describe(self) -> str:
        where = self.stage.name.lower() if self.stage is not None else "not localized"
        return f"{where} ({self.kind}): {self.detail}"


@dataclass(frozen=True)
class Investigation:
    """The outcome of ``investigate``. ``first_flag_s``: sweep start to the first anomalous
    burst's end (None: nothing fired); ``judged``/``flag_upper_95``: the power of a clean run
    (responses judged over every shape and the 95% Wilson upper bound on their flag rate).
    ``tree``: the commit and dirty state of the source tree investigated; ``error``: why the
    engine did not start, or why the bisection failed; ``spec``: what was asked, whole."""

    sweep: Sweep
    diagnosis: Diagnosis
    localizations: tuple[Localization, ...]
    bisection: BisectResult | None
    elapsed_s: float
    outcome: Outcome = Outcome.NOTHING_FOUND
    tree: TreeState = TreeState(None, None)
    error: str = ""
    spec: InvestigationSpec = InvestigationSpec()

    @property
    def patches(self) -> tuple[str, ...]:
        return self.spec.patches

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def confidence(self) -> float:
        """The posterior a culprit must reach."""
        return self.spec.confidence

    @property
    def judge(self) -> int | None:
        """Rooms per burst whose buffers were compared (None: every room)."""
        return self.spec.judge

    @property
    def found(self) -> bool:
        return self.sweep.fired is not None

    @property
    def first_flag_s(self) -> float | None:
        return self.sweep.first_flag_s

    @property
    def judged(self) -> int:
        return sum(column_total(r.bursts, "requests") for r in self.sweep.runs)

    @property
    def judged_rooms(self) -> int:
        return sum(column_total(r.bursts, "judged_rooms") for r in self.sweep.runs)

    @property
    def flag_upper_95(self) -> float:
        return wilson(0, self.judged)[1]

    def coverage(self) -> pl.DataFrame:
        """One row per planned sweep cell: what ran, how much was judged, what did not run."""
        return coverage_table(self.sweep)

    @property
    def resolution(self) -> Resolution:
        return resolution(self.sweep, self.judge)

    def summary(self) -> pl.DataFrame:
        from workbench.investigate.reproduce import rates_table

        return rates_table(list(self.sweep.runs))

    def replay(self) -> dict:
        """What a re-run needs: the whole spec (``InvestigationSpec.from_replay`` reads it), the
        tree, and the shape that fired with its seeds."""
        hit = self.sweep.hit
        return {"spec": self.spec.to_json(), "commit": self.tree.commit, "dirty": self.tree.dirty,
                "shape": self.sweep.fired, "seeds": list(hit.seeds) if hit is not None else []}

    def save(self, path: str | Path) -> Path:
        """Writes this result for ``load`` (a report renders it without running it again)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(self))
        return path

    @staticmethod
    def load(path: str | Path) -> Investigation:
        """The result ``save`` wrote (trusted input: a file this workbench wrote)."""
        inv = pickle.loads(Path(path).read_bytes())
        if not isinstance(inv, Investigation):
            raise TypeError(f"{path} holds a {type(inv).__name__}, not an Investigation")
        return inv

    def findings(self) -> list[FindingDraft]:
        """The claims the data supports, the outcome's first, then the bisection's."""
        out = [_CLAIMS[self.outcome](self)]
        if self.bisection is not None:
            out.append(_bisection_claim(self, self.bisection))
        return [d for d in out if d is not None]

    def report(self) -> str:
        """A plain-text account of every outcome, for a terminal or a file."""
        lines = [f"outcome: {self.outcome.value} ({self.elapsed_s:.0f} s)",
                 f"tree: {self.tree.describe()}; patches: {list(self.patches)}; seed {self.seed}",
                 f"spec: {self.spec}",
                 f"shapes tried: {list(self.sweep.tried)}; fired: {self.sweep.fired}",
                 f"diagnosis: {self.diagnosis.describe()}"]
        lines += [f"  {loc.describe()}" for loc in self.localizations]
        if self.bisection is not None:
            lines.append(f"bisection: {self.bisection.headline()}")
        lines += [f"  log {ln}" for ln in self.diagnosis.logs]
        if self.error:
            lines.append(f"error: {self.error}")
        lines += [f"finding: {d.title}" for d in self.findings()]
        lines += [self.resolution.describe(), describe_features(feature_coverage(self.sweep)),
                  "coverage:", render(self.coverage())]
        return "\n".join(lines)


def _launch_failed(inv: Investigation) -> FindingDraft:
    return FindingDraft(f"the engine under test did not start: {inv.error[:300]}",
                        {"launch failed": bool(inv.error)}, {"error": inv.error})


def _nothing_found(inv: Investigation) -> FindingDraft | None:
    if inv.judged == 0:  # nothing was measured: no claim about the code
        return None
    ran, skipped = [r.shape for r in inv.sweep.runs], list(inv.sweep.not_run)
    untested = f"; not run: {skipped}" if skipped else ""
    return FindingDraft(
        f"no anomaly in {inv.judged} judged responses over {len(ran)} cells {ran} (flag rate "
        f"below {inv.flag_upper_95:.1%} at 95%); {inv.judged_rooms} rooms' buffers compared with "
        f"the reference on both sides{untested}",
        {"responses judged": inv.judged > 0, "no shape fired": inv.sweep.fired is None},
        {"judged": inv.judged, "flag_rate_upper_95": inv.flag_upper_95,
         "judged_rooms": inv.judged_rooms, "shapes_run": ran, "shapes_not_run": skipped})


def _found(inv: Investigation) -> FindingDraft:
    hit, diag = inv.sweep.hit, inv.diagnosis
    where = (f"it arises in {diag.describe()}" if diag.stage is not None
             else "not localized: no evidence beyond the responses themselves")
    checks = {"anomaly reproduced": hit is not None and hit.anomalies > 0}
    if diag.stage is not None:
        checks["localized to a stage"] = True
    return FindingDraft(
        f"shape '{inv.sweep.fired}' reproduces an anomaly in {inv.first_flag_s:.0f} s; {where}",
        checks,
        {"shape": inv.sweep.fired, "diagnosis": diag.describe(), "basis": diag.basis,
         "divergences": [d.describe() for loc in inv.localizations for d in loc.divergences[:3]],
         "reasons": dict(hit.reasons), "left": [d.left for d in hit.drains],
         "logs": list(diag.logs)})


_CLAIMS = {Outcome.LAUNCH_FAILED: _launch_failed, Outcome.NOTHING_FOUND: _nothing_found,
           Outcome.NOT_LOCALIZED: _found, Outcome.LOCALIZED: _found}


def _bisection_claim(inv: Investigation, b: BisectResult) -> FindingDraft:
    evidence = {"posterior": b.confidence, "trials": b.trials_spent, "converged": b.converged,
                "target": inv.confidence, "no_culprit": b.no_culprit_probability,
                "outcome": b.outcome.value}
    if b.outcome in _ENDS:
        return _ends_claim(b, evidence)
    if b.converged and b.culprit is not None and b.confidence >= inv.confidence:
        return FindingDraft(
            f"commit {b.culprit[:12]} introduced it (posterior {b.confidence:.3f} >= "
            f"{inv.confidence}, {b.trials_spent} trials)",
            {"bisection converged": True, "posterior reached the target": True},
            {"culprit": b.culprit, **evidence})
    if b.converged and b.culprit is None:
        return FindingDraft(
            f"bisection found no culprit in the range (P(no culprit) = "
            f"{b.no_culprit_probability:.3f}, {b.trials_spent} trials)",
            {"bisection converged": True}, evidence)
    lead = b.culprit[:12] if b.culprit else "none"
    return FindingDraft(
        f"bisection did not converge in {b.trials_spent} trials: no culprit claimed (leading "
        f"candidate {lead} at posterior {b.confidence:.3f} < {inv.confidence})",
        {"bisection ran": b.trials_spent > 0,
         "posterior below the target": b.confidence < inv.confidence or not b.converged},
        {"leading_candidate": b.culprit, **evidence})


_ENDS = {BisectOutcome.BAD_END_PASSES: (-1, "the bad end {c} did not fail in {n} trials: nothing "
                                            "bisected, no culprit claimed", "bad end never failed"),
         BisectOutcome.GOOD_END_FAILS: (0, "the good end {c} fails too ({f} of {n} trials): the "
                                           "anomaly predates the range, no culprit claimed",
                                        "good end failed")}


def _ends_claim(b: BisectResult, evidence: dict) -> FindingDraft:
    """A bisection stopped by its ends check: which end, and its trials."""
    at, title, check = _ENDS[b.outcome]
    end = list(b.posterior)[at]
    f, n = b.counts().get(end, (0, 0))
    held = n > 0 and (f == 0 if at == -1 else f > 0)
    return FindingDraft(title.format(c=end[:12], f=f, n=n), {check: held},
                        {"end": end, "end_failed": f, "end_trials": n, **evidence})
