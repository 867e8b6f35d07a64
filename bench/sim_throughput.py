"""Simulation throughput on Ray: schedules/s on 2 workers over 1, verdicts and fingerprints equal.

Run ``python -m bench.sim_throughput [--schedules 48] [--cluster]``. The same ``--schedules``
fixed-code schedules (``bench.sim_scale.FIXED_MIX``, both strategies, seed i for schedule i) run
three ways in one run: in this process (``workers=1``, one torch thread), as Ray tasks on a local
cluster of 2 CPUs, and (``--cluster``) on a two-node ``ray.cluster_utils.Cluster`` of one CPU
per node. Timing starts after each worker (and this process, for the in-process way) has run
every workload of the mix once (``warm``: a process's first runs import torch, load the model
and allocate; start-up, reported apart), so the ratio compares steady throughput. Every way must
give the same verdict and the same fingerprint (decisions and tokens) for every schedule.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass

from bench.sim_scale import FIXED_MIX, STRATEGIES
from bench.table import TableRow
from workbench import sim
from workbench.scale import Executor, Placement
from workbench.scale.executor import LOOPBACK, ray_env

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    seed: int
    failed: bool
    fingerprint: str


def schedule(i: int) -> Verdict:
    """Schedule ``i`` of the fixed-code mix (as ``bench.sim_scale``)."""
    patches, w = FIXED_MIX[i % len(FIXED_MIX)]
    got = sim.run(patches, i, w, STRATEGIES[(i // len(FIXED_MIX)) % len(STRATEGIES)])
    return Verdict(i, got.failed, got.fingerprint)


@dataclass(frozen=True)
class Way:
    name: str
    verdicts: tuple[Verdict, ...]
    seconds: float
    startup_s: float = 0.0
    nodes: int = 1

    @property
    def rate(self) -> float:
        return len(self.verdicts) / self.seconds


@dataclass(frozen=True)
class Throughput:
    ways: tuple[Way, ...]

    def ratio(self, name: str = "ray, 2 workers") -> float:
        base = self.ways[0]
        return next(w for w in self.ways if w.name == name).rate / base.rate

    @property
    def identical(self) -> bool:
        return all(w.verdicts == self.ways[0].verdicts for w in self.ways)

    def table_row(self) -> TableRow:
        base = self.ways[0]
        parts = [f"{w.name} {w.rate:.2f}/s" for w in self.ways]
        return TableRow("sim throughput on Ray", f"{len(base.verdicts)} schedules: "
                        f"{', '.join(parts)}; verdicts and fingerprints "
                        f"{'identical' if self.identical else 'DIFFER'}",
                        self.ratio(), "schedules/s, 2 Ray workers / 1 in process")


def warm(_: int) -> int:
    """Every workload of the mix once (seeds past the measured ones): a process's first run of
    each imports, loads and allocates what later ones reuse."""
    for j in range(len(FIXED_MIX)):
        schedule(1_000_000 + j)
    return len(FIXED_MIX)


def timed(ex: Executor, n: int, name: str) -> Way:
    t0 = time.perf_counter()
    ex.map(warm, range(ex.workers), chunk=1)  # one per worker: each holds a CPU till done
    startup = time.perf_counter() - t0
    chunk = max(1, n // (8 * ex.workers))
    t0 = time.perf_counter()
    got = ex.map(schedule, range(n), chunk=chunk, label=name, unit="schedules", failed=_failed)
    return Way(name, tuple(got), time.perf_counter() - t0, startup, max(1, len(ex.nodes)))


def _failed(v: Verdict) -> bool:
    return v.failed


def measure(schedules: int = 48, cluster: bool = False) -> Throughput:
    import torch
    torch.set_num_threads(1)  # as each Ray worker: one CPU, one thread
    here = timed(Executor(Placement(workers=1)), schedules, "in process")
    with Executor(Placement(workers=2)) as ex:
        ways = [here, timed(ex, schedules, "ray, 2 workers")]
    if cluster:
        ways.append(on_two_nodes(schedules))
    return Throughput(tuple(ways))


def on_two_nodes(schedules: int) -> Way:
    import os
    os.environ.update(ray_env())
    from ray.cluster_utils import Cluster
    node = {"num_cpus": 1, "node_ip_address": LOOPBACK}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        c.add_node(**node)
        c.wait_for_nodes()
        with Executor(Placement(address=c.address)) as ex:
            return timed(ex, schedules, "ray, 2 nodes")
    finally:
        c.shutdown()


def report(res: Throughput) -> None:
    for w in res.ways:
        print(f"{w.name:16s} {len(w.verdicts)} schedules in {w.seconds:6.1f} s = {w.rate:.2f}/s "
              f"(start-up {w.startup_s:.1f} s, {w.nodes} node(s)), "
              f"{sum(v.failed for v in w.verdicts)} failing")
    print(f"identical verdicts and fingerprints: {res.identical}")
    print(res.table_row().measured, f"-> ratio {res.ratio():.2f}")


def main(argv: list[str] | None = None) -> Throughput:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=48)
    ap.add_argument("--cluster", action="store_true", help="also on a two-node Ray cluster")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("engine", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    res = measure(args.schedules, args.cluster)
    report(res)
    return res


if __name__ == "__main__":
    main()
