"""The bug zoo in a simulated PD pair: each bug is swept blind over real mode's shapes.

Run ``python -m bench.sim_pd [--seeds 3] [--replays 3] [--fixed 2] [--bugs ...]``. For every
``engine.patches.ZOO`` bug, the simulation plays the shapes of
``workbench.drive.shapes.SWEEP_ORDER``
(``Workload.of_shape``: same engine settings, faults as virtual delays, kills, decode queue) with
``--seeds`` schedules each, in order, until a schedule shows an anomaly in real mode's terms
(flagged response, error, leftover after draining, late write); that schedule is replayed
``--replays`` times and must be identical (decisions and tokens). The fixed code runs ``--fixed``
schedules of every shape and must show none. Headline: bugs found / bugs.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from functools import partial

from bench.table import TableRow
from engine.patches import ZOO
from workbench import sim
from workbench.drive import SWEEP_ORDER
from workbench.scale import executor_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FoundRow:
    """One variant explored until a schedule failed; ``where`` and ``seed`` are None when none
    did. ``bench.sim_scale`` reports its variants with the same row."""

    name: str
    where: str | None  # the shape (or workload) of the failing schedule
    seed: int | None
    schedules: int  # schedules run, the failing one included
    seconds: float
    anomaly: str  # what the failing schedule showed
    replays_identical: int
    replays: int

    @property
    def found(self) -> bool:
        return self.seed is not None


@dataclass(frozen=True)
class SimPD:
    rows: tuple[FoundRow, ...]
    fixed_schedules: int
    fixed_failures: int

    @property
    def found(self) -> int:
        return sum(r.found for r in self.rows)

    def table_row(self) -> TableRow:
        secs = sorted(r.seconds for r in self.rows if r.found)
        median = secs[len(secs) // 2] if secs else float("nan")
        replays_ok = all(r.replays_identical == r.replays for r in self.rows)
        measured = (f"{self.found}/{len(self.rows)} zoo bugs found blind in a simulated PD pair "
                    f"(median {median:.1f} s to the failing schedule); failing seeds replayed "
                    f"{'identically' if replays_ok else 'NOT identically'}; fixed code "
                    f"{self.fixed_failures} failing of {self.fixed_schedules} schedules")
        return TableRow("sim_pd", measured, self.found / max(1, len(self.rows)),
                        "zoo bugs found in simulation / bugs")


def describe(run: sim.SimRun) -> str:
    s, ev = run.result.summary, run.evidence
    parts = [f"{s.flagged} flagged" if s.flagged else "", f"{s.errors} errors" if s.errors else "",
             f"{ev.buffer_flags}/{ev.judged_rooms} judged rooms' buffers differ"
             if ev.buffer_flags else "",
             f"left {ev.left}" if ev.left else "",
             f"{ev.late_writes} late writes" if ev.late_writes else ""]
    return ", ".join(p for p in parts if p)


def sweep(bug: str, seeds: int, replays: int) -> FoundRow:
    t0, n = time.perf_counter(), 0
    for shape in SWEEP_ORDER:
        workload = sim.Workload.of_shape(shape)
        for seed in range(seeds):
            n += 1
            got = sim.run((bug,), seed, workload, stop_at_flag=True)
            if got.failed:
                secs = round(time.perf_counter() - t0, 1)
                same = sum(sim.run((bug,), seed, workload, stop_at_flag=True).fingerprint
                           == got.fingerprint for _ in range(replays))
                return FoundRow(bug, shape, seed, n, secs, describe(got), same, replays)
    return FoundRow(bug, None, None, n, round(time.perf_counter() - t0, 1), "", 0, 0)


def fixed_run(cell: tuple[str, int]) -> bool:
    """One fixed-code schedule of a shape: True when it failed (logged)."""
    shape, seed = cell
    got = sim.run((), seed, sim.Workload.of_shape(shape))
    if got.failed:
        log.warning("fixed code failed %s seed %d: %s", shape, seed, describe(got))
    return got.failed


def measure(seeds: int = 3, replays: int = 3, fixed: int = 2,
            bugs: tuple[str, ...] = tuple(ZOO), workers: int | None = None,
            address: str | None = None) -> SimPD:
    """Each bug's sweep and each fixed schedule is one task of ``executor_for(workers,
    address)``; rows come back in ``bugs`` order whatever ran where."""
    ex = executor_for(workers, address)
    rows = ex.map(partial(sweep, seeds=seeds, replays=replays), bugs, label="sim_pd bugs",
                  failed=lambda r: not r.found, flag="not found", unit="bugs")
    cells = [(shape, seed) for shape in SWEEP_ORDER for seed in range(fixed)]
    failed = ex.map(fixed_run, cells, label="sim_pd fixed", failed=bool, unit="schedules")
    return SimPD(tuple(rows), len(cells), sum(failed))


def report(res: SimPD) -> None:
    for r in res.rows:
        where = f"{r.where} seed {r.seed}" if r.found else "not found"
        print(f"{r.name:34s} {where:22s} schedule {r.schedules:2d} {r.seconds:6.1f} s  "
              f"replays {r.replays_identical}/{r.replays}  {r.anomaly}")
    print(f"fixed code: {res.fixed_failures} failing of {res.fixed_schedules} schedules")
    print(res.table_row().measured)


def main(argv: list[str] | None = None) -> SimPD:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="schedules per shape")
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--fixed", type=int, default=2, help="fixed-code schedules per shape")
    ap.add_argument("--bugs", nargs="*", default=list(ZOO))
    ap.add_argument("--workers", type=int, default=None, help="1: in process; default: Ray")
    ap.add_argument("--address", default=None, help="a Ray cluster (default: a local one)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("engine", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    res = measure(args.seeds, args.replays, args.fixed, tuple(args.bugs), args.workers,
                  args.address)
    report(res)
    return res


if __name__ == "__main__":
    main()
