"""Timelines: a simulated schedule as lanes per thread, and a bisection trial by trial.

``schedule_timeline(run)`` turns a ``workbench.sim.SimRun``'s decisions into spans (a thread
running over consecutive decisions) per lane, with its context switches (preemptions) marked; for
a shrunk run (``Shrunk.smallest``) those are exactly the switches the failure needs, and the
guided prefix ends where the shrunk schedule stops steering. ``bisection_timeline(result)`` is a
bisection's posterior after every trial with each trial's candidate and outcome; ``BisectionLive``
builds one trial at a time from ``bisect(on_trial=...)``. Each has a static figure (``plot_*``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np

from workbench.search.result import BisectResult, TrialUpdate, short


@dataclass(frozen=True)
class Span:
    """``thread`` ran from decision ``start`` up to (not including) ``stop``."""

    thread: str
    start: int
    stop: int


@dataclass(frozen=True)
class Switch:
    """A preemption at decision ``step``: ``preempted`` could have gone on, ``runs`` was chosen
    (at the seam ``label``, virtual time ``now_us``)."""

    step: int
    preempted: str
    runs: str
    label: str
    now_us: float


@dataclass(frozen=True)
class ScheduleTimeline:
    """Lanes (``engine`` first, then by name) over decisions ``0..decisions``. Invariants: the
    spans of one lane never overlap, all spans tile ``[0, decisions)`` in order, and every switch
    is a preemption of the run (``SimRun.preemptions``) in step order."""

    title: str
    lanes: tuple[str, ...]
    spans: tuple[Span, ...]
    switches: tuple[Switch, ...]
    decisions: int
    guided: int | None = None  # the shrunk schedule steers decisions [0, guided); None: unguided

    def lane(self, thread: str) -> tuple[Span, ...]:
        return tuple(s for s in self.spans if s.thread == thread)

    def window(self, lo: int, hi: int) -> ScheduleTimeline:
        """The part over decisions ``[lo, hi)`` (spans clipped)."""
        spans = tuple(Span(s.thread, max(s.start, lo), min(s.stop, hi)) for s in self.spans
                      if s.stop > lo and s.start < hi)
        return ScheduleTimeline(self.title, self.lanes, spans,
                                tuple(w for w in self.switches if lo <= w.step < hi),
                                self.decisions, self.guided)


def schedule_timeline(run) -> ScheduleTimeline:
    """The timeline of a ``SimRun`` (for a shrunk failure pass ``shrunk.smallest``)."""
    trace = run.trace
    lanes = tuple(sorted({d.thread for d in trace}, key=lambda n: (n != "engine", n)))
    spans, start = [], 0
    for i in range(1, len(trace) + 1):
        if i == len(trace) or trace[i].thread != trace[start].thread:
            spans.append(Span(trace[start].thread, start, i))
            start = i
    switches = tuple(Switch(d.step, d.yielded, d.thread, d.label, round(d.now * 1e6, 1))
                     for d in run.preemptions)
    w = run.workload
    title = (f"seed {run.seed} ({run.strategy}), {w.sessions}x{w.turns}x{w.max_tokens}: "
             f"{len(trace)} decisions, {len(switches)} preemptions"
             f"{', failed' if run.failed else ''}")
    return ScheduleTimeline(title, lanes, tuple(spans), switches, len(trace),
                            None if run.guide is None else len(run.guide))


def plot_schedule_timeline(t: ScheduleTimeline, lo: int = 0, hi: int | None = None):
    """Static rendering of decisions ``[lo, hi)``: a bar per span in its thread's lane, each
    preemption a red marker on the lane it switched to (with a line from the lane it left), the
    decisions past the guided prefix shaded. Returns the Figure."""
    hi = t.decisions if hi is None else hi
    part = t.window(lo, hi)
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(t.lanes) + 1.6))
    colours = plt.get_cmap("tab10")
    for i, lane in enumerate(t.lanes):
        bars = [(s.start, s.stop - s.start) for s in part.lane(lane)]
        ax.broken_barh(bars, (i - 0.35, 0.7), color=colours(i % 10), lw=0)
    for w in part.switches:
        a, b = t.lanes.index(w.preempted), t.lanes.index(w.runs)
        ax.plot([w.step, w.step], [a, b], color="red", lw=0.8)
        ax.plot(w.step, b, "v", color="red", ms=6)
    if t.guided is not None and t.guided < hi:
        ax.axvspan(max(t.guided, lo), hi, color="gray", alpha=0.12, lw=0,
                   label="past the shrunk schedule's guide")
        ax.legend(fontsize=7, loc="upper right")
    ax.set_yticks(range(len(t.lanes)), t.lanes, fontsize=8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(len(t.lanes) - 0.5, -0.5)
    ax.set_xlabel("decision")
    ax.set_title(f"{t.title} (red: context switches)", fontsize=9)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class BisectionTimeline:
    """``posteriors[s]`` is P(candidate is the first bad one) after ``s`` trials (row 0: the
    prior); ``trials[s - 1]`` is trial ``s``: (candidate, failed). Invariant:
    ``len(posteriors) == len(trials) + 1``."""

    candidates: tuple[str, ...]
    posteriors: np.ndarray = field(repr=False, compare=False)
    trials: tuple[tuple[str, bool], ...]
    target: float | None = None

    @property
    def leader(self) -> tuple[str, float]:
        last = self.posteriors[-1]
        return self.candidates[int(np.argmax(last))], float(last.max())


def bisection_timeline(result: BisectResult) -> BisectionTimeline:
    """The timeline of a finished bisection (its ``trace`` and ``history``)."""
    cands = tuple(result.posterior)
    tr = result.trace
    steps = int(tr["step"].max()) + 1 if tr.height else 1
    posts = tr.sort(["step"], maintain_order=True)["probability"].to_numpy()
    posts = posts.reshape(steps, len(cands)) if tr.height else np.full((1, len(cands)),
                                                                       1 / len(cands))
    trials = tuple(zip(result.history["candidate"].to_list(), result.history["failed"].to_list(),
                       strict=True))
    return BisectionTimeline(cands, posts, trials, result.target)


class BisectionLive:
    """Collects a running bisection: pass ``on_trial=live.add`` to ``bisect`` (with the same
    ``allow_no_culprit``); ``timeline()`` is what has happened so far, equal to
    ``bisection_timeline`` of the result once it ends; ``on_update`` (if any) is called after
    every trial."""

    def __init__(self, candidates: Sequence[str], target: float | None = None,
                 on_update=None, allow_no_culprit: bool = False) -> None:
        n = len(candidates)
        self.candidates, self.target, self.on_update = tuple(candidates), target, on_update
        self._posts: list[np.ndarray] = [np.full(n, 1.0 / (n + allow_no_culprit))]  # the prior
        self._trials: list[tuple[str, bool]] = []

    def add(self, update: TrialUpdate) -> None:
        if update.candidate not in self.candidates:
            raise ValueError(f"trial of {update.candidate!r}, not one of the candidates")
        self._posts.append(np.asarray(update.posterior[:len(self.candidates)], dtype=float))
        self._trials.append((update.candidate, update.failed))
        if self.on_update is not None:
            self.on_update(self.timeline())

    def timeline(self) -> BisectionTimeline:
        return BisectionTimeline(self.candidates, np.stack(self._posts), tuple(self._trials),
                                 self.target)


def _label(candidate: str, width: int = 28) -> str:
    """A candidate as an axis shows it: a patch series' candidate by the patch it adds, a
    commit cut to 12 characters, anything else cut to ``width`` from its end."""
    if candidate.startswith("+"):
        return "+" + candidate.rsplit("+", 1)[1]
    text = short(candidate)
    return text if len(text) <= width else "..." + text[3 - width:]


def plot_bisection_timeline(t: BisectionTimeline):
    """Static rendering: the posterior over candidates after the latest trial (left; the prior
    dotted, the target dashed) beside the trial timeline (right: which candidate each trial
    probed, failed in red, passed in green, with the leader's posterior). Returns the Figure."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), width_ratios=(1, 1.4))
    labels = [_label(c) for c in t.candidates]
    x = np.arange(len(labels))
    left.bar(x, t.posteriors[-1], color="tab:blue")
    left.plot(x, t.posteriors[0], ":", color="gray", label="prior")
    if t.target is not None:
        left.axhline(t.target, color="black", ls="--", lw=0.8, label=f"target {t.target}")
    left.set_xticks(x, labels, rotation=25, ha="right", fontsize=7)
    left.set_ylim(0, 1.02)
    left.set_ylabel("P(first bad candidate)")
    left.set_title(f"after {len(t.trials)} trials: {_label(t.leader[0])} leads at "
                   f"{t.leader[1]:.3f}", fontsize=9)
    left.legend(fontsize=7)
    steps = np.arange(1, len(t.trials) + 1)
    ys = [t.candidates.index(c) for c, _ in t.trials]
    right.scatter(steps, ys, c=["tab:red" if f else "tab:green" for _, f in t.trials], s=18)
    right.set_yticks(x, labels, fontsize=7)
    right.set_ylim(len(labels) - 0.5, -0.5)
    right.set_xlabel("trial")
    twin = right.twinx()
    twin.plot(np.arange(len(t.posteriors)), t.posteriors.max(1), color="gray", ls=":")
    twin.set_ylim(0, 1.02)
    twin.set_ylabel("max posterior", fontsize=8)
    fig.tight_layout()
    return fig
