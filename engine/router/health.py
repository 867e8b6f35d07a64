"""Upstream health as the router sees it.

A server is unhealthy once a connection to it is refused (a probe or a proxied request: the
process is gone) or after ``FAILURE_THRESHOLD`` consecutive failed probes (timeouts or non-200
answers: a busy server is slow, not dead), and healthy again once a probe answers 200. Picks
only see healthy servers, so the router stops sending to a dead or restarting server and resumes
when it is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx

log = logging.getLogger(__name__)
FAILURE_THRESHOLD = 3  # consecutive failed probes (not refusals) before a server is unhealthy
PROBE_TIMEOUT_S = 5.0


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
        self._fails = dict.fromkeys(servers, 0)

    def mark(self, url: str, healthy: bool, reason: str = "") -> None:
        old = self._state.get(url)
        if old is not None and old.healthy != healthy:
            log.warning("upstream %s is %s%s", url, "back" if healthy else "unhealthy",
                        f": {reason}" if reason else "")
            self._state[url] = ServerHealth(url, healthy, time.time(), reason)

    def probed(self, url: str, ok: bool, reason: str = "", refused: bool = False) -> None:
        """Records one probe: healthy on success; unhealthy at once when ``refused``, else after
        ``FAILURE_THRESHOLD`` failures in a row."""
        self._fails[url] = 0 if ok else self._fails.get(url, 0) + 1
        if ok or refused or self._fails[url] >= FAILURE_THRESHOLD:
            self.mark(url, ok, reason)

    def healthy(self, pool: Sequence[str]) -> tuple[str, ...]:
        return tuple(u for u in pool if self._state[u].healthy)

    def snapshot(self) -> list[dict]:
        return [asdict(s) for s in self._state.values()]


async def probe(client: httpx.AsyncClient, table: HealthTable, url: str) -> None:
    """One probe of ``url``'s ``/health`` (timeout ``PROBE_TIMEOUT_S``), recorded in ``table``."""
    try:
        resp = await client.get(url + "/health", timeout=PROBE_TIMEOUT_S)
        table.probed(url, resp.status_code == 200, f"/health answered {resp.status_code}")
    except httpx.ConnectError as exc:
        table.probed(url, False, f"{type(exc).__name__}", refused=True)
    except httpx.HTTPError as exc:
        table.probed(url, False, f"{type(exc).__name__}")


async def recheck(client: httpx.AsyncClient, table: HealthTable, servers: Sequence[str]) -> None:
    """Probes the unhealthy ``servers`` once now (a restarted server is used at once instead of
    after the next periodic probe)."""
    down = [u for u in servers if u not in table.healthy(servers)]
    await asyncio.gather(*(probe(client, table, u) for u in down))


async def probe_forever(client: httpx.AsyncClient, table: HealthTable, servers: Sequence[str],
                        interval_s: float) -> None:
    """Probes every server's ``/health`` each ``interval_s`` seconds until cancelled."""
    while True:
        await asyncio.gather(*(probe(client, table, u) for u in servers))
        await asyncio.sleep(interval_s)
