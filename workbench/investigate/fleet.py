"""Deployments as actors: a ``Fleet`` keeps up to k PD deployments warm on an ``Executor``, each
for the candidate it was launched from, so the k probes of a bisection round run at once.

A ``Deployment`` owns one pair (prefill, decode, router) and runs bursts on it. On Ray it lives
in an actor that declares its resources (a CPU; a GPU per engine process when the cluster has
GPUs), and its servers die with the actor's process (``die_with_this_process``), which Ray kills
when the driver stops or dies: nothing outlives the search. In process (``workers=1``) it is a
plain object. The oracle (reference buffers) is built where the deployment runs, from the
workbench doing the bisecting, never from the candidate's tree."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.deploy import die_with_this_process, launch_pd_pair
from workbench.drive import Shape
from workbench.investigate.bursts import run_burst
from workbench.judge import JUDGED_ROOMS
from workbench.observe import ReferenceBuffers
from workbench.scale import Executor, Remote

log = logging.getLogger(__name__)
ENGINE_PROCESSES = 2  # a prefill and a decode: one GPU each where the cluster has GPUs


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: ``shape``'s engine, faults and decode flags plus ``patches``, launched
    from ``source`` (a candidate's worktree; None: this checkout). ``judge``: unflagged rooms
    per burst the buffer oracle compares (0: off, None: all). ``bind``: its servers die with
    the process hosting it (set by ``Fleet`` on Ray)."""

    shape: Shape
    patches: tuple[str, ...] = ()
    source: Path | None = None
    log_dir: Path | None = None
    judge: int | None = JUDGED_ROOMS
    bind: bool = False


class Deployment:
    """A running PD pair for one spec; ``trial(seed)`` is one seeded burst of the spec's shape,
    True when it showed any anomaly (flag, unkilled error, leftover after draining)."""

    def __init__(self, spec: DeploymentSpec) -> None:
        if spec.bind:
            die_with_this_process()
        self.spec = spec
        sh = spec.shape
        self.pair = launch_pd_pair(patches=tuple(dict.fromkeys([*spec.patches, *sh.patches])),
                                   engine=sh.engine, faults=sh.faults, log_dir=spec.log_dir,
                                   decode_args=sh.decode_args, source=spec.source)
        self.reference = (ReferenceBuffers(self.pair.spec.engine_config())
                          if spec.judge != 0 else None)

    def trial(self, seed: int) -> bool:
        run = run_burst(self.pair, seed % 1_000_003, self.spec.shape, None, 300.0,
                        judge=self.spec.judge, reference=self.reference)
        log.info("trial %s seed %d: %d anomalies", self.spec.source or ".", seed,
                 run.burst.anomalies)
        return run.burst.anomalies > 0

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.pair.servers() if s.proc is not None]

    def close(self) -> None:
        self.pair.close()


@dataclass
class _Slot:
    candidate: str | None = None
    remote: Remote | None = None
    busy: bool = False
    used: int = 0


@dataclass(eq=False)
class Fleet:
    """Up to ``size`` deployments on ``executor``; ``trial(candidate, seed)`` runs on a free one
    already launched for ``candidate`` if any, else relaunches the least recently used free one
    from ``spec_for(candidate)``. Thread-safe: each trial holds its deployment alone, so
    ``size`` trials (of the same candidate or not) run at once."""

    executor: Executor
    spec_for: Callable[[str], DeploymentSpec]
    size: int = 1
    launches: int = 0
    slots: list[_Slot] = field(default_factory=list)
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _tick: int = 0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a fleet needs at least one deployment, got {self.size}")
        self.slots = [_Slot() for _ in range(self.size)]

    def trial(self, candidate: str, seed: int) -> bool:
        slot = self._acquire(candidate)
        try:
            if slot.candidate != candidate:
                self._relaunch(slot, candidate)
            return bool(slot.remote.call("trial", seed))
        finally:
            with self._cv:
                slot.busy = False
                self._cv.notify_all()

    def _acquire(self, candidate: str) -> _Slot:
        with self._cv:
            self._cv.wait_for(lambda: any(not s.busy for s in self.slots))
            free = [s for s in self.slots if not s.busy]
            slot = next((s for s in free if s.candidate == candidate), None) \
                or min(free, key=lambda s: s.used)
            self._tick += 1
            slot.busy, slot.used = True, self._tick
            return slot

    def _relaunch(self, slot: _Slot, candidate: str) -> None:
        if slot.remote is not None:
            slot.remote.kill()
        slot.candidate, slot.remote = None, None
        spec = self.spec_for(candidate)  # the driver's checkout when no tree is named
        spec = dataclasses.replace(spec, source=spec.source or Path.cwd(),
                                   bind=not self.executor.local)
        gpus = ENGINE_PROCESSES if self.executor.gpus >= ENGINE_PROCESSES else 0
        slot.remote = self.executor.actor(Deployment, spec, cpus=1, gpus=gpus)
        slot.candidate = candidate
        with self._cv:
            self.launches += 1

    def close(self) -> None:
        """Stops every deployment (their servers with them)."""
        for slot in self.slots:
            if slot.remote is not None:
                slot.remote.kill()
            slot.candidate, slot.remote = None, None
