"""Hook points of the router's control plane and the variants behind them (``engine.variants``).
``RouterHooks`` is the correct behaviour; each mixin reproduces one zoo entry of
``engine.patches``."""

from __future__ import annotations

import asyncio
import logging

from engine.variants import variant

log = logging.getLogger("engine.router")


class RouterHooks:
    """Choices of one router, fixed at construction."""

    async def draw_room(self, router) -> int:
        """A fresh bootstrap room for one request; correct: 63 bits of the OS's randomness,
        drawn without yielding to the event loop."""
        return router.room_rng.getrandbits(63)


@variant("router_room_counter_race")
class RoomCounterRace(RouterHooks):
    _next: int | None = None

    async def draw_room(self, router) -> int:
        if self._next is None:
            self._next = router.room_rng.getrandbits(62)
        room = self._next
        await asyncio.sleep(0)  # logs the assignment: another handler runs in between
        log.debug("room %d drawn", room)
        self._next = room + 1
        return room
