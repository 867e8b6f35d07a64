"""A deterministic scheduler for the engine's own threads: one runs at a time, time is virtual.

Every thread the simulated system starts is a real thread, but it only runs while it holds the
baton. At each seam (``point``, ``sleep``, ``wait_for``, ``get``) the running thread hands the
baton to the thread the strategy picks among the eligible ones (runnable, woken by virtual time,
or whose wait predicate now holds); when none is eligible, virtual time jumps to the earliest
sleeper. Given the same seed, strategy and code, the sequence of decisions is the same, and so is
everything the threads compute: a failing seed fails forever. ``trace`` records every decision.

``quantum`` is the timing uncertainty: a sleeper due within ``quantum`` of now is eligible too
(picked, it moves the clock to its due time), so events that real time would order by a few
microseconds of jitter are ordered by the strategy instead. 0 keeps virtual time exact.
"""

from __future__ import annotations

import math
import queue
import random
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from engine.runtime import Runtime

T = TypeVar("T")


class SimDeadlock(RuntimeError):
    """No thread can ever run again while the main thread has not finished."""


class SimExit(BaseException):
    """Unwinds a parked thread when its simulation is closed (never caught by engine code)."""


@dataclass(frozen=True)
class Decision:
    """The ``step``-th scheduling decision: ``thread`` runs next, at virtual time ``now``;
    ``label`` is the seam the previous thread (``yielded``) yielded at; ``preempted``: it could
    have gone on running and another thread was chosen (a context switch the schedule forced)."""

    step: int
    thread: str
    label: str
    now: float
    yielded: str = ""
    preempted: bool = False


@dataclass(eq=False)
class _Thread:
    name: str
    order: int
    go: threading.Event = field(default_factory=threading.Event)
    wake_at: float | None = None
    pred: Callable[[], bool] | None = None
    done: bool = False


class Strategy:
    """Picks the next thread among the eligible ones (sorted by creation order); ``current`` is
    the thread that yielded (it may or may not be eligible)."""

    def choose(self, eligible: list[_Thread], step: int, current: _Thread) -> _Thread:
        raise NotImplementedError


class Guided(Strategy):
    """Follows a schedule: at step ``i`` the thread named ``choices[i]`` when it is eligible;
    otherwise (a ``None`` choice, an ineligible name, past the end) no preemption: the current
    thread goes on if it can, else the first eligible one. ``Guided(run.trace threads)`` replays
    a run; a guide with fewer names forces fewer context switches."""

    def __init__(self, choices: tuple[str | None, ...]) -> None:
        self.choices = choices

    def choose(self, eligible: list[_Thread], step: int, current: _Thread) -> _Thread:
        want = self.choices[step] if step < len(self.choices) else None
        named = next((t for t in eligible if t.name == want), None) if want else None
        if named is not None:
            return named
        return current if current in eligible else eligible[0]


class RandomWalk(Strategy):
    """Uniform choice at every decision."""

    def __init__(self, seed: int, horizon: int = 0) -> None:
        self.rng = random.Random(f"walk:{seed}")

    def choose(self, eligible: list[_Thread], step: int, current: _Thread) -> _Thread:
        return eligible[self.rng.randrange(len(eligible))]


class PCT(Strategy):
    """Probabilistic concurrency testing (Burckhardt et al.): random distinct thread priorities,
    the highest eligible runs; at ``depth - 1`` random steps in ``[0, horizon)`` the chosen
    thread drops below every other. Finds a bug of depth ``d`` with probability >= 1/(n k^(d-1))
    per schedule, ``k`` being ``horizon``: about one schedule's decisions."""

    def __init__(self, seed: int, horizon: int = 4000, depth: int = 3) -> None:
        if horizon < depth:
            raise ValueError(f"PCT horizon {horizon} must be >= its depth {depth}")
        self.rng = random.Random(f"pct:{seed}")
        self.changes = set(self.rng.sample(range(horizon), depth - 1))
        self.prio: dict[str, float] = {}
        self.low = 0.0

    def choose(self, eligible: list[_Thread], step: int, current: _Thread) -> _Thread:
        for t in eligible:
            self.prio.setdefault(t.name, 1.0 + self.rng.random())
        best = max(eligible, key=lambda t: self.prio[t.name])
        if step in self.changes and len(eligible) > 1:
            self.low -= 1.0
            self.prio[best.name] = self.low
            best = max(eligible, key=lambda t: self.prio[t.name])
        return best


STRATEGIES: dict[str, Callable[[int, int], Strategy]] = {"random": RandomWalk, "pct": PCT}
"""name -> ``factory(seed, horizon)``."""


class SimRuntime(Runtime):
    """The deterministic ``Runtime``; ``run(main)`` simulates until ``main`` returns."""

    def __init__(self, seed: int, strategy: str | Strategy = "random",
                 max_steps: int = 1_000_000, quantum: float = 0.0, horizon: int = 4000) -> None:
        """``strategy``: a name of ``STRATEGIES`` (seeded by ``seed``) or a ``Strategy``."""
        if isinstance(strategy, str) and strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; valid: {sorted(STRATEGIES)}")
        if not 0.0 <= quantum < math.inf:
            raise ValueError(f"quantum must be a finite number of seconds >= 0, not {quantum}")
        self.strategy = (STRATEGIES[strategy](seed, horizon) if isinstance(strategy, str)
                         else strategy)
        self.max_steps = max_steps
        self.quantum = quantum
        self.now = 0.0
        self.trace: list[Decision] = []
        self._threads: list[_Thread] = []
        self._by_ident: dict[int, _Thread] = {}
        self._finished = threading.Event()
        self._closed = False
        self._error: BaseException | None = None
        self._main: _Thread | None = None

    # ---- driving ----
    def run(self, main: Callable[[], None], wall_timeout_s: float = 600.0) -> None:
        """Runs ``main`` (and every thread it starts) to completion; re-raises what ``main``
        raised, ``SimDeadlock`` when nothing can run, ``TimeoutError`` past the wall clock."""
        self._main = self._spawn(main, "main")
        self._main.go.set()
        try:
            if not self._finished.wait(wall_timeout_s):
                raise TimeoutError(f"simulation still running after {wall_timeout_s}s")
            if self._error is not None:
                raise self._error
        finally:
            self._close()

    def _spawn(self, target: Callable[[], None], name: str) -> _Thread:
        taken = {t.name for t in self._threads}
        unique = name if name not in taken else f"{name}#{len(self._threads)}"
        t = _Thread(unique, len(self._threads))
        self._threads.append(t)

        def body() -> None:
            self._by_ident[threading.get_ident()] = t
            t.go.wait()
            t.go.clear()
            if self._closed:  # never started: the simulation ended first
                return
            try:
                target()
            except SimExit:
                return
            except BaseException as exc:  # noqa: BLE001 - reported by run(), not lost
                self._error = self._error or exc
            t.done = True
            if t is self._main or self._error is not None:
                self._finished.set()
                return
            try:
                self._switch(t, f"{t.name} exits", wait=False)
            except SimExit:
                return

        threading.Thread(target=body, name=f"sim-{unique}", daemon=True).start()
        return t

    def _close(self) -> None:
        self._closed = True
        for t in self._threads:
            t.go.set()

    # ---- the baton ----
    def _me(self) -> _Thread | None:
        return self._by_ident.get(threading.get_ident())

    def _eligible(self) -> list[_Thread]:
        out = []
        for t in self._threads:
            if t.done:
                continue
            timed_out = t.wake_at is not None and t.wake_at <= self.now + self.quantum
            if (t.pred is None and (t.wake_at is None or timed_out)) or \
                    (t.pred is not None and (timed_out or t.pred())):
                out.append(t)
        return out

    def _pick(self, me: _Thread) -> tuple[_Thread, bool]:
        """The next thread, and whether choosing it preempted ``me``."""
        eligible = self._eligible()
        if not eligible:
            sleepers = [t.wake_at for t in self._threads if not t.done and t.wake_at is not None]
            if not sleepers:
                raise SimDeadlock(f"no thread can run at t={self.now:.6f}s: "
                                  f"{[t.name for t in self._threads if not t.done]}")
            self.now = min(sleepers)
            eligible = self._eligible()
        nxt = self.strategy.choose(eligible, len(self.trace), me)
        if nxt.wake_at is not None and nxt.wake_at > self.now and \
                (nxt.pred is None or not nxt.pred()):  # due within the quantum: its time comes
            self.now = nxt.wake_at
        return nxt, nxt is not me and me in eligible

    def _switch(self, me: _Thread, label: str, wait: bool = True) -> None:
        if self._closed:  # the simulation ended: nothing may decide (or run) any more
            raise SimExit
        if len(self.trace) >= self.max_steps:
            self._error = self._error or RuntimeError(f"more than {self.max_steps} decisions")
            self._finished.set()
            raise SimExit
        try:
            nxt, preempted = self._pick(me)
        except SimDeadlock as exc:
            self._error = self._error or exc
            self._finished.set()
            raise SimExit from None
        self.trace.append(Decision(len(self.trace), nxt.name, label, self.now, me.name,
                                   preempted))
        if nxt is me:
            return
        nxt.go.set()
        if not wait:
            return
        me.go.wait()
        me.go.clear()
        if self._closed:
            raise SimExit

    # ---- Runtime seams ----
    def start_thread(self, target: Callable[[], None], name: str) -> None:
        self._spawn(target, name)

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now

    def point(self, label: str) -> None:
        me = self._me()
        if me is not None:
            self._switch(me, label)

    def sleep(self, seconds: float) -> None:
        me = self._me()
        if me is None:
            return
        me.wake_at = self.now + max(0.0, seconds)
        try:
            self._switch(me, f"sleep {seconds:.6f}")
        finally:
            me.wake_at = None

    def wait_for(self, cond: threading.Condition | None, predicate: Callable[[], bool],
                 timeout: float) -> bool:
        me = self._me()
        if me is None or predicate():
            return predicate()
        if cond is not None:
            cond.release()
        me.pred = predicate
        me.wake_at = self.now + timeout if math.isfinite(timeout) else None
        try:
            self._switch(me, "wait")
        finally:
            me.pred, me.wake_at = None, None
            if cond is not None:
                cond.acquire()
        return predicate()

    def result(self, fut: Future[T]) -> T:
        self.wait_for(None, fut.done, math.inf)
        return fut.result()

    def get(self, q: queue.Queue[T]) -> T:
        self.wait_for(None, lambda: not q.empty(), math.inf)
        return q.get_nowait()
