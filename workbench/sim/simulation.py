"""Deterministic simulation of an engine, or a PD pair, under load: a seed is one interleaving.

``run(patches, seed, workload)`` builds the system on an ``engine.sim.SimRuntime`` and plays the
same sessions as ``inject_concurrency`` (same transcripts, same conversation rule, greedy) from
client threads of the simulation. One engine (``workbench.sim.single``): HiCache on, so turn 2
loads its prefix back layer by layer. A PD pair (``Workload(pd=True)``, ``workbench.sim.pd``): a
prefill and a decode engine, the transfer layer and bootstrap between them, client kills. Every
place the real system interleaves is a seeded decision: each engine step, each layer of each
forward (a virtual duration, ``Workload.layer_us``), each HiCache layer copy and counter advance,
each WRITE landing and its notification, each prealloc and abort, each dispatch, each client's
submission and kill; injected fault delays are virtual durations. Responses are judged against
``ReferenceOracle`` exactly like a real load, so the result is the same ``LoadResult``, and a PD
run also counts what real mode counts after a burst (``SimRun.evidence``). ``explore`` runs many
seeds, ``replay`` runs one again and checks tokens and decisions are identical, ``trial`` makes a
deterministic bisection/ddmin trial, and ``workbench.sim.shrink`` reduces a failing run.

Not simulated: the HTTP servers, router health checks and peer restarts. Every patch variant is
(``overlap_schedule``'s forward worker is a simulated thread); ``run`` refuses the PD-only ones
on one engine (``SIMULATED``, ``SIMULATED_PD``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

from engine.sim import Guided, SimRuntime
from workbench.drive.concurrency import load_result
from workbench.scale import executor_for
from workbench.sim.pd import PDSimulation
from workbench.sim.single import EngineSimulation
from workbench.sim.workload import DEFAULT_WORKLOAD, SimRun, Workload, check_simulated

log = logging.getLogger(__name__)


def run(patches: Iterable[str] = (), seed: int = 0, workload: Workload = DEFAULT_WORKLOAD,
        strategy: str = "random", stop_at_flag: bool = False,
        guide: tuple[str | None, ...] | None = None) -> SimRun:
    """One schedule of ``workload`` on the code with ``patches``, chosen by ``seed`` and
    ``strategy`` (``"random"`` walk or ``"pct"``), or by ``guide`` when given (``engine.sim.
    Guided``: thread names per decision, no preemption elsewhere; the seed still orders the
    router's dispatch); the same arguments give the same run. With ``stop_at_flag`` no session
    starts a request after the first flagged response. ValueError for a patch variant the
    simulation cannot drive."""
    patches = check_simulated(patches, workload.pd)
    cfg = workload.config(patches)
    sim = SimRuntime(seed, strategy if guide is None else Guided(guide),
                     quantum=workload.time_quantum_us * 1e-6, horizon=workload.pct_horizon)
    system = PDSimulation if workload.pd else EngineSimulation
    state = system(cfg, workload, sim, seed, stop_at_flag)
    t0 = time.perf_counter()
    sim.run(state.main)
    wall = time.perf_counter() - t0
    records = [r for _, r in sorted(state.records, key=lambda x: x[0])]
    tokens = tuple(tuple(r.token_ids or ()) for r in
                   sorted(records, key=lambda r: (r.session, r.turn, r.kind)))
    result = load_result(records, wall)
    return SimRun(patches, seed, strategy, workload, stop_at_flag, result, tuple(sim.trace),
                  tokens, round(wall, 3), round(state.forward_s, 3),
                  state.judge(result.requests), guide)


@dataclass(frozen=True)
class Exploration:
    """Schedules explored in seed order; ``failures`` are the runs with an anomaly (a flagged
    response, an error, a leftover after draining, a late write: ``SimRun.failed``)."""

    runs: tuple[SimRun, ...]

    @property
    def failures(self) -> tuple[SimRun, ...]:
        return tuple(r for r in self.runs if r.failed)

    @property
    def first_failure(self) -> SimRun | None:
        return next(iter(self.failures), None)


def explore(patches: Iterable[str] = (), seeds: Iterable[int] = range(100),
            workload: Workload = DEFAULT_WORKLOAD, strategy: str = "random",
            stop_on_failure: bool = True, progress: bool = True, workers: int | None = None,
            address: str | None = None) -> Exploration:
    """Runs one schedule per seed until one fails (``stop_on_failure``: each schedule also stops
    starting requests at its first flag) or the seeds run out.

    ``workers=1`` runs them here, one after another; otherwise they are Ray tasks
    (``workbench.scale.executor_for``: this machine's cores, or the cluster at ``address``).
    Either way the result is the same: runs in seed order, up to the lowest failing seed."""
    seeds = list(seeds)
    ex = executor_for(workers, address)
    one = partial(_schedule, tuple(patches), workload=workload, strategy=strategy,
                  stop_at_flag=stop_on_failure)
    runs = ex.map(one, seeds, chunk=_chunk(len(seeds), ex.workers), failed=_failed,
                  stop=stop_on_failure, label=f"sim {strategy}" if progress else None,
                  unit="schedules")
    return Exploration(tuple(runs))


def _schedule(patches: tuple[str, ...], seed: int, **kw) -> SimRun:
    return run(patches, seed, **kw)


def _failed(r: SimRun) -> bool:
    return r.failed


def _chunk(seeds: int, workers: int) -> int:
    """Schedules per task: a few tasks per worker balance the load; no more than 8 so a
    search that stops early wastes little."""
    return max(1, min(8, seeds // (4 * workers)))


def replay(original: SimRun) -> SimRun:
    """Runs ``original``'s schedule again; raises ``ReplayDiverged`` unless every decision and
    every token is identical."""
    again = run(original.patches, original.seed, original.workload, original.strategy,
                original.stop_at_flag, original.guide)
    if again.fingerprint != original.fingerprint:
        raise ReplayDiverged(f"seed {original.seed}: {original.fingerprint} then "
                             f"{again.fingerprint}")
    return again


def trial(workload: Workload = DEFAULT_WORKLOAD, strategy: str = "random"):
    """``trial(patches, seed) -> failed``: one simulated schedule of ``workload`` on the code
    with ``patches`` (stopping at its first flag). The same arguments always give the same
    answer, so a bisection or ddmin driven by it is reproducible from its seed alone; it fits
    ``workbench.search.ddmin.ddmin`` directly and ``bisect_patch_series(sim=...)``."""
    def simulated(patches: Iterable[str], seed: int) -> bool:
        got = run(patches, seed, workload, strategy, stop_at_flag=True)
        log.info("sim trial %s seed %d: %d anomalies", sorted(patches), seed, got.anomalies)
        return got.failed
    return simulated


class ReplayDiverged(AssertionError):
    """A replayed schedule differed from the original (a nondeterminism escaped the seams)."""
