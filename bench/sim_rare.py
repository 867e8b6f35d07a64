"""A failure that needs a rare interleaving: PCT in simulation vs bursts in real mode.

Run ``python -m bench.sim_rare [--schedules 1000] [--real-bursts 50] [--bugs ...]``. For each
``RARE`` patch variant (``engine.patches.RARE``), PCT and the random walk explore schedules of
its ``CASES`` workload until one fails (at most ``--schedules``), and real mode runs
``--real-bursts`` seeded bursts of its shape on a launched PD pair, counting the bursts with an
anomaly. The variants: ``hicache_v_after_counter`` (the HiCache loader publishes a layer between
its K and V copies; one engine, ``hicache_race``) and ``prealloc_parked_after_check`` (the
prefill parks an early prealloc in a second critical section; a PD pair, ``baseline``, with a
200 us timing quantum so a bootstrap message and a dispatch that close may come in either order,
PCT's horizon about one schedule's decisions). Targets: PCT fails a schedule within 1,000; real
mode flags fewer than 1 burst in 50.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass

from bench.table import TableRow
from engine.patches import RARE
from workbench import sim
from workbench.drive import wilson
from workbench.investigate import Burst, reproduce

log = logging.getLogger(__name__)
SCHEDULES, REAL_BURSTS = 1000, 50
CASES: dict[str, tuple[sim.Workload, str]] = {  # rare variant -> (sim workload, real shape)
    "hicache_v_after_counter": (sim.Workload(sessions=2), "hicache_race"),
    "prealloc_parked_after_check": (sim.Workload.of_shape(
        "baseline", sessions=2, max_tokens=16, time_quantum_us=200.0, pct_horizon=200),
        "baseline"),
}


@dataclass(frozen=True)
class RareRow:
    bug: str
    pct_schedules: int | None  # schedules up to and including the first failing one
    pct_s: float
    walk_schedules: int | None
    walk_s: float
    real_bursts: int
    real_flagged: int

    @property
    def real_hi(self) -> float:
        """Wilson 95% upper bound on real mode's per-burst rate."""
        return wilson(self.real_flagged, self.real_bursts)[1] if self.real_bursts else 1.0


@dataclass(frozen=True)
class SimRare:
    rows: tuple[RareRow, ...]

    def table_row(self) -> TableRow:
        worst = [r.pct_schedules for r in self.rows]
        ratio = None if None in worst or not worst else max(worst) / SCHEDULES
        measured = "; ".join(f"{r.bug}: PCT fails schedule {r.pct_schedules} ({r.pct_s:.0f} s), "
                             f"walk {r.walk_schedules}, real {r.real_flagged}/{r.real_bursts} "
                             f"bursts" for r in self.rows)
        return TableRow("sim_rare", measured, ratio, "PCT schedules to a failure / 1,000")


def _first(bug: str, strategy: str, limit: int) -> tuple[int | None, float]:
    t0 = time.perf_counter()
    found = sim.explore((bug,), seeds=range(limit), workload=CASES[bug][0],
                        strategy=strategy, progress=False)
    n = len(found.runs) if found.first_failure is not None else None
    return n, round(time.perf_counter() - t0, 1)


def measure(schedules: int = SCHEDULES, real_bursts: int = REAL_BURSTS,
            bugs: tuple[str, ...] = RARE) -> SimRare:
    rows = []
    for bug in bugs:
        pct, pct_s = _first(bug, "pct", schedules)
        walk, walk_s = _first(bug, "random", schedules)
        flagged = 0
        if real_bursts:
            rep = reproduce((bug,), shape=CASES[bug][1], seeds=range(real_bursts),
                            variant=bug)
            flagged = sum(Burst(**b).anomalies > 0 for b in rep.bursts.iter_rows(named=True))
        rows.append(RareRow(bug, pct, pct_s, walk, walk_s, real_bursts, flagged))
        log.info("sim_rare %s", rows[-1])
    return SimRare(tuple(rows))


def report(res: SimRare) -> None:
    for r in res.rows:
        print(f"{r.bug}: PCT fails schedule {r.pct_schedules} of <= {SCHEDULES} ({r.pct_s} s); "
              f"random walk {r.walk_schedules} ({r.walk_s} s); real mode {r.real_flagged}/"
              f"{r.real_bursts} bursts flagged (95% upper bound {r.real_hi:.3f}; target: "
              f"below 1/50 = 0.02 measured, PCT within {SCHEDULES})")


def main(argv: list[str] | None = None) -> SimRare:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=SCHEDULES)
    ap.add_argument("--real-bursts", type=int, default=REAL_BURSTS)
    ap.add_argument("--bugs", nargs="*", default=list(RARE), choices=RARE)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    res = measure(args.schedules, args.real_bursts, tuple(args.bugs))
    report(res)
    return res


if __name__ == "__main__":
    main()
