"""What a sweep covered: one row per planned cell (shape and engine modes), with how much of it
was judged, and the oracle's resolution, so a clean report says what it did not look at.

Invariant: every planned cell has exactly one row; a cell the sweep never started has status
``not run`` and zero counts, never a silent absence.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import polars as pl

from workbench.drive.dialects import Feature
from workbench.investigate.bursts import Reproduction
from workbench.investigate.reproduce import Sweep
from workbench.judge import LOGPROB_TOLERANCE
from workbench.judge.features import ORACLES


def column_total(frame: pl.DataFrame, col: str) -> int:
    """The sum of ``col`` over a reproduction's bursts (0 for none)."""
    return int(frame[col].sum()) if len(frame) else 0


class CellStatus(enum.Enum):
    FIRED = "fired"
    CLEAN = "clean"
    NOT_RUN = "not run"


COVERAGE_SCHEMA = {"cell": pl.Utf8, "shape": pl.Utf8, "modes": pl.Utf8, "status": pl.Utf8,
                   "bursts": pl.Int64, "responses": pl.Int64, "flagged": pl.Int64,
                   "drifted": pl.Int64, "judged_rooms": pl.Int64, "buffer_flags": pl.Int64,
                   "anomalies": pl.Int64}
_COUNTS = ("bursts", "responses", "flagged", "drifted", "judged_rooms", "buffer_flags",
           "anomalies")


def _row(cell: str, rep: Reproduction | None, fired: str | None) -> dict:
    shape, *modes = cell.split("+")
    if rep is None:
        counts = dict.fromkeys(_COUNTS, 0)
        status = CellStatus.NOT_RUN
    else:
        b = rep.bursts
        counts = {"bursts": b.height, "responses": column_total(b, "requests"),
                  "flagged": column_total(b, "flagged"), "drifted": column_total(b, "drifted"),
                  "judged_rooms": column_total(b, "judged_rooms"),
                  "buffer_flags": column_total(b, "buffer_flags"), "anomalies": rep.anomalies}
        status = CellStatus.FIRED if cell == fired else CellStatus.CLEAN
    return {"cell": cell, "shape": shape, "modes": ",".join(modes) or "-",
            "status": status.value, **counts}


def coverage_table(sw: Sweep) -> pl.DataFrame:
    """One row per planned cell of ``sw`` (cells run but not planned, e.g. a sweep built by hand,
    are listed too), in plan order."""
    ran = dict(zip(sw.tried, sw.runs, strict=True))
    cells = list(sw.planned) + [c for c in sw.tried if c not in sw.planned]
    return pl.DataFrame([_row(c, ran.get(c), sw.fired) for c in cells], schema=COVERAGE_SCHEMA)


@dataclass(frozen=True)
class Resolution:
    """What the oracle could see in a sweep: greedy tokens and per-token logprobs of
    ``responses`` compared with the single-request reference (a logprob further than
    ``tolerance`` from the reference's is a flag even when the token agrees), and the buffers of
    ``judged_rooms`` rooms compared layer by layer on both sides (``judge`` rooms per burst;
    None: every room)."""

    responses: int
    judged_rooms: int
    judge: int | None
    tolerance: float = LOGPROB_TOLERANCE

    def describe(self) -> str:
        per = "every room" if self.judge is None else f"{self.judge} rooms per burst"
        return (f"oracle: greedy tokens of {self.responses} responses against the reference, "
                f"their logprobs within {self.tolerance:g}; buffers of {self.judged_rooms} "
                f"rooms ({per}) against the reference on both sides")


def resolution(sw: Sweep, judge: int | None) -> Resolution:
    return Resolution(sum(column_total(r.bursts, "requests") for r in sw.runs),
                      sum(column_total(r.bursts, "judged_rooms") for r in sw.runs), judge)


def _requests(sw: Sweep) -> pl.DataFrame:
    frames = [r.requests.select("features", *[f"v_{o}_ok" for o in ORACLES]) for r in sw.runs
              if len(r.requests) and "features" in r.requests.columns]
    return pl.concat(frames) if frames else pl.DataFrame(
        schema={"features": pl.Utf8, **{f"v_{o}_ok": pl.Boolean for o in ORACLES}})


def feature_coverage(sw: Sweep) -> pl.DataFrame:
    """One row per API feature (``Feature``) and per feature oracle: ``kind`` (``feature`` or
    ``oracle``), ``name``, ``requests`` (that used the feature, or that the oracle judged) and
    ``failed`` (oracle rows). A feature with 0 requests was never exercised."""
    df, rows = _requests(sw), []
    used = df["features"].fill_null("").str.split(",")
    for f in Feature:
        rows.append({"kind": "feature", "name": f.value, "failed": None,
                     "requests": int(used.list.contains(f.value).sum()) if len(df) else 0})
    for o in ORACLES:
        col = df[f"v_{o}_ok"]
        rows.append({"kind": "oracle", "name": o, "requests": int(col.is_not_null().sum()),
                     "failed": int((col == False).sum())})  # noqa: E712
    return pl.DataFrame(rows, schema={"kind": pl.Utf8, "name": pl.Utf8, "requests": pl.Int64,
                                      "failed": pl.Int64})


def describe_features(table: pl.DataFrame) -> str:
    """One line: the API features exercised (with counts), the ones never exercised, and each
    feature oracle's judged and failed requests."""
    feats = table.filter(pl.col("kind") == "feature")
    seen = [f"{r['name']} {r['requests']}" for r in feats.iter_rows(named=True) if r["requests"]]
    never = [r["name"] for r in feats.iter_rows(named=True) if not r["requests"]]
    oracles = [f"{r['name']} {r['failed']}/{r['requests']}"
               for r in table.filter(pl.col("kind") == "oracle").iter_rows(named=True)]
    return (f"API features exercised: {', '.join(seen) or 'none (greedy, streamed, to EOS)'}; "
            f"never exercised: {', '.join(never) or 'none'}; feature oracles failed/judged: "
            f"{', '.join(oracles)}")


def render(table: pl.DataFrame) -> str:
    """The coverage table as aligned text lines (for plain-text reports)."""
    head = f"{'cell':40} {'status':8} {'bursts':>6} {'resp':>5} {'flag':>5} {'drift':>5} " \
           f"{'rooms':>5} {'bufs':>5}"
    lines = [head]
    for r in table.iter_rows(named=True):
        lines.append(f"{r['cell'][:40]:40} {r['status']:8} {r['bursts']:>6} {r['responses']:>5} "
                     f"{r['flagged']:>5} {r['drifted']:>5} {r['judged_rooms']:>5} "
                     f"{r['buffer_flags']:>5}")
    return "\n".join(lines)
