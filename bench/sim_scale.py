"""Simulation at scale: every failing variant replayed 100 times, the fixed code over 10,000
schedules.

Run ``python -m bench.sim_scale [--fixed 10000] [--replays 100] [--workers N] [--address A]``.
In one run, as Ray tasks (one CPU and one torch thread each) on a local cluster of ``--workers``
CPUs (default: this machine's cores) or the cluster at ``--address``:

* every failing patch variant (``CASES``: each ``engine.patches.ZOO`` bug swept blind over real
  mode's shapes in a simulated PD pair, as ``bench.sim_pd``; the index-K race with bf16 index-K
  and with overlap mode on one engine; each ``RARE`` variant under PCT in its
  ``bench.sim_rare.CASES`` workload) is explored until a
  schedule fails, and that seed is replayed ``--replays`` times: each replay must give the same
  decision trace and the same tokens (``SimRun.fingerprint``);
* the fixed code runs ``--fixed`` schedules, cycling over ``FIXED_MIX`` (one engine plain, with
  bf16 index-K and in overlap mode under HiCache load-back delays; a PD pair in each of real
  mode's five shapes, and with a 200 us timing quantum; one engine whose host tier fills) and
  over both strategies (random walk, PCT), seed ``i`` for schedule ``i``. Any anomaly
  (``SimRun.failed``) is a failure; the target is 0.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass

from bench import sim_pd, sim_rare
from bench.sim_pd import FoundRow
from bench.table import TableRow
from engine.patches import RARE, ZOO
from workbench import sim
from workbench.drive import SWEEP_ORDER
from workbench.scale import Executor, Placement

log = logging.getLogger(__name__)
SMALL = sim.Workload(sessions=2, max_tokens=16)
RACE_WORKLOAD = sim.Workload(sessions=2)
EXPLORED: dict[str, tuple[tuple[str, ...], str, sim.Workload]] = {
    "index-K race, bf16": (("bf16_index_k", "hicache_index_k_no_wait"), "random", RACE_WORKLOAD),
    "index-K race, overlap": (("hicache_index_k_no_wait", "overlap_schedule"), "random",
                              RACE_WORKLOAD),
    **{f"{bug} (rare)": ((bug,), "pct", sim_rare.CASES[bug][0]) for bug in RARE},
}
"""Failing cases beyond the zoo: name -> (patches, strategy, workload), explored seed by seed."""
CASES = (*ZOO, *EXPLORED)
FIXED_MIX: tuple[tuple[tuple[str, ...], sim.Workload], ...] = (
    ((), SMALL), (("bf16_index_k",), SMALL), (("overlap_schedule",), SMALL),
    *(((), sim.Workload.of_shape(s, sessions=3, max_tokens=16)) for s in SWEEP_ORDER),
    ((), sim_rare.CASES["prealloc_parked_after_check"][0]),
    ((), sim.Workload(sessions=4, max_tokens=16, engine={  # a full host tier: eviction drops
        "hicache": True, "hicache_offload_on_finish": True, "num_pages": 64,
        "hicache_host_pages": 8})),
)
STRATEGIES = ("random", "pct")


@dataclass(frozen=True)
class FixedChunk:
    schedules: int
    failures: tuple[str, ...]  # "patches workload strategy seed: anomaly" of each failure
    decisions: int
    seconds: float


@dataclass(frozen=True)
class SimScale:
    cases: tuple[FoundRow, ...]
    fixed_schedules: int
    fixed_failures: tuple[str, ...]
    fixed_decisions: int
    wall_s: float

    @property
    def replays_ok(self) -> int:
        return sum(r.found and r.replays_identical == r.replays for r in self.cases)

    def table_row(self) -> TableRow:
        replays = max((r.replays for r in self.cases), default=0)
        measured = (f"{self.replays_ok}/{len(self.cases)} failing variants found, each failing "
                    f"seed replayed {replays} times identically; fixed code "
                    f"{len(self.fixed_failures)} failing of {self.fixed_schedules} schedules "
                    f"({self.fixed_decisions:,} decisions) in {self.wall_s / 60:.0f} min")
        return TableRow("sim_scale", measured, self.replays_ok / max(1, len(self.cases)),
                        "variants found and replayed identically / failing variants")


def _case(name: str, replays: int) -> FoundRow:
    if name in ZOO:
        return sim_pd.sweep(name, seeds=3, replays=replays)
    patches, strategy, workload = EXPLORED[name]
    t0 = time.perf_counter()
    found = sim.explore(patches, seeds=range(1000), workload=workload, strategy=strategy,
                        progress=False, workers=1)  # already one task of the executor
    got = found.first_failure
    if got is None:
        return FoundRow(name, None, None, len(found.runs), round(time.perf_counter() - t0, 1),
                        "", 0, 0)
    same = sum(sim.run(patches, got.seed, got.workload, strategy, True).fingerprint
               == got.fingerprint for _ in range(replays))
    where = "PD pair" if workload.pd else "one engine"
    return FoundRow(name, f"{where} {workload.sessions}x{workload.turns}, {strategy}", got.seed,
                    len(found.runs), round(time.perf_counter() - t0, 1), sim_pd.describe(got),
                    same, replays)


def _fixed(start: int, stop: int) -> FixedChunk:
    t0, failures, decisions = time.perf_counter(), [], 0
    for i in range(start, stop):
        patches, w = FIXED_MIX[i % len(FIXED_MIX)]
        strategy = STRATEGIES[(i // len(FIXED_MIX)) % len(STRATEGIES)]
        got = sim.run(patches, i, w, strategy)
        decisions += len(got.trace)
        if got.failed:
            where = "PD pair" if w.pd else "one engine"
            what = f"{patches} {where} {strategy} seed {i}: {sim_pd.describe(got)}"
            log.warning("fixed code failed: %s", what)
            failures.append(what)
    return FixedChunk(stop - start, tuple(failures), decisions, time.perf_counter() - t0)


def _task(task: tuple) -> FoundRow | FixedChunk:
    kind, *args = task
    return _case(*args) if kind == "case" else _fixed(*args)


def _init() -> None:
    import torch
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("engine", "httpx", "workbench"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _task_failed(got: FoundRow | FixedChunk) -> bool:
    return not got.found if isinstance(got, FoundRow) else bool(got.failures)


def measure(fixed: int = 10_000, replays: int = 100, workers: int | None = None,
            cases: tuple[str, ...] = CASES, chunk: int = 200,
            address: str | None = None) -> SimScale:
    """Every case and every ``chunk`` of fixed schedules is one task on ``Placement(workers,
    address)`` (default: a local Ray cluster of this machine's cores, stopped after)."""
    t0 = time.perf_counter()
    tasks = [("case", c, replays) for c in cases]
    tasks += [("fixed", s, min(fixed, s + chunk)) for s in range(0, fixed, chunk)]
    with Executor(Placement(workers, address)) as ex:
        done = ex.map(_task, tasks, label="sim_scale", unit="tasks", flag="failing",
                      failed=_task_failed)
    rows = [g for g in done if isinstance(g, FoundRow)]
    chunks = [g for g in done if isinstance(g, FixedChunk)]
    return SimScale(tuple(rows), sum(c.schedules for c in chunks),
                    tuple(f for c in chunks for f in c.failures),
                    sum(c.decisions for c in chunks), time.perf_counter() - t0)


def report(res: SimScale) -> None:
    for r in res.cases:
        where = f"{r.where} seed {r.seed}" if r.found else "NOT FOUND"
        print(f"{r.name:34s} {where:34s} schedule {r.schedules:3d}  replays "
              f"{r.replays_identical}/{r.replays}  {r.seconds:6.1f} s  {r.anomaly}")
    print(f"fixed code: {len(res.fixed_failures)} failing of {res.fixed_schedules} schedules, "
          f"{res.fixed_decisions:,} decisions")
    for f in res.fixed_failures:
        print(f"  {f}")
    print(res.table_row().measured)


def main(argv: list[str] | None = None) -> SimScale:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixed", type=int, default=10_000)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--workers", type=int, default=None, help="1: in process; default: Ray")
    ap.add_argument("--address", default=None, help="a Ray cluster (default: a local one)")
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    args = ap.parse_args(argv)
    _init()
    res = measure(args.fixed, args.replays, args.workers, tuple(args.cases),
                  address=args.address)
    report(res)
    return res


if __name__ == "__main__":
    main()
