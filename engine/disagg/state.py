"""Room-keyed transfer state machine shared by the prefill and decode sides.

States are ordered Bootstrapping < WaitingForInput < Transferring < Success; a room only moves
forward. Failed is sticky: once a room failed it stays failed, and ``clear()`` (which forgets a
finished room) never lets a later update resurrect it.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


class RoomState(enum.IntEnum):
    BOOTSTRAPPING = 0
    WAITING_FOR_INPUT = 1
    TRANSFERRING = 2
    SUCCESS = 3
    FAILED = 4


@dataclass(frozen=True)
class RoomRecord:
    room: int
    state: RoomState
    since: float
    reason: str = ""


class TransferStateTable:
    """Thread-safe table of rooms; failed rooms are remembered (bounded) after ``clear``.

    Bounded: a room in Success or Failed for ``grace_s`` is forgotten (a failed one stays in the
    bounded failed memory, so it still reads Failed and is never resurrected)."""

    def __init__(self, remember_failed: int = 65536, grace_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rooms: dict[int, RoomRecord] = {}
        self._failed: OrderedDict[int, str] = OrderedDict()
        self._remember = remember_failed
        self.grace_s = grace_s
        self._pruned_at = clock()

    def update(self, room: int, state: RoomState, reason: str = "") -> RoomState:
        """Moves ``room`` to ``state`` if that is forward; returns the room's resulting state."""
        with self._lock:
            if room in self._failed:
                return RoomState.FAILED
            cur = self._rooms.get(room)
            if cur is not None and (cur.state is RoomState.FAILED or state <= cur.state):
                return cur.state
            now = self._clock()
            self._rooms[room] = RoomRecord(room, state, now, reason)
            if state is RoomState.FAILED:
                self._remember_failed(room, reason)
            if now - self._pruned_at >= min(1.0, self.grace_s):
                self._prune(now)
            return state

    def _prune(self, now: float) -> None:
        self._pruned_at = now
        done = [r.room for r in self._rooms.values() if r.state >= RoomState.SUCCESS
                and now - r.since >= self.grace_s]
        for room in done:
            del self._rooms[room]

    def __len__(self) -> int:
        with self._lock:
            return len(self._rooms)

    def fail(self, room: int, reason: str) -> None:
        self.update(room, RoomState.FAILED, reason)

    def _remember_failed(self, room: int, reason: str) -> None:
        self._failed[room] = reason
        while len(self._failed) > self._remember:
            self._failed.popitem(last=False)

    def get(self, room: int) -> RoomState | None:
        with self._lock:
            if room in self._failed:
                return RoomState.FAILED
            rec = self._rooms.get(room)
            return rec.state if rec else None

    def reason(self, room: int) -> str | None:
        """Why ``room`` failed, or None when it has not (or is forgotten)."""
        with self._lock:
            if room in self._failed:
                return self._failed[room]
            rec = self._rooms.get(room)
            return rec.reason if rec is not None and rec.state is RoomState.FAILED else None

    def clear(self, room: int) -> None:
        with self._lock:
            self._rooms.pop(room, None)

    def snapshot(self) -> list[RoomRecord]:
        now = self._clock()
        with self._lock:
            return [RoomRecord(r.room, r.state, round(now - r.since, 4), r.reason)
                    for r in self._rooms.values()]
