"""Read-only views of the PD engines' queues, for ``/debug/queues`` and the metrics gauges
(any thread; a view may be a step stale)."""

from __future__ import annotations

from engine.disagg.state import RoomState


class PrefillViews:
    """Mixed into ``PrefillEngine``."""

    def queue_sizes(self) -> dict[str, int]:
        """Rooms per prefill queue (any thread; a scrape may be a step stale)."""
        states = [self.states.get(r.room) for r in list(self.rooms.values())]
        return {"bootstrap": states.count(RoomState.BOOTSTRAPPING) + states.count(None),
                "waiting": states.count(RoomState.WAITING_FOR_INPUT),
                "inflight": states.count(RoomState.TRANSFERRING)}

    def queue_snapshot(self) -> dict:
        now = self.runtime.monotonic()

        def view(r) -> dict:
            return {"room": r.room, "rid": r.seq.rid, "age_s": round(now - r.created, 3),
                    "state": (self.states.get(r.room) or RoomState.BOOTSTRAPPING).name,
                    "posted_layers": r.posted}
        rooms = list(self.rooms.values())
        return {"bootstrap": [view(r) for r in rooms if r.prealloc is None],
                "waiting": [view(r) for r in rooms if r.prealloc is not None
                            and self.states.get(r.room) is RoomState.WAITING_FOR_INPUT],
                "inflight": [view(r) for r in rooms
                             if self.states.get(r.room) is RoomState.TRANSFERRING]}


class DecodeViews:
    """Mixed into ``DecodeEngine``."""

    def queue_sizes(self) -> dict[str, int]:
        """Rooms per decode queue (any thread; a scrape may be a step stale)."""
        return {"prealloc": len(self.prealloc), "transfer": len(self.transfer),
                "quarantine": len(self.quarantine)}

    def queue_snapshot(self) -> dict:
        now = self.runtime.monotonic()

        def view(r) -> dict:
            return {"room": r.room, "rid": r.seq.rid, "age_s": round(now - r.created, 3),
                    "state": (self.states.get(r.room) or RoomState.BOOTSTRAPPING).name,
                    "arrived": r.arrived_labels(), "orphaned": r.orphaned}
        return {"prealloc": [view(r) for r in self.prealloc],
                "transfer": [view(r) for r in self.transfer.values()],
                "running": [{"rid": s.rid, "tokens": s.num_tokens} for s in
                            self.scheduler.running],
                "quarantine": [{"room": r, "pages": len(q.pages)}
                               for r, q in self.quarantine.items()],
                "late_writes": self.late_writes, "quarantined_writes": self.quarantined_writes,
                "late_notifications": self.late_notifications}
