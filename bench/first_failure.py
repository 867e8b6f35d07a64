"""Time to the first failing schedule of a quick simulation: the default executor vs in process.

Run ``python -m bench.first_failure [--rounds 2]``. In one run, each arm in a fresh Python
process (so no arm inherits another's warm Ray or model): the index-K race (``SEED_RACE``,
2 sessions, seeds from 0) explored until a schedule fails, timed from the call to the result,
after the process warmed the model and the reference on one fixed schedule. Arms: ``workers=1``
(in process), the default (``executor_for()`` with nothing asked: in process first, a local
cluster only after ``LOCAL_FIRST_S`` with seeds left), and Ray started up front (``workers`` =
this machine's cores, the default before the staged start). The ratio is the default's median
over in process's (target: about 1, not a cluster start).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass

from bench.table import TableRow

log = logging.getLogger(__name__)
ARMS = {"in process": "1", "default": "None", "ray up front": str(os.cpu_count() or 2)}
_PROGRAM = """
import json, time
from engine.patches import SEED_RACE
from workbench import sim
small = sim.Workload(sessions=2)
sim.run((), 0, small)
t0 = time.perf_counter()
found = sim.explore(SEED_RACE, range(200), small, progress=False, workers={workers})
print(json.dumps({{"s": time.perf_counter() - t0, "seed": found.first_failure.seed}}))
"""


@dataclass(frozen=True)
class FirstFailureBench:
    seconds: dict[str, list[float]]  # arm -> wall seconds per round
    seed: int  # the first failing seed (the same in every arm)

    def median(self, arm: str) -> float:
        return statistics.median(self.seconds[arm])

    def table_row(self) -> TableRow:
        arms = "; ".join(f"{a} {self.median(a):.1f} s" for a in self.seconds)
        return TableRow("first_failure", f"index-K race, first failing seed {self.seed}: {arms} "
                        f"(median of {len(self.seconds['default'])}, fresh process each)",
                        self.median("default") / self.median("in process"),
                        "default / in-process time to the first failing schedule")


def _one(workers: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROGRAM.format(workers=workers)], check=True,
                         capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(rounds: int = 2) -> FirstFailureBench:
    seconds: dict[str, list[float]] = {a: [] for a in ARMS}
    seeds = set()
    for _ in range(rounds):  # arms interleaved, so drift over time hits each alike
        for arm, workers in ARMS.items():
            got = _one(workers)
            seconds[arm].append(got["s"])
            seeds.add(got["seed"])
    if len(seeds) != 1:
        raise RuntimeError(f"arms disagree on the first failing seed: {sorted(seeds)}")
    return FirstFailureBench(seconds, seeds.pop())


def report(b: FirstFailureBench) -> None:
    for arm, s in b.seconds.items():
        print(f"{arm}: {', '.join(f'{x:.2f}' for x in s)} s (median {b.median(arm):.2f})")
    print(f"first failing seed {b.seed}; default / in process = "
          f"{b.median('default') / b.median('in process'):.2f}")


def main(argv: list[str] | None = None) -> FirstFailureBench:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    b = measure(args.rounds)
    report(b)
    return b


if __name__ == "__main__":
    main()
