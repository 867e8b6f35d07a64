"""Shrinking a simulated failure: the smallest workload and schedule that still fail.

``shrink(failing)`` takes a failing ``workbench.sim.SimRun`` and greedily reduces its workload,
one dimension at a time (sessions, turns, tokens per response): each smaller workload is tried
on the original seed and then on ``tries - 1`` further seeds (a smaller workload is a different
schedule space, so the original seed need not fail there); the first failing one is kept and
the dimension is reduced again. Every schedule stops at its first flag.

Then the schedule itself (``shrink_schedule``): the run is replayed from its decisions as a
guide (``engine.sim.Guided``), the shortest guided prefix that still fails is searched (past it
no thread is preempted), and the preemptions left in that prefix are dropped one by one, latest
first, while the failure stays. What remains are the context switches the failure needs
(``SimRun.preemptions``). The result is a failing ``SimRun`` that replays exactly, like any
other, with the history of every attempt.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

import polars as pl

from workbench.sim.simulation import run
from workbench.sim.workload import SimRun, Workload

log = logging.getLogger(__name__)
DIMENSIONS = ("sessions", "turns", "max_tokens")  # reduced in this order, each to its floor
PREFIX, PREEMPTION = "guided prefix", "preemption dropped"  # the schedule's ShrinkStep dimensions
FLOOR = {"sessions": 1, "turns": 1, "max_tokens": 1}


@dataclass(frozen=True)
class ShrinkStep:
    """One attempt: the workload dimension reduced (or ``PREFIX``: the guided decisions kept,
    ``PREEMPTION``: the decision whose preemption was dropped), its new value, the seed tried,
    whether that schedule failed, and its decision count."""

    dimension: str
    value: int
    seed: int
    failed: bool
    decisions: int


@dataclass(frozen=True)
class Shrunk:
    """``smallest`` fails and is no larger than ``original`` in any dimension."""

    original: SimRun
    smallest: SimRun
    steps: tuple[ShrinkStep, ...]

    @property
    def history(self) -> pl.DataFrame:
        return pl.DataFrame([s.__dict__ for s in self.steps],
                            schema={"dimension": pl.Utf8, "value": pl.Int64, "seed": pl.Int64,
                                    "failed": pl.Boolean, "decisions": pl.Int64})

    def describe(self) -> str:
        a, b = self.original, self.smallest
        return (f"{a.workload.sessions}x{a.workload.turns}x{a.workload.max_tokens} seed {a.seed} "
                f"({len(a.trace)} decisions, {len(a.preemptions)} preemptions) -> "
                f"{b.workload.sessions}x{b.workload.turns}x{b.workload.max_tokens} seed {b.seed} "
                f"({len(b.trace)} decisions{_guided(b)}, {len(b.preemptions)} preemptions) in "
                f"{len(self.steps)} schedules")

    @property
    def schedule(self) -> pl.DataFrame:
        """The context switches the smallest failing run needs: one row per preemption."""
        return pl.DataFrame([{"step": d.step, "at": d.label, "preempted": d.yielded,
                              "runs": d.thread, "now_us": round(d.now * 1e6, 1)}
                             for d in self.smallest.preemptions],
                            schema={"step": pl.Int64, "at": pl.Utf8, "preempted": pl.Utf8,
                                    "runs": pl.Utf8, "now_us": pl.Float64})


def _guided(r: SimRun) -> str:
    return "" if r.guide is None else f", the first {len(r.guide)} guided"


def _smaller(value: int, floor: int, hint: int | None = None) -> list[int]:
    """Candidate values below ``value``, most aggressive first: the floor, a quarter, the
    ``hint``, a half, one less."""
    picks = (floor, value // 4, value // 2, value - 1, *(() if hint is None else (hint,)))
    return sorted({v for v in picks if floor <= v < value})


def _token_hint(failing: SimRun) -> int | None:
    """Tokens enough for every response up to the flag to come out as it did: a flagged
    response needs its tokens up to its first divergence, an unflagged one that ended by itself
    (a tool call the next request builds on) all of its tokens."""
    needs = []
    for r in failing.result.requests.iter_rows(named=True):
        n = len(json.loads(r["token_ids"] or "[]"))
        if r["flagged"]:
            needs.append(n if r["v_first_diff"] is None else r["v_first_diff"] + 1)
        elif r["finish_reason"] != "length":
            needs.append(n)
    return max(needs) if needs else None


def shrink(failing: SimRun, tries: int = 4, max_schedules: int = 200,
           schedule: bool = True) -> Shrunk:
    """Reduces ``failing`` (a run with an anomaly) to a smaller failing run; ``tries`` seeds per
    candidate workload (the original seed first), then (``schedule``) its decisions
    (``shrink_schedule``), at most ``max_schedules`` schedules in all. Raises ValueError when
    ``failing`` did not fail."""
    if not failing.failed:
        raise ValueError("shrink needs a failing run (one with an anomaly)")
    best, steps, tried = failing, [], set()
    for dim in DIMENSIONS:
        improved = True
        while improved and len(steps) < max_schedules:
            improved = False
            hint = _token_hint(best) if dim == "max_tokens" else None
            for value in _smaller(getattr(best.workload, dim), FLOOR[dim], hint):
                got = _first_failing(best, replace(best.workload, **{dim: value}), dim, value,
                                     tries, max_schedules, steps, tried)
                if got is not None:
                    best, improved = got, True
                    break
    if schedule:
        best = _shrink_schedule(best, max_schedules, steps)
    log.info("shrink: %s", Shrunk(failing, best, tuple(steps)).describe())
    return Shrunk(failing, best, tuple(steps))


def shrink_schedule(failing: SimRun, max_schedules: int = 60) -> Shrunk:
    """Reduces the decisions of ``failing`` (same workload and seed): the shortest guided prefix
    that still fails, then as few preemptions in it as still fail. ValueError unless failing."""
    if not failing.failed:
        raise ValueError("shrink_schedule needs a failing run (one with an anomaly)")
    steps: list[ShrinkStep] = []
    best = _shrink_schedule(failing, max_schedules, steps)
    return Shrunk(failing, best, tuple(steps))


def _shrink_schedule(best: SimRun, max_schedules: int, steps: list[ShrinkStep]) -> SimRun:
    def attempt(guide: tuple[str | None, ...], dim: str, value: int) -> SimRun | None:
        if len(steps) >= max_schedules:
            return None
        got = run(best.patches, best.seed, best.workload, best.strategy, True, guide)
        steps.append(ShrinkStep(dim, value, best.seed, got.failed, len(got.trace)))
        return got if got.failed else None

    choices = tuple(d.thread for d in best.trace)
    lo, hi = 0, len(choices)  # the whole guide fails (it replays ``best``)
    while lo < hi and len(steps) < max_schedules:
        mid = (lo + hi) // 2
        got = attempt(choices[:mid], PREFIX, mid)
        if got is not None:
            best, hi = got, mid
        else:
            lo = mid + 1
    guide = list(best.guide or choices[:hi])
    for d in reversed(best.preemptions):
        if d.step >= len(guide) or len(steps) >= max_schedules:
            continue
        trial = tuple(guide[:d.step]) + (None,) + tuple(guide[d.step + 1:])
        got = attempt(trial, PREEMPTION, d.step)
        if got is not None:
            best, guide = got, list(trial)
    return best


def _first_failing(best: SimRun, workload: Workload, dim: str, value: int, tries: int,
                   max_schedules: int, steps: list[ShrinkStep], tried: set) -> SimRun | None:
    for k in range(tries):
        seed = best.seed + k
        key = (*(getattr(workload, d) for d in DIMENSIONS), seed)
        if len(steps) >= max_schedules or key in tried:
            continue
        tried.add(key)
        got = run(best.patches, seed, workload, best.strategy, stop_at_flag=True)
        steps.append(ShrinkStep(dim, value, seed, got.failed, len(got.trace)))
        if got.failed:
            return got
    return None
