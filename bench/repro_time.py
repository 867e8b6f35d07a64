"""Time to reproduce the HiCache index-K race: launch a PD pair, load it until the first flag.

Run ``python -m bench.repro_time [--runs 5] [--cap-s 60] [--quick]``.  Each run launches a fresh
PD pair with the buggy variants (``hicache_index_k_no_wait`` + ``bf16_index_k``, the race engine
settings and seeded faults of ``workbench.investigate.series``) and runs seeded concurrency bursts
(``inject_concurrency``, oracle on) until a burst returns a flagged request: a reference mismatch
or a DSML leak.  The time to reproduce is the seconds from the start of the launch to the return
of that burst (what a user waits for; resolution = one burst).  A run that has not flagged
``cap_s`` seconds after its launch began counts as not reproduced (no burst starts a new turn
past the cap).  The control is the same load for ``cap_s`` seconds on the default (fixed)
variants, where the flag count must be 0.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.table import TableRow
from workbench.drive import wilson
from workbench.investigate import BUGGY, RACE_ENGINE, RACE_FAULTS, reproduce

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Burst:
    """Shape of one concurrency burst (the trial of
    ``workbench.investigate.series.corruption_trial``)."""

    sessions: int = 4
    turns: int = 2
    max_tokens: int = 120


@dataclass(frozen=True)
class Run:
    """One launch: when (if ever) the first flagged request came back, and the load it took."""

    patches: tuple[str, ...]
    seed: int
    cap_s: float
    launch_s: float
    first_flag_s: float | None  # launch start -> return of the first burst with a flag
    wall_s: float
    bursts: int
    requests: int  # judged (completed) requests
    flagged: int  # reference mismatches or DSML leaks

    @property
    def reproduced(self) -> bool:
        return self.first_flag_s is not None and self.first_flag_s <= self.cap_s


@dataclass(frozen=True)
class ReproTime:
    cap_s: float
    burst: Burst
    runs: tuple[Run, ...]
    control: Run | None

    @property
    def times(self) -> list[float]:
        """Per-run time to reproduce; ``inf`` for runs that did not reproduce within the cap."""
        return [r.first_flag_s if r.reproduced else math.inf for r in self.runs]

    @property
    def median_s(self) -> float:
        """Median over runs, counting unreproduced runs as infinite (``inf`` if half or more)."""
        return statistics.median(self.times) if self.runs else math.nan

    @property
    def reproduced(self) -> int:
        return sum(r.reproduced for r in self.runs)

    @property
    def p_within_cap(self) -> float:
        return self.reproduced / len(self.runs) if self.runs else math.nan

    def table_row(self) -> TableRow:
        med = (f"{self.median_s:.0f} s" if math.isfinite(self.median_s)
               else f"> {self.cap_s:.0f} s")
        lo, hi = wilson(self.reproduced, len(self.runs))
        ctrl = (f"control (fixed variants): {self.control.flagged} flags in "
                f"{self.control.requests} requests" if self.control else "no control run")
        return TableRow("index-K race time-to-reproduce",
                        f"median {med} from launch to first flagged request; reproduced "
                        f"{self.reproduced}/{len(self.runs)} within {self.cap_s:.0f} s "
                        f"(95% CI {lo:.2f}-{hi:.2f}); {ctrl}",
                        self.p_within_cap, f"P(reproduced within {self.cap_s:.0f} s)",
                        ratio_text=f"{self.p_within_cap:.2f} ({self.reproduced}/{len(self.runs)})")


def run_once(patches: tuple[str, ...], seed: int, cap_s: float, burst: Burst, log_dir: Path,
             stop_on_flag: bool = True) -> Run:
    """Launches a pair and runs bursts (seeds ``1000 * seed, ...``) until a flag
    (``stop_on_flag``) or ``cap_s`` after the launch started."""
    rep = reproduce(patches, sessions=burst.sessions, turns=burst.turns,
                    max_tokens=burst.max_tokens, seed=seed * 1000, max_bursts=None,
                    stop_after_flags=1 if stop_on_flag else None, cap_s=cap_s,
                    engine=RACE_ENGINE, faults=RACE_FAULTS, log_dir=log_dir)
    b = rep.bursts
    wall = float(b["t_s"].max()) if b.height else rep.launch_s
    log.info("%s seed %d: %d bursts, %d flagged, first flag at %s s", rep.variant, seed,
             b.height, rep.flagged, rep.first_flag_s)
    return Run(tuple(patches), seed, cap_s, rep.launch_s, rep.first_flag_s, wall, b.height,
               int(b["requests"].sum()), rep.flagged)


def measure(runs: int = 5, cap_s: float = 60.0, control_s: float | None = None, seed: int = 0,
            burst: Burst = Burst()) -> ReproTime:
    """``runs`` buggy launches (seeds ``seed..seed+runs-1``), then one control launch."""
    with tempfile.TemporaryDirectory(prefix="bench-repro-") as tmp:
        done = [run_once(BUGGY, seed + r, cap_s, burst, Path(tmp) / f"run{r}")
                for r in range(runs)]
        control = None
        if control_s is None or control_s > 0:
            control = run_once((), seed + runs, control_s or cap_s, burst, Path(tmp) / "control",
                               stop_on_flag=False)
    return ReproTime(cap_s, burst, tuple(done), control)


def report(res: ReproTime) -> None:
    b = res.burst
    print(f"bursts of {b.sessions} sessions x {b.turns} turns, max_tokens {b.max_tokens}; "
          f"cap {res.cap_s:.0f} s after launch start")
    print(f"{'variant':>8} {'seed':>4} {'launch s':>8} {'first flag s':>12} {'bursts':>6} "
          f"{'requests':>8} {'flagged':>7}")
    rows = [("buggy", r) for r in res.runs] + ([("control", res.control)] if res.control else [])
    for name, r in rows:
        first = f"{r.first_flag_s:.1f}" if r.first_flag_s is not None else "-"
        print(f"{name:>8} {r.seed:>4} {r.launch_s:>8.1f} {first:>12} {r.bursts:>6} "
              f"{r.requests:>8} {r.flagged:>7}")
    med = f"{res.median_s:.1f} s" if math.isfinite(res.median_s) else f"> {res.cap_s:.0f} s"
    lo, hi = wilson(res.reproduced, len(res.runs))
    print(f"median time to reproduce {med}; P(within {res.cap_s:.0f} s) = "
          f"{res.reproduced}/{len(res.runs)} = {res.p_within_cap:.2f} (95% CI {lo:.2f}-{hi:.2f})")
    if res.control:
        print(f"control (default variants, {res.control.wall_s:.0f} s): {res.control.flagged} "
              f"flagged of {res.control.requests} requests (expected 0)")


def main(argv: list[str] | None = None) -> ReproTime:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=None, help="buggy launches (default 5)")
    ap.add_argument("--cap-s", type=float, default=60.0, help="per-run cap after launch start")
    ap.add_argument("--control-s", type=float, default=None,
                    help="control load duration (default: the cap; 0 skips the control)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sessions", type=int, default=Burst.sessions)
    ap.add_argument("--quick", action="store_true", help="2 runs, 30 s control (~3 min)")
    args = ap.parse_args(argv)
    runs = args.runs or (2 if args.quick else 5)
    control_s = args.control_s if args.control_s is not None else (30.0 if args.quick else None)
    res = measure(runs, args.cap_s, control_s, args.seed, Burst(sessions=args.sessions))
    report(res)
    return res


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main()
