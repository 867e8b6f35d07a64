"""Hostile connections for the HTTP deadline tests: idle sockets, slowloris heads, and /health
timed while they hold the server.

``python tests/support/flood.py URL [--idle N] [--slow N] [--watch S]`` prints the report.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class FloodReport:
    """How long the server kept each connection (seconds from connect to its close; None: still
    open when the watch ended); the /health latency measured while the connections were being
    opened (they queue ahead of it in the listen backlog) and every one measured while they were
    held."""

    idle_lived: list[float | None] = field(default_factory=list)
    slow_lived: list[float | None] = field(default_factory=list)
    burst_health_s: float | None = None
    health_s: list[float] = field(default_factory=list)
    health_failures: int = 0

    def summary(self) -> str:
        def span(xs: list[float | None]) -> str:
            closed = [x for x in xs if x is not None]
            if not closed:
                return f"{len(xs)} open"
            return f"{len(closed)}/{len(xs)} closed after {min(closed):.2f}-{max(closed):.2f}s"
        worst = max(self.health_s, default=float("nan"))
        burst = float("nan") if self.burst_health_s is None else self.burst_health_s
        return (f"idle: {span(self.idle_lived)}; slowloris: {span(self.slow_lived)}; /health: "
                f"{burst * 1000:.0f} ms during the connect burst, then {len(self.health_s)} "
                f"probes, max {worst * 1000:.0f} ms, {self.health_failures} failed")


@dataclass
class Conn:
    opened: float  # time.monotonic() before the connect
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


async def connect(host: str, port: int) -> Conn:
    opened = time.monotonic()
    return Conn(opened, *await asyncio.open_connection(host, port))


async def lifetime(conn: Conn, until: float) -> float | None:
    """Seconds from connect until the server closes ``conn`` (None if it outlives ``until``)."""
    try:
        while await asyncio.wait_for(conn.reader.read(4096), until - time.monotonic()):
            pass
    except (TimeoutError, asyncio.TimeoutError):
        return None
    except OSError:
        pass
    finally:
        conn.writer.close()
    return time.monotonic() - conn.opened


async def slowloris(conn: Conn, until: float, every_s: float = 1.0) -> float | None:
    """``lifetime`` of a connection that sends a never-ending request head, a byte every
    ``every_s``."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100_000

    async def dribble() -> None:
        for byte in head:
            conn.writer.write(bytes([byte]))
            await conn.writer.drain()
            await asyncio.sleep(every_s)
    sender = asyncio.create_task(dribble())
    try:
        return await lifetime(conn, until)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)


async def health_once(host: str, port: int) -> float | None:
    """Seconds for GET /health on a fresh connection (None: no 200 within 10 s)."""
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    start = time.monotonic()
    try:
        conn = await connect(host, port)
        conn.writer.write(request)
        answer = await asyncio.wait_for(conn.reader.read(), 10.0)
        conn.writer.close()
    except (OSError, TimeoutError, asyncio.TimeoutError):
        return None
    return time.monotonic() - start if answer.startswith(b"HTTP/1.1 200") else None


async def health_latencies(host: str, port: int, until: float, report: FloodReport) -> None:
    """``health_once`` every 0.2 s until ``until``, into ``report``."""
    while time.monotonic() < until:
        took = await health_once(host, port)
        if took is None:
            report.health_failures += 1
        else:
            report.health_s.append(took)
        await asyncio.sleep(0.2)


async def flood(url: str, n_idle: int, n_slow: int, watch_s: float) -> FloodReport:
    """Opens ``n_slow`` slowloris and ``n_idle`` idle connections to ``url`` at once and watches
    them and /health until ``watch_s`` seconds after the first connect."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    until = time.monotonic() + watch_s
    report = FloodReport()
    conns = [asyncio.create_task(connect(host, port)) for _ in range(n_slow + n_idle)]
    report.burst_health_s = await health_once(host, port)
    opened = await asyncio.gather(*conns)
    slow = [asyncio.create_task(slowloris(c, until)) for c in opened[:n_slow]]
    idles = [asyncio.create_task(lifetime(c, until)) for c in opened[n_slow:]]
    await health_latencies(host, port, until, report)
    report.idle_lived = list(await asyncio.gather(*idles))
    report.slow_lived = list(await asyncio.gather(*slow))
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--slow", type=int, default=20)
    ap.add_argument("--watch", type=float, default=15.0)
    args = ap.parse_args()
    print(asyncio.run(flood(args.url, args.idle, args.slow, args.watch)).summary())


if __name__ == "__main__":
    main()
