"""Deterministic simulation vs real mode on the HiCache index-K race.

Run ``python -m bench.sim [--fixed 200] [--replays 100] [--real-runs 2] [--quick]``. In one run:
the fixed code explored over ``--fixed`` schedules (failures must be 0); the race
(``hicache_index_k_no_wait`` + ``bf16_index_k``) explored seed by seed with 2 sessions x 2 turns
until a schedule fails (wall time to that first failure, the fixed prompts' references warm);
that failing seed replayed ``--replays`` times (each must give identical tokens and decisions);
the simulator's overhead on a warm schedule of
6 sessions x 2 turns (wall time over the time inside engine steps); and real mode's time to the
first flag on a launched PD pair (``bench.repro_time``, median of ``--real-runs``). The ratio is
sim's time to first failure over real mode's median (target <= 0.1).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from dataclasses import dataclass

from bench import repro_time
from bench.table import TableRow
from workbench import sim

log = logging.getLogger(__name__)
RACE = ("bf16_index_k", "hicache_index_k_no_wait")


@dataclass(frozen=True)
class SimBench:
    fixed_schedules: int
    fixed_failures: int
    first_failure_seed: int | None
    first_failure_s: float | None  # wall seconds of every schedule up to the failing one
    replays: int
    identical: int
    wall_s: float  # one warm fixed schedule of 6 sessions x 2 turns
    forward_s: float  # of which inside engine steps
    real_median_s: float | None
    real_runs: int

    @property
    def overhead(self) -> float:
        return self.wall_s / self.forward_s if self.forward_s else float("nan")

    @property
    def speedup(self) -> float | None:
        if self.first_failure_s is None or not self.real_median_s:
            return None
        return self.first_failure_s / self.real_median_s

    def table_row(self) -> TableRow:
        measured = (f"race found in sim after {self.first_failure_s or 0:.1f} s (seed "
                    f"{self.first_failure_seed}) vs real median {self.real_median_s or 0:.0f} s; "
                    f"replays identical {self.identical}/{self.replays}; fixed "
                    f"{self.fixed_failures} failures in {self.fixed_schedules} schedules; "
                    f"overhead {self.overhead:.2f}x the engine steps")
        return TableRow("sim", measured, self.speedup, "sim / real time to first failure")


def measure(fixed: int = 200, replays: int = 100, real_runs: int = 2) -> SimBench:
    w = sim.Workload()
    sim.run((), 0, w)  # warm: model, reference oracle
    warm = sim.run((), 1, w)
    fixed_runs = sim.explore((), seeds=range(2, 2 + fixed), workload=w,
                             stop_on_failure=False, progress=False)
    small = sim.Workload(sessions=2)  # one turn-2 load back is all the race needs
    sim.run((), 0, small)
    t0 = time.perf_counter()
    found = sim.explore(RACE, seeds=range(1000), workload=small, progress=False).first_failure
    first_s = time.perf_counter() - t0 if found is not None else None
    identical = 0
    for _ in range(replays if found is not None else 0):
        try:
            sim.replay(found)
            identical += 1
        except sim.ReplayDiverged as exc:
            log.warning("%s", exc)
    real = repro_time.measure(runs=real_runs, control_s=0) if real_runs else None
    real_times = [r.first_flag_s for r in real.runs if r.reproduced] if real else []
    return SimBench(fixed, len(fixed_runs.failures), found.seed if found else None,
                    round(first_s, 2) if first_s is not None else None,
                    replays if found is not None else 0, identical, warm.wall_s,
                    warm.forward_s, statistics.median(real_times) if real_times else None,
                    real_runs)


def report(b: SimBench) -> None:
    print(f"fixed code: {b.fixed_failures} failing schedules of {b.fixed_schedules}")
    print(f"race: first failing schedule seed {b.first_failure_seed} after "
          f"{b.first_failure_s} s of simulation; replayed {b.replays} times, identical tokens "
          f"and decisions {b.identical}/{b.replays}")
    print(f"one schedule (6 sessions x 2 turns): {b.wall_s:.2f} s, {b.forward_s:.2f} s inside "
          f"engine steps: overhead {b.overhead:.2f}x (target <= 1.5x)")
    print(f"real mode, median time to first flag over {b.real_runs} launches: "
          f"{b.real_median_s} s; sim / real = "
          f"{'n/a' if b.speedup is None else f'{b.speedup:.3f}'} (target <= 0.1)")


def main(argv: list[str] | None = None) -> SimBench:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixed", type=int, default=200)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--real-runs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="20 fixed schedules, 10 replays, 1 real")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.quick:
        args.fixed, args.replays, args.real_runs = 20, 10, 1
    b = measure(args.fixed, args.replays, args.real_runs)
    report(b)
    return b


if __name__ == "__main__":
    main()
