"""NIXL WRITE bandwidth between two processes vs an in-process torch ``copy_`` of the same bytes.

Run: ``.venv/bin/python -m bench.nixl_bandwidth [--sizes-mib 1 16 64] [--page-kib 64]``.
A receiver subprocess owns the destination pool; this process owns the source pool and times
``write_pages`` + ``wait`` + ``release`` (the path the servers use) for two page patterns:
"coalesced" (contiguous pages -> one descriptor) and "per-page" (reversed destination order,
so nothing coalesces: one descriptor per page). Times are medians over repeats.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.table import TableRow
from engine.transfer.endpoint import (
    MetadataChannel,
    PageWrite,
    PeerHandle,
    TransferEndpoint,
    TransferStatus,
    fetch_peer,
)

TIMEOUT_S = 20.0
RECEIVER_LIFETIME_S = 120.0
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    """One measured configuration."""

    size_mib: float
    mode: str
    descs: int
    nixl_gbps: float
    memcpy_gbps: float

    @property
    def ratio(self) -> float:
        return self.nixl_gbps / self.memcpy_gbps


def pool(num_pages: int, page_bytes: int, fill: int) -> torch.Tensor:
    """A [num_pages, page_bytes] uint8 pool, touched so no page faults land in the timings."""
    return torch.full((num_pages, page_bytes), fill, dtype=torch.uint8)


def median_seconds(fn: Callable[[], None], min_time_s: float, min_reps: int = 5) -> float:
    """Median wall time of ``fn`` after one warm-up, repeated for at least ``min_time_s``."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 2000:
            break
    return statistics.median(times)


def receiver_main(num_pages: int, page_bytes: int) -> int:
    """Destination process: serve the blob, stay alive until ``quit`` (bounded)."""
    with TransferEndpoint("bench-dst", {"pool": pool(num_pages, page_bytes, 0)}) as ep:
        channel = MetadataChannel(ep.blob())
        print(f"PORT {channel.serve()}", flush=True)
        ep.connect(channel.wait_for_peer(TIMEOUT_S))
        channel.close()
        deadline = time.monotonic() + RECEIVER_LIFETIME_S
        while time.monotonic() < deadline:
            if any(n.tag == b"quit" for n in ep.notifications()):
                return 0
            time.sleep(0.01)
    return 1


def start_receiver(num_pages: int, page_bytes: int) -> tuple[subprocess.Popen, int]:
    """Spawn the receiver and read its channel port (bounded)."""
    cmd = [sys.executable, "-m", "bench.nixl_bandwidth", "--receiver",
           "--num-pages", str(num_pages), "--page-bytes", str(page_bytes)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("PORT "):
            return proc, int(line.split()[1])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"receiver did not start (rc={proc.poll()})")


def write_once(ep: TransferEndpoint, peer: PeerHandle, req: list[PageWrite]) -> int:
    """One blocking WRITE through the public API; returns its descriptor count."""
    h = ep.write_pages(peer, req)
    status = ep.wait(h, TIMEOUT_S)
    ep.release(h)
    if status is not TransferStatus.DONE:
        raise RuntimeError(f"transfer of {h.nbytes} bytes ended {status}")
    return h.num_descs


def measure(ep: TransferEndpoint, peer: PeerHandle, src: torch.Tensor, local_dst: torch.Tensor,
            n_pages: int, min_time_s: float) -> list[Row]:
    """NIXL coalesced and per-page WRITEs of ``n_pages`` pages vs one ``copy_`` of them."""
    nbytes = n_pages * src.shape[1]
    memcpy_s = median_seconds(lambda: local_dst[:n_pages].copy_(src[:n_pages]), min_time_s)
    patterns = {"coalesced": list(range(n_pages)), "per-page": list(range(n_pages))[::-1]}
    rows = []
    for mode, dst_pages in patterns.items():
        req = [PageWrite("pool", list(range(n_pages)), dst_pages)]
        nixl_s = median_seconds(functools.partial(write_once, ep, peer, req), min_time_s)
        rows.append(Row(nbytes / 2**20, mode, write_once(ep, peer, req), nbytes / nixl_s / 1e9,
                        nbytes / memcpy_s / 1e9))
    return rows


@dataclass(frozen=True)
class NixlBandwidth:
    """Every measured (size, pattern) row of one run."""

    rows: tuple[Row, ...]
    page_bytes: int
    threads: int

    def largest(self, mode: str) -> Row:
        return max((r for r in self.rows if r.mode == mode), key=lambda r: r.size_mib)

    def table_row(self) -> TableRow:
        co, pp = self.largest("coalesced"), self.largest("per-page")
        return TableRow("NIXL vs memcpy bandwidth",
                        f"{co.size_mib:.0f} MiB, {self.page_bytes // 1024} KiB pages: NIXL "
                        f"{co.nixl_gbps:.2f} GB/s coalesced, {pp.nixl_gbps:.2f} GB/s per-page "
                        f"({pp.ratio:.2f}x); memcpy {co.memcpy_gbps:.2f} GB/s",
                        co.ratio, "NIXL WRITE / torch copy_ GB/s (coalesced)")


def print_table(rows: list[Row] | tuple[Row, ...], page_bytes: int, threads: int) -> None:
    print(f"\nNIXL UCX WRITE, DRAM->DRAM, two processes; page = {page_bytes // 1024} KiB; "
          f"torch threads (memcpy) = {threads}")
    print(f"{'size':>8} {'pattern':>10} {'descs':>6} {'nixl GB/s':>10} {'memcpy GB/s':>12} "
          f"{'nixl/memcpy':>12}")
    for r in rows:
        print(f"{r.size_mib:>5.0f}MiB {r.mode:>10} {r.descs:>6} {r.nixl_gbps:>10.2f} "
              f"{r.memcpy_gbps:>12.2f} {r.ratio:>12.2f}")


def measure_all(sizes_mib: list[int] | tuple[int, ...] = (1, 16, 64), page_kib: int = 64,
                min_time_s: float = 0.5, threads: int = 1) -> NixlBandwidth:
    """Spawns the receiver, measures every size (both patterns), stops the receiver.

    ``threads`` applies to the memcpy baseline; the caller's torch thread count is restored.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    page_bytes = page_kib * 1024
    num_pages = max(sizes_mib) * 2**20 // page_bytes
    proc, port = start_receiver(num_pages, page_bytes)
    src, local_dst = pool(num_pages, page_bytes, 7), pool(num_pages, page_bytes, 0)
    try:
        with TransferEndpoint("bench-src", {"pool": src}) as ep:
            peer = ep.connect(fetch_peer("127.0.0.1", port, ep.blob(), TIMEOUT_S))
            rows = []
            for size in sizes_mib:
                n_pages = size * 2**20 // page_bytes
                rows += measure(ep, peer, src, local_dst, n_pages, min_time_s)
            ep.send_notif(peer, b"quit")
            proc.wait(timeout=10)
    finally:
        torch.set_num_threads(previous_threads)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    return NixlBandwidth(tuple(rows), page_bytes, threads)


def report(res: NixlBandwidth) -> None:
    print_table(res.rows, res.page_bytes, res.threads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--page-kib", type=int, default=64)
    ap.add_argument("--min-time-s", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the memcpy")
    ap.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--num-pages", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--page-bytes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.receiver:
        return receiver_main(args.num_pages, args.page_bytes)
    report(measure_all(args.sizes_mib, args.page_kib, args.min_time_s, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
