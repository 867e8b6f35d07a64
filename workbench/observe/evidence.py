"""Race, fault and drain evidence of an embedded PD pair, for every buffer and every path.

``collect(pair)`` snapshots what the servers' debug routes record: reads and sends of any HiCache
buffer (index-K, K/V) before its layer landed, decode late writes, and Failed rooms with their
reasons. ``Evidence.since(before)`` is what one burst added. ``settle(pair)`` waits for the pair
to drain after load and reports what stayed: queued rooms, rooms stuck in a non-terminal
transfer state, pages neither free nor cached. None of it knows which bug is being looked for.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field

from workbench.deploy import Capability, PDPair

STALE_KINDS = ("stale_reads", "stale_sends", "stale_kv_reads", "stale_kv_sends")
TERMINAL_STATES = ("SUCCESS", "FAILED")
_QUEUE_KEYS = ("prealloc", "transfer", "running", "quarantine", "bootstrap", "waiting",
               "inflight")


def reason_kind(reason: str) -> str:
    """A failure reason with its numbers replaced by ``N`` (``aux room N != N``), for counting."""
    return re.sub(r"\d+", "N", reason)


@dataclass(frozen=True)
class Evidence:
    """Counts over the pair's servers. ``stale`` maps each of ``STALE_KINDS`` to the number of
    layer accesses that raced a HiCache load; ``failed`` is the set of ``(role, room, reason)``
    rooms Failed within the servers' bookkeeping grace."""

    stale: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STALE_KINDS, 0))
    late_writes: int = 0
    failed: frozenset[tuple[str, int, str]] = frozenset()

    def since(self, before: Evidence) -> Evidence:
        """What happened after ``before`` (counters subtracted, rooms set-differenced)."""
        return Evidence({k: self.stale[k] - before.stale.get(k, 0) for k in STALE_KINDS},
                        self.late_writes - before.late_writes, self.failed - before.failed)

    def reasons(self) -> Counter:
        """Failed rooms per reason kind (``reason_kind``)."""
        return Counter(reason_kind(r) for _, _, r in self.failed)

    def row(self) -> dict[str, int]:
        return {**self.stale, "late_writes": self.late_writes, "failed_rooms": len(self.failed)}


def collect(pair: PDPair) -> Evidence:
    """Current evidence of an embedded pair (an empty ``Evidence`` for other backends)."""
    if Capability.DEBUG_QUEUES not in pair.backend.capabilities:
        return Evidence()
    stale = dict.fromkeys(STALE_KINDS, 0)
    failed: set[tuple[str, int, str]] = set()
    late = 0
    for role, servers in (("prefill", pair.prefill), ("decode", pair.decode)):
        for srv in servers:
            for job in pair.debug("/debug/hicache", srv)["jobs"]:
                for kind in STALE_KINDS:
                    stale[kind] += len(job.get(kind, ()))
            failed |= {(role, r["room"], r["reason"]) for r in
                       pair.debug("/debug/transfers", srv)["rooms"] if r["state"] == "FAILED"}
            if role == "decode":
                late += int(pair.debug("/debug/queues", srv).get("late_writes", 0))
    return Evidence(stale, late, frozenset(failed))


@dataclass(frozen=True)
class Drain:
    """What stayed after load: ``left`` maps ``"role:what"`` to a nonzero count (queued rooms
    per queue, ``stuck_rooms`` in a non-terminal transfer state, ``pages_in_use``)."""

    drained: bool
    waited_s: float
    left: dict[str, int]

    @property
    def leftover(self) -> int:
        return sum(self.left.values())


def leftovers_of(role: str, queues: dict, rooms: list[dict]) -> Counter:
    """What one server holds, from its ``/debug/queues`` view (queues and ``pages``) and its
    ``/debug/transfers`` rooms: ``"role:what"`` -> count (zeros included). The one definition
    of a leftover, for real servers and simulated ones (``workbench.sim``)."""
    left: Counter = Counter()
    for key in _QUEUE_KEYS:
        left[f"{role}:{key}"] += len(queues.get(key, ()))
    pages = queues.get("pages", {})
    left[f"{role}:pages_in_use"] += pages.get("total", 0) - pages.get("free", 0) \
        - pages.get("cached", 0)
    left[f"{role}:stuck_rooms"] += sum(r["state"] not in TERMINAL_STATES for r in rooms)
    return left


def _leftovers(pair: PDPair) -> dict[str, int]:
    left: Counter = Counter()
    for role, servers in (("prefill", pair.prefill), ("decode", pair.decode)):
        for srv in servers:
            left.update(leftovers_of(role, pair.debug("/debug/queues", srv),
                                     pair.debug("/debug/transfers", srv)["rooms"]))
    return {k: v for k, v in left.items() if v}


def settle(pair: PDPair, timeout_s: float = 10.0, poll_s: float = 0.25) -> Drain:
    """Waits up to ``timeout_s`` for an idle pair to drain; ``drained`` is False when something
    stayed (a leak or a wedge). Backends without debug queues are reported drained."""
    if Capability.DEBUG_QUEUES not in pair.backend.capabilities:
        return Drain(True, 0.0, {})
    t0 = time.monotonic()
    while True:
        left = _leftovers(pair)
        waited = round(time.monotonic() - t0, 2)
        if not left or waited >= timeout_s:
            return Drain(not left, waited, left)
        time.sleep(poll_s)
