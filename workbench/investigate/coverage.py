"""What a sweep covered: one row per planned cell (shape and engine modes), with how much of it
was judged, and the oracle's resolution, so a clean report says what it did not look at.

Invariant: every planned cell has exactly one row; a cell the sweep never started has status
``not run`` and zero counts, never a silent absence.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import polars as pl

from workbench.investigate.bursts import Reproduction
from workbench.investigate.reproduce import Sweep
from workbench.judge import LOGPROB_TOLERANCE


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
