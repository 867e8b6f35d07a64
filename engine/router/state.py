"""PD routing state, free of HTTP: server-pick policies, router config, the room log.

``POLICIES`` maps policy names to factories taking the router's seeded ``random.Random``;
unknown names raise ``UnknownVariantError`` listing the valid ones.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol
from urllib.parse import urlsplit

from engine.config import EngineConfig
from engine.registry import Registry


class Policy(Protocol):
    """Picks one server of a pool for each request."""

    def pick(self, servers: Sequence[str]) -> str: ...


class RoundRobin:
    """Cycles through the pool in order."""

    def __init__(self, rng: random.Random) -> None:
        self._next = 0

    def pick(self, servers: Sequence[str]) -> str:
        server = servers[self._next % len(servers)]
        self._next += 1
        return server


class RandomChoice:
    """Uniform choice from the router's seeded RNG."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, servers: Sequence[str]) -> str:
        return self._rng.choice(list(servers))


POLICIES: Registry[Callable[[random.Random], Policy]] = Registry("routing policy")
POLICIES.register("round_robin", RoundRobin)
POLICIES.register("random", RandomChoice)


def check_url(url: str) -> str:
    """``url`` without a trailing slash; raises ``ValueError`` unless it is http(s)://host[:port]."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"server URL must be http(s)://host[:port], got {url!r}")
    return url.rstrip("/")


@dataclass(frozen=True)
class RouterConfig:
    """Server pools, policy, seed of the policy's picks (None: the OS's randomness), upstream
    timeout, room-history size, who may read ``/debug/*`` and the deployment's PD secret
    (sent to every upstream as ``X-PD-Secret``; servers of PD roles refuse rooms without it).

    Rooms always come from the OS's randomness, seeded or not: a seed replays which servers
    serve which request, never which room numbers go on the wire (a predictable room can be
    squatted). Secrets and tokens stay out of ``repr`` (the router logs its config)."""

    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    seed: int | None = None
    policy: str = "round_robin"
    timeout_s: float = 300.0
    history: int = 4096
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies get 413
    debug_token: str | None = field(default=None, repr=False)
    debug_open: bool = False  # /debug/* without a token (loopback callers only)
    health_interval_s: float = 1.0  # upstream /health probes (0: never; servers stay eligible)
    secret: str | None = field(default=None, repr=False)
    patches: frozenset[str] = frozenset()  # zoo variants of the router (``engine.patches``)

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("need at least one prefill and one decode server")
        object.__setattr__(self, "prefill", tuple(check_url(u) for u in self.prefill))
        object.__setattr__(self, "decode", tuple(check_url(u) for u in self.decode))
        POLICIES.get(self.policy)
        # parsed as the engines parse theirs, so a variant planted there reaches the router too
        object.__setattr__(self, "patches", EngineConfig(patches=self.patches).patches)
        if self.timeout_s <= 0 or self.history < 1 or self.health_interval_s < 0:
            raise ValueError("timeout_s must be > 0, history >= 1, health_interval_s >= 0")


@dataclass(frozen=True)
class RoomAssignment:
    """One request's room and servers; ``status`` is the HTTP status answered, 499 if the
    client left, ``None`` while running. Times are Unix seconds."""

    room: int
    prefill: str
    decode: str
    started: float
    finished: float | None = None
    status: int | None = None


class RoomLog:
    """The most recent ``capacity`` assignments, oldest first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: dict[int, RoomAssignment] = {}

    def add(self, a: RoomAssignment) -> None:
        """Records a new assignment, dropping the oldest past ``capacity``."""
        self._items[a.room] = a
        while len(self._items) > self.capacity:
            del self._items[next(iter(self._items))]

    def finish(self, room: int, status: int) -> None:
        """Stamps the room's end and status; only the first call counts."""
        a = self._items.get(room)
        if a is not None and a.status is None:
            self._items[room] = replace(a, finished=time.time(), status=status)

    def recent(self, limit: int) -> list[RoomAssignment]:
        return list(self._items.values())[-limit:]


def bootstrap_fields(a: RoomAssignment) -> dict:
    """The bootstrap fields both servers get: the prefill URL's host and port, and the room."""
    parts = urlsplit(a.prefill)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"bootstrap_host": parts.hostname, "bootstrap_port": port, "bootstrap_room": a.room}
