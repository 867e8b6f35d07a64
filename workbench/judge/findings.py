"""Findings: the claims of an investigation, checked when recorded and kept in a ledger.

``record_finding(title, checks, evidence=..., replay=...)`` evaluates named boolean checks,
appends one JSON line to an append-only ledger (held or not, with the commit, the time, the
numbers behind the claim and what a re-run needs, e.g. patches and seeds), and raises
``FindingNotSupported`` naming the failed checks when any is false, so a notebook re-run that no
longer supports a finding fails at that cell.  ``read_findings(ledger)`` gives the history as a
DataFrame: which findings held, at which commit, on which seeds.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

log = logging.getLogger(__name__)

DEFAULT_LEDGER = Path("runs/findings.jsonl")
MAX_EVIDENCE_ROWS = 20


class FindingNotSupported(AssertionError):
    """A recorded finding whose checks did not all hold (``finding.failed`` names them)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(f"finding not supported: {finding.title!r}; failed checks: "
                         f"{', '.join(finding.failed)}; evidence: {finding.evidence}")
        self.finding = finding


@dataclass(frozen=True)
class Finding:
    """One recorded claim.

    Invariants: ``held == not failed``; ``checks`` maps every check name to its outcome;
    ``evidence`` and ``replay`` hold JSON values only (DataFrames become their first
    ``MAX_EVIDENCE_ROWS`` rows); ``commit`` and ``dirty`` describe the tree the claim is
    about (the ``tree`` passed to ``record_finding``, default the working directory; None
    outside git).
    """

    title: str
    checks: dict[str, bool]
    evidence: dict = field(default_factory=dict)
    replay: dict = field(default_factory=dict)
    source: str = ""
    commit: str | None = None
    recorded_at: str = ""
    dirty: bool | None = None

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(name for name, ok in self.checks.items() if not ok)

    @property
    def held(self) -> bool:
        return not self.failed

    def __str__(self) -> str:
        mark = "HELD" if self.held else "NOT SUPPORTED"
        lines = [f"[{mark}] {self.title}"]
        lines += [f"  {'ok ' if ok else 'NO '} {name}" for name, ok in self.checks.items()]
        lines += [f"  {k} = {v}" for k, v in self.evidence.items()]
        if self.replay:
            lines.append(f"  replay: {json.dumps(self.replay)}")
        return "\n".join(lines)


def jsonable(value):
    """``value`` as plain JSON data: containers recursively, DataFrames as row dicts and
    Series/arrays/tensors as lists (first ``MAX_EVIDENCE_ROWS``), paths and other objects as
    strings, non-finite floats as None."""
    if isinstance(value, pl.DataFrame):
        return jsonable(value.head(MAX_EVIDENCE_ROWS).to_dicts())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset | range):
        return [jsonable(v) for v in value]
    if isinstance(value, pl.Series):
        return jsonable(value.head(MAX_EVIDENCE_ROWS).to_list())
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy / torch arrays and scalars
        value = value.tolist()
        if isinstance(value, list):
            return jsonable(value[:MAX_EVIDENCE_ROWS])
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


@dataclass(frozen=True)
class TreeState:
    """A source tree's HEAD commit (short) and whether it had uncommitted changes; both
    ``None`` outside git."""

    commit: str | None
    dirty: bool | None

    def describe(self) -> str:
        if self.commit is None:
            return "not a git tree"
        return self.commit + (" (with uncommitted changes)" if self.dirty else "")


def _git(path: str | Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def tree_state(path: str | Path = ".") -> TreeState:
    """The commit and dirty state of the git tree at ``path`` (what an investigation ran)."""
    commit = _git(path, "rev-parse", "--short", "HEAD")
    if not commit:
        return TreeState(None, None)
    return TreeState(commit, bool(_git(path, "status", "--porcelain", "--untracked-files=no")))


def _checks(checks: Mapping[str, object]) -> dict[str, bool]:
    if not checks:
        raise ValueError("a finding needs at least one named check")
    out = {}
    for name, ok in checks.items():
        if hasattr(ok, "item") and callable(ok.item):
            ok = ok.item()
        if not isinstance(ok, bool):
            raise TypeError(f"check {name!r} must be a bool, got {type(ok).__name__}: {ok!r}")
        out[str(name)] = ok
    return out


@dataclass(frozen=True)
class FindingDraft:
    """A claim a library computed from its measurements, for ``record_finding``: the notebook
    records it (so the ledger keeps who ran it, with which replay) rather than composing it."""

    title: str
    checks: dict[str, bool]
    evidence: dict


def record_drafts(drafts: list[FindingDraft], *, replay: Mapping | None = None,
                  source: str = "", ledger: str | Path | None = DEFAULT_LEDGER,
                  tree: str | Path | TreeState = ".") -> list[Finding]:
    """``record_finding`` for each draft, in order (the first that does not hold raises)."""
    return [record_finding(d.title, d.checks, evidence=d.evidence, replay=replay, source=source,
                           ledger=ledger, tree=tree) for d in drafts]


def record_finding(title: str, checks: Mapping[str, object], *, evidence: Mapping | None = None,
                   replay: Mapping | None = None, source: str = "",
                   ledger: str | Path | None = DEFAULT_LEDGER,
                   tree: str | Path | TreeState = ".") -> Finding:
    """Checks a finding, appends it to ``ledger`` (``None``: keep no ledger) and returns it.
    ``tree``: the source tree the claim is about (its commit and dirty state are recorded).

    Raises ``FindingNotSupported`` after recording when a check is false, ``ValueError`` for no
    checks, ``TypeError`` for a check that is not a bool.
    """
    if not title.strip():
        raise ValueError("a finding needs a title")
    for name, value in (("evidence", evidence), ("replay", replay)):
        if value is not None and not isinstance(value, Mapping):
            raise TypeError(f"{name} must be a mapping of name -> value, "
                            f"got {type(value).__name__}")
    state = tree if isinstance(tree, TreeState) else tree_state(tree)
    finding = Finding(title, _checks(checks), jsonable(dict(evidence or {})),
                      jsonable(dict(replay or {})), source, state.commit,
                      datetime.now(timezone.utc).isoformat(timespec="seconds"), state.dirty)
    if ledger is not None:
        path = Path(ledger)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(finding)) + "\n")
    log.info("finding %s: %s", "held" if finding.held else "NOT supported", title)
    if not finding.held:
        raise FindingNotSupported(finding)
    return finding


def read_findings(ledger: str | Path = DEFAULT_LEDGER) -> pl.DataFrame:
    """The ledger, one row per record in order: ``recorded_at, title, held, failed, commit,
    dirty, source, checks, evidence, replay`` (the last three as JSON text)."""
    rows = []
    path = Path(ledger)
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            f = Finding(**json.loads(line))
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: not a finding record: {exc}") from exc
        rows.append({"recorded_at": f.recorded_at, "title": f.title, "held": f.held,
                     "failed": list(f.failed), "commit": f.commit, "dirty": f.dirty,
                     "source": f.source,
                     "checks": json.dumps(f.checks), "evidence": json.dumps(f.evidence),
                     "replay": json.dumps(f.replay)})
    return pl.DataFrame(rows, schema={"recorded_at": pl.Utf8, "title": pl.Utf8,
                                      "held": pl.Boolean, "failed": pl.List(pl.Utf8),
                                      "commit": pl.Utf8, "dirty": pl.Boolean,
                                      "source": pl.Utf8, "checks": pl.Utf8,
                                      "evidence": pl.Utf8, "replay": pl.Utf8})
