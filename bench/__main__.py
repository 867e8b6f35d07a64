"""``python -m bench [--quick] [--only NAME ...]``: every benchmark in one run, then one table.

Each benchmark prints its own detail section, then the run ends with a markdown table of ratios
(one row per benchmark) under a header naming the date and the machine.  Every ratio compares
two figures measured in this same run, so machine noise weighs on both sides.
"""

from __future__ import annotations

import argparse
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from bench import (
    bisect_sim,
    decode_throughput,
    dump_overhead,
    first_failure,
    monitor_overhead,
    nixl_bandwidth,
    nixl_progress,
    repro_time,
    sim,
    sim_pd,
    sim_rare,
    sim_scale,
    sim_throughput,
    soak,
    vllm_pd,
    zoo,
)
from bench.table import TableRow, header, markdown_table

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    run: Callable[[bool], object]  # quick -> result with .table_row()
    report: Callable[[object], None]


BENCHMARKS = (
    Benchmark("repro", "time to reproduce the index-K race",
              lambda quick: repro_time.measure(runs=2 if quick else 5,
                                               control_s=30.0 if quick else None),
              repro_time.report),
    Benchmark("decode", "decode throughput",
              lambda quick: decode_throughput.measure(tokens=16 if quick else 32),
              decode_throughput.report),
    Benchmark("nixl", "NIXL KV transfer vs memcpy",
              lambda quick: nixl_bandwidth.measure_all(sizes_mib=(1, 16) if quick else (1, 16, 64)),
              nixl_bandwidth.report),
    Benchmark("progress", "NIXL progress thread: stock busy poll vs paced",
              lambda quick: nixl_progress.measure(requests=8 if quick else 20),
              nixl_progress.report),
    Benchmark("bisect", "bisection: Bayesian vs fixed-repeat",
              lambda quick: bisect_sim.run(runs=10 if quick else 20),
              bisect_sim.report),
    Benchmark("dump", "dump overhead",
              lambda quick: dump_overhead.measure(rounds=4 if quick else 10),
              dump_overhead.report),
    Benchmark("monitor", "pair monitor overhead",
              lambda quick: monitor_overhead.measure(rounds=4 if quick else 6),
              monitor_overhead.report),
    Benchmark("sim", "deterministic simulation vs real mode on the index-K race",
              lambda quick: sim.measure(*((20, 10, 1) if quick else (200, 100, 2))), sim.report),
    Benchmark("sim_rare", "a rare interleaving: PCT in simulation vs real bursts",
              lambda quick: sim_rare.measure(real_bursts=10 if quick else 50), sim_rare.report),
    Benchmark("sim_pd", "the zoo swept blind in a simulated PD pair",
              lambda quick: sim_pd.measure(*((1, 1, 1) if quick else (3, 3, 2))), sim_pd.report),
    Benchmark("first_failure", "time to the first failing schedule: default executor vs in process",
              lambda quick: first_failure.measure(rounds=1 if quick else 3), first_failure.report),
    Benchmark("sim_scale", "every failing variant replayed, the fixed code over many schedules",
              lambda quick: sim_scale.measure(*((200, 10) if quick else (10_000, 100))),
              sim_scale.report),
    Benchmark("sim_throughput", "simulation throughput on Ray, 2 workers vs 1",
              lambda quick: sim_throughput.measure(24 if quick else 96, cluster=not quick),
              sim_throughput.report),
    Benchmark("soak", "a fixed PD pair under many sessions with kills",
              lambda quick: soak.measure(sessions=64 if quick else 256), soak.report),
    Benchmark("zoo", "every zoo bug investigated blind",
              lambda quick: zoo.measure(bisect=not quick), zoo.report),
    Benchmark("vllm", "real vLLM PD pair vs our embedded pair",
              lambda quick: vllm_pd.measure(eval_n=50 if quick else 200, quick=quick),
              vllm_pd.report),
)


def run_all(selected: list[Benchmark], quick: bool) -> list[TableRow]:
    rows = []
    for b in selected:
        print(f"\n## {b.title}", flush=True)
        start = time.monotonic()
        try:
            result = b.run(quick)
        except Exception as exc:  # noqa: BLE001 - one failed benchmark must not lose the others
            traceback.print_exc()
            rows.append(TableRow(b.name, f"failed: {type(exc).__name__}: {exc}"[:200], None, ""))
            continue
        b.report(result)
        print(f"({time.monotonic() - start:.0f} s)", flush=True)
        rows.append(result.table_row())
    return rows


def main(argv: list[str] | None = None) -> list[TableRow]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs of every benchmark")
    ap.add_argument("--only", nargs="+", choices=[b.name for b in BENCHMARKS],
                    help="run only these benchmarks")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="progress logging (bursts, launches)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if args.verbose:
        for name in ("bench", "workbench.deploy.launch"):
            logging.getLogger(name).setLevel(logging.INFO)
    selected = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    head = header()
    print(f"# bench: {head}", flush=True)
    start = time.monotonic()
    rows = run_all(selected, args.quick)
    print(f"\n## ratios ({head}; suite {time.monotonic() - start:.0f} s)\n")
    print(markdown_table(rows), flush=True)
    return rows


if __name__ == "__main__":
    main()
