"""Seeded fault injection: delays proportional to bytes moved, with jitter, and peer pauses.

Every decision is a pure function of ``(seed, kind, key)``: the same seed and workload give the
same injected delays in the same places. What stays nondeterministic on CPU is thread scheduling
(the compute side of a race); the injected windows are chosen much wider than that noise, so the
outcome of each race is decided by the injected delays.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class FaultConfig:
    """``*_ns_per_byte``: injected copy time per byte; ``*_jitter``: +- fraction of it."""

    seed: int = 0
    transfer_ns_per_byte: float = 0.0
    transfer_jitter: float = 0.0
    transfer_fixed_ms: float = 0.0
    hicache_ns_per_byte: float = 0.0
    hicache_jitter: float = 0.0
    peer_pause_every: int = 0
    peer_pause_ms: float = 0.0
    aux_delay_ms: float = 0.0  # the aux row's WRITE is posted this long after the last layer's
    done_delay_ms: float = 0.0  # the done/failed notification is posted this long after the writes
    fail_steps: tuple[int, ...] = ()  # engine steps (1-based, counted by the engine) that raise

    def __post_init__(self) -> None:
        object.__setattr__(self, "fail_steps", tuple(int(s) for s in self.fail_steps))
        for name, value in asdict(self).items():
            values = value if isinstance(value, tuple) else (value,)
            if name != "seed" and any(v < 0 for v in values):
                raise ValueError(f"fault option {name} must be >= 0, got {value}")
        if self.transfer_jitter > 1 or self.hicache_jitter > 1:
            raise ValueError("jitter is a fraction in [0, 1]")

    @property
    def active(self) -> bool:
        return any(v for k, v in asdict(self).items() if k != "seed")


class InjectedFault(RuntimeError):
    """Raised by an engine step ``FaultConfig.fail_steps`` names."""


class FaultInjector:
    def __init__(self, cfg: FaultConfig) -> None:
        self.cfg = cfg
        self._steps = 0

    def step(self) -> None:
        """Counts an engine step that runs a batch; raises ``InjectedFault`` on a failing one."""
        self._steps += 1
        if self._steps in self.cfg.fail_steps:
            raise InjectedFault(f"injected failure of engine step {self._steps}")

    def _uniform(self, kind: str, key: object) -> float:
        digest = hashlib.sha256(f"{self.cfg.seed}|{kind}|{key}".encode()).digest()
        return random.Random(digest).uniform(-1.0, 1.0)

    def _delay(self, kind: str, key: object, nbytes: int, ns_per_byte: float, jitter: float,
               fixed_ms: float = 0.0) -> float:
        base = nbytes * ns_per_byte * 1e-9 + fixed_ms * 1e-3
        return max(0.0, base * (1.0 + jitter * self._uniform(kind, key)))

    def transfer_delay(self, key: object, nbytes: int) -> float:
        """Seconds to hold a NIXL write of ``nbytes`` identified by ``key`` (room, layer)."""
        c = self.cfg
        return self._delay("transfer", key, nbytes, c.transfer_ns_per_byte, c.transfer_jitter,
                           c.transfer_fixed_ms)

    def aux_delay(self, key: object) -> float:
        """Seconds between a room's last layer WRITE and its aux WRITE (NIXL orders neither the
        writes nor their notifications); ``transfer_jitter`` applies."""
        c = self.cfg
        return self._delay("aux", key, 0, 0.0, c.transfer_jitter, c.aux_delay_ms)

    def done_delay(self, key: object) -> float:
        """Seconds between a room's completed writes and its done/failed notification (a
        control message may reach the decode well after the data, as SGLang's ZMQ status does);
        ``transfer_jitter`` applies."""
        c = self.cfg
        return self._delay("done", key, 0, 0.0, c.transfer_jitter, c.done_delay_ms)

    def hicache_delay(self, key: object, nbytes: int) -> float:
        """Seconds a host->device load-back copy of ``nbytes`` takes (key: job, layer, buffer)."""
        c = self.cfg
        return self._delay("hicache", key, nbytes, c.hicache_ns_per_byte, c.hicache_jitter)

    def peer_pause(self, counter: int) -> float:
        """Pause (seconds) a peer-facing loop takes on its ``counter``-th iteration."""
        every = self.cfg.peer_pause_every
        return self.cfg.peer_pause_ms * 1e-3 if every and counter % every == every - 1 else 0.0
