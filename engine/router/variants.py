"""Hook points of the router's control plane and the variants behind them (``engine.variants``).
``RouterHooks`` is the correct behaviour; each mixin reproduces one zoo entry of
``engine.patches``."""

from __future__ import annotations

import asyncio
import random

from engine.variants import variant


class RouterHooks:
    """Choices of one router, fixed at construction."""

    async def draw_room(self, router) -> int:
        """A fresh bootstrap room for one request; correct: 63 bits of the OS's randomness,
        drawn without yielding to the event loop."""
        return router.room_rng.getrandbits(63)


@variant("router_room_block_refill_race")
class RoomBlockRefillRace(RouterHooks):
    """Rooms handed out from blocks of ``BLOCK``; a spent block is refilled by a reservation
    that takes ``REFILL_S`` (an await). Requests that waited on one refill each take the block's
    first room: the index was a local read before the await and not read again."""

    BLOCK = 4
    REFILL_S = 0.1
    _block: tuple[int, ...] = ()
    _next = 0
    _refill: asyncio.Event | None = None

    def _draw_block(self) -> None:
        rng = random.SystemRandom()
        self._block, self._next = tuple(rng.getrandbits(63) for _ in range(self.BLOCK)), 0

    async def draw_room(self, router) -> int:
        if not self._block:
            self._draw_block()  # the first block is reserved at startup
        i = self._next
        if i >= len(self._block):
            if self._refill is None:
                self._refill = event = asyncio.Event()
                await asyncio.sleep(self.REFILL_S)  # reserves the next block
                self._draw_block()
                self._refill = None
                event.set()
            else:
                await self._refill.wait()
            i = 0  # the block was refilled: start from its first room (self._next not re-read)
        self._next = i + 1
        return self._block[i]
