"""Reproduce a failure on the code as it is: seeded bursts of one shape, or a sweep of shapes.

``reproduce(patches, shape=...)`` launches a PD pair and runs seeded bursts (seeds ``seed,
seed+1, ...``) until ``stop_after_flags`` counts of ``stop_on`` or ``max_bursts``; replaying the
same ``seeds`` on other code makes a rate difference a difference of code, not of load. Nothing
is enabled unless asked: no patches, and the ``baseline`` shape (no faults). ``sweep`` runs the
cells of ``workbench.drive.modes.plan`` in turn (the shapes of ``SWEEP_ORDER``, then engine modes
alone, then pairs of modes) and stops at the first that fires.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import polars as pl

from workbench.deploy import launch_pd_pair
from workbench.drive import MODE_ORDER, SWEEP_ORDER, LoadConfig, Shape, cell_of, plan, wilson
from workbench.investigate.bursts import (
    BURST_COLUMNS,
    Burst,
    BurstRun,
    Reproduction,
    StopOn,
    run_burst,
)
from workbench.judge import JUDGED_ROOMS
from workbench.observe import ReferenceBuffers

log = logging.getLogger(__name__)


class PairWatch(Protocol):
    """What watches a pair a reproduction launches (``workbench.report.Monitor``)."""

    def watching(self, pair) -> AbstractContextManager: ...

    def record(self, burst: Burst) -> None: ...


def _stop_on(stop_on: StopOn | str) -> StopOn:
    try:
        return StopOn(stop_on)
    except ValueError:
        raise ValueError(f"stop_on must be one of {[s.value for s in StopOn]}, "
                         f"not {stop_on!r}") from None


def reproduce(patches: Sequence[str] = (), *, variant: str | None = None,
              shape: str | Shape = "baseline", sessions: int | None = None,
              turns: int | None = None, max_tokens: int | None = None, seed: int = 0,
              seeds: Sequence[int] | None = None, max_bursts: int | None = 6,
              stop_after_flags: int | None = 1, stop_on: StopOn | str = StopOn.ANOMALIES,
              cap_s: float | None = None, engine: dict | None = None,
              faults: dict | None = None, capture_dir: str | Path | None = None,
              log_dir: str | Path | None = None, router: str = "embedded",
              source: str | Path | None = None, judge: int | None = JUDGED_ROOMS,
              watch: PairWatch | None = None) -> Reproduction:
    """Runs seeded bursts of ``shape`` on a fresh PD pair running ``patches`` (none: the code as
    it is) from ``source`` (a source tree; default this checkout); stops once
    ``stop_after_flags`` counts of ``stop_on`` (``StopOn`` or its value) were seen.

    ``sessions``, ``turns``, ``max_tokens``, ``engine`` and ``faults`` override the shape's.
    ``seeds`` (when given) fixes the bursts exactly and disables early stopping; the first burst
    seed also seeds the router (room numbers), so a replay by ``seeds`` numbers rooms alike.
    ``cap_s`` bounds the run in seconds from the launch start: no burst starts after it, and a
    running burst starts no turn past it. ``max_bursts=None`` (only with ``cap_s``) lets the cap
    alone end the run. ``judge``: unflagged rooms per burst whose buffers are compared with the
    reference on both sides (the buffer-level oracle; 0 turns it off, None judges every
    completed unflagged room). ``watch`` (e.g. ``workbench.report.Monitor()``) watches the pair
    while the bursts run and is told each burst's totals.
    """
    stop_on = _stop_on(stop_on)
    if max_bursts is None and cap_s is None and seeds is None:
        raise ValueError("max_bursts=None needs cap_s (or seeds): the run would never end")
    sh = cell_of(shape)
    sh = dataclasses.replace(sh, **{k: v for k, v in (("sessions", sessions), ("turns", turns),
                                                       ("engine", engine), ("faults", faults))
                                    if v is not None})
    burst_seeds = seeds if seeds is not None else (
        itertools.count(seed) if max_bursts is None else range(seed, seed + max_bursts))
    stop = None if seeds is not None else stop_after_flags
    cap = Path(capture_dir) if capture_dir else None
    t0 = time.monotonic()
    runs: list[BurstRun] = []
    first = None
    with launch_pd_pair(patches=_merged(patches, sh), engine=sh.engine, faults=sh.faults,
                        seed=seeds[0] if seeds else seed, log_dir=log_dir, router=router,
                        decode_args=sh.decode_args, source=source) as pair, \
            (watch.watching(pair) if watch is not None else contextlib.nullcontext()):
        launch_s = time.monotonic() - t0
        reference = ReferenceBuffers(pair.spec.engine_config()) if judge != 0 else None
        for s in burst_seeds:
            left = LoadConfig.duration_s if cap_s is None else cap_s - (time.monotonic() - t0)
            if left <= 0:
                break
            run = run_burst(pair, s, sh, cap, left, max_tokens, judge, reference)
            if watch is not None:
                watch.record(run.burst)
            runs.append(dataclasses.replace(
                run, burst=dataclasses.replace(run.burst, t_s=round(time.monotonic() - t0, 2))))
            if first is None and run.burst.anomalies:
                first = runs[-1].burst.t_s
            if stop is not None and sum(stop_on.count(r.burst) for r in runs) >= stop:
                break
    rep = _reproduction(variant or ("+".join(patches) if patches else "as-is"),
                        _merged(patches, sh), sh, runs, launch_s, first, source)
    return dataclasses.replace(rep, log_dir=str(pair.log_dir))


def _merged(patches: Sequence[str], sh: Shape) -> tuple[str, ...]:
    """The patches under test plus the modifier patches of the shape's modes."""
    return tuple(dict.fromkeys([*patches, *sh.patches]))


def _reproduction(name: str, patches: Sequence[str], sh: Shape, runs: list[BurstRun],
                  launch_s: float, first: float | None, source) -> Reproduction:
    bursts = pl.DataFrame([dataclasses.asdict(r.burst) for r in runs], schema=BURST_COLUMNS)
    frames = [r.requests for r in runs if len(r.requests)]
    requests = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
    reasons = sum((r.reasons for r in runs), Counter())
    return Reproduction(
        variant=name, patches=tuple(patches), seeds=tuple(r.burst.seed for r in runs),
        bursts=bursts, requests=requests, captures=tuple(f for r in runs for f in r.captures),
        launch_s=round(launch_s, 2), first_flag_s=first, engine=dict(sh.engine),
        faults=dict(sh.faults), shape=sh.name, reasons=dict(reasons),
        drains=tuple(r.drain for r in runs), source=str(source) if source else None,
        localizations=tuple(loc for r in runs for loc in r.localizations),
        expect_aborts=sh.expect_aborts)


@dataclass(frozen=True)
class Sweep:
    """The cells tried in order; ``fired`` names the first with an anomaly (None: none did).
    ``runs[i]`` is the reproduction of ``tried[i]``, started ``started_s[i]`` seconds into the
    sweep; ``elapsed_s`` covers launches and bursts. ``planned`` is every cell of the design in
    order (a cell is a shape, possibly in engine modes: ``workbench.drive.modes``); those past
    ``tried`` were not run (the sweep stopped at a hit or ran out of time)."""

    tried: tuple[str, ...]
    runs: tuple[Reproduction, ...]
    fired: str | None
    elapsed_s: float
    started_s: tuple[float, ...] = ()
    planned: tuple[str, ...] = ()

    @property
    def first_flag_s(self) -> float | None:
        """Seconds from the sweep's start to the end of the first anomalous burst."""
        hit = self.hit
        if hit is None or hit.first_flag_s is None:
            return None
        return round(self.started_s[-1] + hit.first_flag_s, 2)

    @property
    def hit(self) -> Reproduction | None:
        return self.runs[-1] if self.fired else None

    @property
    def not_run(self) -> tuple[str, ...]:
        """Planned cells the sweep never started."""
        return tuple(c for c in self.planned if c not in self.tried)


def sweep(patches: Sequence[str] = (), *, shapes: Sequence[str | Shape] = SWEEP_ORDER,
          modes: Sequence[str] = MODE_ORDER, pairs: bool = True, seed: int = 0,
          bursts_per_shape: int = 1, cap_s: float | None = None,
          capture_dir: str | Path | None = None, log_dir: str | Path | None = None,
          source: str | Path | None = None, stop_on: StopOn | str = StopOn.ANOMALIES,
          judge: int | None = JUDGED_ROOMS) -> Sweep:
    """Reproduction mode for an unknown bug: the cells of ``workbench.drive.modes.plan(shapes,
    modes, seed=seed, pairs=pairs)`` in turn (``shapes`` as they are, each mode alone, then
    pairs of modes), a fresh pair each with seeds ``seed..seed+bursts_per_shape-1``, until the
    first anomaly; ``cap_s`` bounds the whole sweep (no cell starts after it); ``judge`` as
    ``reproduce``'s (None: every room)."""
    cells = plan(shapes, modes, seed=seed, pairs=pairs)
    t0, tried, runs, starts = time.monotonic(), [], [], []
    names = tuple(c.name for c in cells)
    for i, sh in enumerate(cells):
        left = None if cap_s is None else cap_s - (time.monotonic() - t0)
        if left is not None and left <= 0:
            break
        starts.append(round(time.monotonic() - t0, 2))
        rep = reproduce(patches, shape=sh, seed=seed, max_bursts=bursts_per_shape, cap_s=left,
                        stop_on=stop_on, log_dir=Path(log_dir) / sh.name if log_dir else None,
                        capture_dir=Path(capture_dir) / sh.name if capture_dir else None,
                        source=source, judge=judge)
        tried.append(sh.name)
        runs.append(rep)
        log.info("sweep cell %d/%d %s: %d anomalies", i + 1, len(cells), sh.name,
                 rep.anomalies)
        if len(rep.bursts) and _stop_on(stop_on).count(_totals(rep)):
            return Sweep(tuple(tried), tuple(runs), sh.name, round(time.monotonic() - t0, 2),
                         tuple(starts), names)
    return Sweep(tuple(tried), tuple(runs), None, round(time.monotonic() - t0, 2), tuple(starts),
                 names)


def _totals(rep: Reproduction) -> Burst:
    sums = {c: int(rep.bursts[c].sum()) for c in rep.bursts.columns if c not in ("seed", "t_s")}
    sums["leftover"] = int((rep.bursts["leftover"] > 0).sum())
    return Burst(seed=rep.seeds[0], **sums)


def rates_table(reps: Sequence[Reproduction]) -> pl.DataFrame:
    """One row per variant: totals, evidence and the flagged fraction with its 95% Wilson
    interval."""
    rows = []
    for rep in reps:
        b = rep.bursts
        n, k = int(b["requests"].sum()), rep.flagged
        lo, hi = wilson(k, n)
        sums = {c: int(b[c].sum()) for c in b.columns if c not in ("seed", "requests", "t_s")}
        rows.append({"variant": rep.variant, "shape": rep.shape, "bursts": b.height,
                     "requests": n, **sums, "undrained_bursts": int((b["leftover"] > 0).sum()),
                     "rate": k / n if n else 0.0, "lo": lo, "hi": hi})
    return pl.DataFrame(rows)
