"""The decode's records of a room: its entry while KV is on the way, and the hold on its pages
and aux slot until the prefill has dropped it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.core.sequence import Sequence
from engine.disagg.messages import Tag

CLIENT_ABORT, WAITING_TIMEOUT = "client abort", "waiting timeout"  # room failure reasons
UNREACHABLE = "prefill unreachable"


@dataclass(eq=False)
class DecodeRoom:
    room: int
    seq: Sequence
    prefill_url: str
    created: float = field(default_factory=time.monotonic)
    transfer_since: float | None = None  # when it entered the transfer queue (pages reserved)
    arrived: set[Tag] = field(default_factory=set)
    aux_slot: int | None = None
    orphaned: bool = False
    writable_until: float = 0.0  # monotonic: past it the prefill writes nothing (prealloc TTL)

    def arrived_labels(self) -> list[str]:
        return sorted(t.label for t in self.arrived)


@dataclass(frozen=True)
class Quarantine:
    """Pages and aux slot held back from reuse until the prefill drops their room (its
    done/failed) or ``deadline``; ``decoded``: the room ran, so its slot goes back through the
    ``release_aux`` hook as a decoded room's does."""

    pages: tuple[int, ...]
    aux_slot: int | None
    deadline: float
    decoded: bool = False
