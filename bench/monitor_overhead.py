"""The pair monitor's cost on the engine: inter-token latency with and without it, one run.

Run ``python -m bench.monitor_overhead [--streams 4] [--phase-s 3] [--rounds 6] [--quick]``. The
load and the phases are ``bench.dump_overhead``'s (streaming clients looping final answers;
phases without and with the probe in ABBA order; the first ``settle_s`` of each dropped); the
probe is ``workbench.report.Monitor`` sampling every server of the pair at its notebook rate
(``interval_s``, 1 s), exactly what ``monitor(pair)`` does on its thread.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.dump_overhead import Streams, drive, percentiles_ms
from bench.table import TableRow
from workbench.deploy import PDPair, launch_pd_pair
from workbench.report import Monitor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MonitorOverhead:
    streams: int
    phase_s: float
    rounds: int
    interval_s: float
    itl_off_ms: tuple[float, float]  # p50, p99 without the monitor
    itl_on_ms: tuple[float, float]
    gaps_off: int
    gaps_on: int
    ticks: int  # monitor samples taken (all servers each)
    tick_ms: float  # mean wall time of one tick

    @property
    def p99_ratio(self) -> float:
        return self.itl_on_ms[1] / self.itl_off_ms[1]

    def table_row(self) -> TableRow:
        return TableRow("monitor overhead (pair monitor at 1 Hz)",
                        f"ITL p50 {self.itl_off_ms[0]:.0f} -> {self.itl_on_ms[0]:.0f} ms, p99 "
                        f"{self.itl_off_ms[1]:.0f} -> {self.itl_on_ms[1]:.0f} ms; {self.ticks} "
                        f"ticks, {self.tick_ms:.0f} ms each, {self.streams} streams",
                        self.p99_ratio, "ITL p99 with the monitor / without")


def monitor_loop(pair: PDPair, state: Streams, mon: Monitor, took: list[float]) -> None:
    """Ticks ``mon`` every ``mon.interval_s`` while the on-phase flag is set."""
    t0 = time.monotonic()
    while not state.stop.is_set():
        if not state.dumping.wait(0.05):
            continue
        start = time.perf_counter()
        mon.tick(pair, round(time.monotonic() - t0, 2))
        took.append(time.perf_counter() - start)
        state.stop.wait(max(0.0, mon.interval_s - took[-1]))


def measure(streams: int = 4, phase_s: float = 3.0, rounds: int = 6, interval_s: float = 1.0,
            settle_s: float = 0.3, warmup_s: float = 3.0, max_tokens: int = 96
            ) -> MonitorOverhead:
    schedule = [(on, phase_s) for r in range(rounds)
                for on in ((False, True) if r % 2 == 0 else (True, False))]
    state, mon, took = Streams(), Monitor(interval_s), []
    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp, \
            launch_pd_pair(log_dir=Path(tmp)) as pair:
        probe = threading.Thread(target=monitor_loop, args=(pair, state, mon, took),
                                 name="monitor", daemon=True)
        probe.start()
        try:
            phases = asyncio.run(drive(pair, state, streams, max_tokens, warmup_s, schedule))
        finally:
            state.stop.set()
            probe.join(timeout=30)
            mon.stop()  # closes its connections
    split: dict[bool, list[float]] = {False: [], True: []}
    for at, gap in state.gaps:
        for on, start, end in phases:
            if start + settle_s <= at <= end:
                split[on].append(gap)
    return MonitorOverhead(streams, phase_s, rounds, interval_s, percentiles_ms(split[False]),
                           percentiles_ms(split[True]), len(split[False]), len(split[True]),
                           len(took), 1e3 * sum(took) / len(took) if took else float("nan"))


def report(res: MonitorOverhead) -> None:
    print(f"{res.streams} streams, {res.rounds} x ({res.phase_s:g} s without + {res.phase_s:g} s "
          f"with the monitor at {1 / res.interval_s:g} Hz)")
    print(f"{'':>16} {'ITL p50 ms':>10} {'ITL p99 ms':>10} {'gaps':>6}")
    for name, itl, gaps in (("without monitor", res.itl_off_ms, res.gaps_off),
                            ("with monitor", res.itl_on_ms, res.gaps_on)):
        print(f"{name:>16} {itl[0]:>10.1f} {itl[1]:>10.1f} {gaps:>6}")
    print(f"ITL p99 ratio {res.p99_ratio:.2f}x; {res.ticks} ticks, {res.tick_ms:.0f} ms each")


def main(argv: list[str] | None = None) -> MonitorOverhead:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--phase-s", type=float, default=3.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=None, help="without/with pairs (default 6)")
    ap.add_argument("--quick", action="store_true", help="4 rounds")
    args = ap.parse_args(argv)
    res = measure(args.streams, args.phase_s, args.rounds or (4 if args.quick else 6))
    report(res)
    return res


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main()
