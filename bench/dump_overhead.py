"""Server stall caused by ``/debug/dump``: inter-token latency with and without a dumping thread.

Run ``python -m bench.dump_overhead [--streams 4] [--phase-s 2] [--rounds 10] [--quick]``.  A PD
pair (default variants) serves ``streams`` concurrent streaming clients that loop final-answer
requests (content streams one token per chunk).  The run alternates short phases (ABBA order,
against drift on a shared machine) without and with a thread that calls
``workbench.dump_buffers`` on the decode server for a live room (one the streams are decoding;
finished rooms stay dumpable from the capture ring), with ``interval_s`` between calls.
Inter-token latency (ITL) is the gap between consecutive content chunks of one stream, seen by
the client; the first ``settle_s`` of every phase is dropped.  The dump runs on the engine loop
(the pages are copied there), so decode steps wait for it; on a 2-core machine the client's parse
of the dump competes for the same CPUs and is counted too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from bench.table import TableRow
from engine.training import make_transcript
from workbench.deploy import PDPair, launch_pd_pair
from workbench.observe import dump_buffers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DumpOverhead:
    streams: int
    phase_s: float
    rounds: int
    interval_s: float
    itl_off_ms: tuple[float, float]  # p50, p99 without dumps
    itl_on_ms: tuple[float, float]  # p50, p99 while dumping
    gaps_off: int
    gaps_on: int
    tok_s_off: float  # content tokens/s over all streams (gaps per measured second)
    tok_s_on: float
    dump_calls: int
    dump_misses: int  # rooms that were gone (neither live nor captured) when asked
    dump_ms: float  # median wall time of one dump_buffers call (client side)
    dump_tokens: float  # median tokens per dumped request

    @property
    def p50_ratio(self) -> float:
        return self.itl_on_ms[0] / self.itl_off_ms[0]

    @property
    def p99_ratio(self) -> float:
        return self.itl_on_ms[1] / self.itl_off_ms[1]

    def table_row(self) -> TableRow:
        return TableRow("dump overhead (server stall while dumping)",
                        f"ITL p50 {self.itl_off_ms[0]:.0f} -> {self.itl_on_ms[0]:.0f} ms "
                        f"({self.p50_ratio:.2f}x), p99 {self.itl_off_ms[1]:.0f} -> "
                        f"{self.itl_on_ms[1]:.0f} ms; tokens/s "
                        f"{self.tok_s_on / self.tok_s_off:.2f}x; "
                        f"dump {self.dump_ms:.0f} ms/call "
                        f"({self.dump_calls} calls, {self.dump_tokens:.0f} tokens each), "
                        f"{self.streams} streams",
                        self.p99_ratio, "ITL p99 with dumps / without")


class Streams:
    """Shared state of the load: gap samples, the rooms in flight, the phase schedule."""

    def __init__(self) -> None:
        self.gaps: list[tuple[float, float]] = []  # (time of the later chunk, gap seconds)
        self.live: dict[int, int] = {}  # stream -> room in flight
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.dumping = threading.Event()


def answer_body(i: int, max_tokens: int) -> dict:
    """The final-answer request of transcript ``i``'s first round: plain content tokens."""
    tr = make_transcript(1_000_000 + i)
    return {"messages": tr.messages()[:4], "tools": [t.to_openai() for t in tr.tools],
            "max_tokens": max_tokens, "stream": True}


async def stream_loop(client: httpx.AsyncClient, url: str, k: int, state: Streams,
                      max_tokens: int) -> None:
    n = 0
    while not state.stop.is_set():
        body = answer_body(k * 100_003 + n, max_tokens)
        n += 1
        last = None
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            room = resp.headers.get("x-bootstrap-room")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if not choices[0].get("delta", {}).get("content"):
                    continue
                now = time.monotonic()
                if last is not None:
                    state.gaps.append((now, now - last))
                elif room is not None:  # decoding now: dumpable live, then from the capture ring
                    with state.lock:
                        state.live[k] = int(room)
                last = now


def dump_loop(pair: PDPair, state: Streams, interval_s: float,
              calls: list[tuple[float, int]], misses: list[int]) -> None:
    while not state.stop.is_set():
        if not state.dumping.wait(0.05):
            continue
        with state.lock:
            rooms = list(state.live.values())
        if not rooms:
            time.sleep(0.01)
            continue
        t0 = time.perf_counter()
        try:
            dump = dump_buffers(pair, room=rooms[len(calls) % len(rooms)])
            calls.append((time.perf_counter() - t0, len(dump.tokens)))
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 404:
                raise
            misses.append(1)
        if interval_s:
            time.sleep(interval_s)


async def drive(pair: PDPair, state: Streams, streams: int, max_tokens: int, warmup_s: float,
                schedule: list[tuple[bool, float]]) -> list[tuple[bool, float, float]]:
    """Runs the streams through warm-up and the schedule; returns (dumping, start, end) phases."""
    phases = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0),
                                 limits=httpx.Limits(max_connections=streams + 4)) as client:
        tasks = [asyncio.create_task(stream_loop(client, pair.url, k, state, max_tokens))
                 for k in range(streams)]
        await asyncio.sleep(warmup_s)
        for dumping, seconds in schedule:
            (state.dumping.set if dumping else state.dumping.clear)()
            start = time.monotonic()
            await asyncio.sleep(seconds)
            phases.append((dumping, start, time.monotonic()))
        state.dumping.clear()
        state.stop.set()
        await asyncio.gather(*tasks)
    return phases


def percentiles_ms(gaps: list[float]) -> tuple[float, float]:
    if not gaps:
        return (float("nan"), float("nan"))
    p50, p99 = np.percentile(np.asarray(gaps), [50, 99])
    return (float(p50) * 1e3, float(p99) * 1e3)


def measure(streams: int = 4, phase_s: float = 2.0, rounds: int = 10, interval_s: float = 0.1,
            settle_s: float = 0.3, warmup_s: float = 3.0, max_tokens: int = 96) -> DumpOverhead:
    # ABBA order: background drift (a shared machine) weighs on both sides alike
    schedule = [(dumping, phase_s) for r in range(rounds)
                for dumping in ((False, True) if r % 2 == 0 else (True, False))]
    state = Streams()
    calls: list[tuple[float, int]] = []
    misses: list[int] = []
    with tempfile.TemporaryDirectory(prefix="bench-dump-") as tmp, \
            launch_pd_pair(engine={"debug_capture": 32}, log_dir=Path(tmp)) as pair:
        dumper = threading.Thread(target=dump_loop, args=(pair, state, interval_s, calls, misses),
                                  name="dumper", daemon=True)
        dumper.start()
        try:
            phases = asyncio.run(drive(pair, state, streams, max_tokens, warmup_s, schedule))
        finally:
            state.stop.set()
            dumper.join(timeout=30)
    split: dict[bool, list[float]] = {False: [], True: []}
    seconds = {False: 0.0, True: 0.0}
    for dumping, start, end in phases:
        seconds[dumping] += max(0.0, end - start - settle_s)
    for at, gap in state.gaps:
        for dumping, start, end in phases:
            if start + settle_s <= at <= end:
                split[dumping].append(gap)
    log.info("ITL samples: %d without dumps, %d with; %d dump calls",
             len(split[False]), len(split[True]), len(calls))
    return DumpOverhead(
        streams, phase_s, rounds, interval_s, percentiles_ms(split[False]),
        percentiles_ms(split[True]), len(split[False]), len(split[True]),
        len(split[False]) / seconds[False], len(split[True]) / seconds[True], len(calls),
        len(misses),
        statistics.median(c[0] for c in calls) * 1e3 if calls else float("nan"),
        statistics.median(c[1] for c in calls) if calls else float("nan"))


def report(res: DumpOverhead) -> None:
    print(f"{res.streams} streams, {res.rounds} x ({res.phase_s:g} s without + "
          f"{res.phase_s:g} s with dumps), {res.interval_s:.2f} s between dump calls")
    print(f"{'':>14} {'ITL p50 ms':>10} {'ITL p99 ms':>10} {'tokens/s':>9} {'gaps':>6}")
    print(f"{'without dumps':>14} {res.itl_off_ms[0]:>10.1f} {res.itl_off_ms[1]:>10.1f} "
          f"{res.tok_s_off:>9.1f} {res.gaps_off:>6}")
    print(f"{'with dumps':>14} {res.itl_on_ms[0]:>10.1f} {res.itl_on_ms[1]:>10.1f} "
          f"{res.tok_s_on:>9.1f} {res.gaps_on:>6}")
    print(f"{'ratio':>14} {res.p50_ratio:>9.2f}x {res.p99_ratio:>9.2f}x "
          f"{res.tok_s_on / res.tok_s_off:>8.2f}x")
    print(f"dump_buffers: {res.dump_calls} calls, median {res.dump_ms:.1f} ms/call, "
          f"{res.dump_tokens:.0f} tokens per request; {res.dump_misses} rooms already gone")


def main(argv: list[str] | None = None) -> DumpOverhead:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--phase-s", type=float, default=2.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=None, help="without/with pairs (default 10)")
    ap.add_argument("--interval-s", type=float, default=0.1, help="pause between dump calls")
    ap.add_argument("--quick", action="store_true", help="4 rounds (~30 s with the launch)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (4 if args.quick else 10)
    res = measure(args.streams, args.phase_s, rounds, args.interval_s)
    report(res)
    return res


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main()
