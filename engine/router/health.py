"""Upstream health as the router sees it.

A server is healthy until a probe of its ``/health`` or a proxied request fails to reach it, and
healthy again once a probe answers 200; picks only see healthy servers, so the router stops
sending to a dead or restarting server and resumes when it is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx

log = logging.getLogger(__name__)


class NoHealthyServer(Exception):
    """Every server of a pool is marked unhealthy."""

    def __init__(self, role: str) -> None:
        super().__init__(f"no healthy {role} server")
        self.role = role


@dataclass(frozen=True)
class ServerHealth:
    url: str
    healthy: bool
    since: float  # Unix seconds of the last change
    reason: str = ""


class HealthTable:
    """The health of every upstream; ``healthy(pool)`` keeps the pool's order."""

    def __init__(self, servers: Sequence[str]) -> None:
        now = time.time()
        self._state = {u: ServerHealth(u, True, now) for u in servers}

    def mark(self, url: str, healthy: bool, reason: str = "") -> None:
        old = self._state.get(url)
        if old is not None and old.healthy != healthy:
            log.warning("upstream %s is %s%s", url, "back" if healthy else "unhealthy",
                        f": {reason}" if reason else "")
            self._state[url] = ServerHealth(url, healthy, time.time(), reason)

    def healthy(self, pool: Sequence[str]) -> tuple[str, ...]:
        return tuple(u for u in pool if self._state[u].healthy)

    def snapshot(self) -> list[dict]:
        return [asdict(s) for s in self._state.values()]


async def probe_forever(client: httpx.AsyncClient, table: HealthTable, servers: Sequence[str],
                        interval_s: float) -> None:
    """Probes every server's ``/health`` each ``interval_s`` seconds (timeout: the interval,
    at least 1 s) until cancelled."""
    timeout = max(1.0, interval_s)

    async def one(url: str) -> None:
        try:
            resp = await client.get(url + "/health", timeout=timeout)
            table.mark(url, resp.status_code == 200, f"/health answered {resp.status_code}")
        except httpx.HTTPError as exc:
            table.mark(url, False, f"{type(exc).__name__}")

    while True:
        await asyncio.gather(*(one(u) for u in servers))
        await asyncio.sleep(interval_s)
