"""NIXL's progress thread, stock (0 µs delay: busy poll) vs paced (``engine.transfer.progress``),
in the real vLLM PD pair and in ours, same run: CPU the idle pair burns, and the latency of short
sequential requests through the router.

``python -m bench.nixl_progress [--requests 20] [--backends vllm embedded]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.table import TableRow
from engine.transfer.progress import DEFAULT_DELAY_US, DELAY_ENV
from workbench.deploy import PDPair, launch_pd_pair
from workbench.deploy.vllm import VllmOptions

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class PairFigures:
    backend: str
    delay_us: int
    idle_cores: float  # CPU seconds per wall second of every process of the idle pair
    median_s: float  # sequential short requests through the router
    errors: int


@dataclass(frozen=True)
class ProgressPacing:
    figures: tuple[PairFigures, ...]

    def pick(self, backend: str, delay_us: int) -> PairFigures:
        return next(f for f in self.figures if f.backend == backend and f.delay_us == delay_us)

    def table_row(self) -> TableRow:
        backends = list(dict.fromkeys(f.backend for f in self.figures))
        parts = []
        for b in backends:
            s, p = self.pick(b, 0), self.pick(b, DEFAULT_DELAY_US)
            parts.append(f"{b}: idle {s.idle_cores:.2f} -> {p.idle_cores:.2f} cores, median "
                         f"{s.median_s:.2f} -> {p.median_s:.2f} s, errors {s.errors} -> "
                         f"{p.errors}")
        first = backends[0]
        ratio = self.pick(first, 0).median_s / self.pick(first, DEFAULT_DELAY_US).median_s
        return TableRow("NIXL progress thread stock vs paced", "; ".join(parts), ratio,
                        f"{first}: stock / paced median request latency")


def _group_ticks(pgids: set[int]) -> int:
    """utime + stime of every live process whose process group is in ``pgids``."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in pgids:  # fields[2] is pgrp (field 5 of proc(5))
            total += int(fields[11]) + int(fields[12])
    return total


def idle_cores(pair: PDPair, seconds: float) -> float:
    """CPU the pair's processes take over ``seconds`` with no request in flight."""
    pgids = {os.getpgid(s.proc.pid) for s in pair.servers() if s.proc is not None}
    t0, c0 = time.monotonic(), _group_ticks(pgids)
    time.sleep(seconds)
    return (_group_ticks(pgids) - c0) / CLOCK_TICKS / (time.monotonic() - t0)


def request_latencies(pair: PDPair, n: int) -> tuple[list[float], int]:
    """Wall seconds of ``n`` sequential 8-token chat requests, and how many failed."""
    body = {"messages": [{"role": "user", "content": "what is the weather in Paris?"}],
            "max_tokens": 8, "temperature": 0.0, **({"model": pair.model} if pair.model else {})}
    times, errors = [], 0
    with httpx.Client(timeout=120) as client:
        for _ in range(n):
            t0 = time.monotonic()
            r = client.post(pair.url + "/v1/chat/completions", json=body)
            times.append(time.monotonic() - t0)
            errors += r.status_code != 200
    return times, errors


def measure_pair(backend: str, delay_us: int, requests: int, idle_s: float) -> PairFigures:
    saved = os.environ.get(DELAY_ENV)
    os.environ[DELAY_ENV] = str(delay_us)  # our servers inherit it; vLLM's come from options
    try:
        opts = VllmOptions(nixl_progress_delay_us=delay_us) if backend == "vllm" else None
        kwargs = {"vllm_options": opts} if opts else {}
        with launch_pd_pair(backend=backend, **kwargs) as pair:
            time.sleep(2.0)  # let start-up spin-waits settle
            cores = idle_cores(pair, idle_s)
            times, errors = request_latencies(pair, requests)
    finally:
        if saved is None:
            os.environ.pop(DELAY_ENV, None)
        else:
            os.environ[DELAY_ENV] = saved
    return PairFigures(backend, delay_us, round(cores, 3), round(statistics.median(times), 3),
                       errors)


def measure(requests: int = 20, idle_s: float = 5.0,
            backends: tuple[str, ...] = ("vllm", "embedded")) -> ProgressPacing:
    return ProgressPacing(tuple(measure_pair(b, d, requests, idle_s)
                                for b in backends for d in (0, DEFAULT_DELAY_US)))


def report(res: ProgressPacing) -> None:
    print(json.dumps([asdict(f) for f in res.figures], indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--backends", nargs="+", default=["vllm", "embedded"],
                    choices=["vllm", "embedded"])
    args = ap.parse_args(argv)
    res = measure(args.requests, args.idle_s, tuple(args.backends))
    report(res)
    print(res.table_row())


if __name__ == "__main__":
    main()
