"""Hook points of the PD engines and the bug variants behind them (``engine.variants``).

``DecodeHooks`` and ``PrefillHooks`` hold the correct behaviour; each mixin below reproduces
one zoo entry (its description is the patch's in ``engine.patches``) by overriding one hook.
"""

from __future__ import annotations

from engine.variants import variant


class DecodeHooks:
    """Decisions of the decode engine's transfer queue, correct by default."""

    def stray_tag(self, decode, tag) -> None:
        """A DONE/FAILED tag for a room whose transfer state was cleared: it decoded before
        its prefill's done, or no entry, quarantine or settled record knows it. Dropped."""

    def on_waiting_timeout(self, decode, room) -> bool:
        """After a room timed out waiting for its KV: True when the hook finished it."""
        return False

    def waits_for_aux(self) -> bool:
        """Whether decoding starts only after the aux row's notification landed."""
        return True

    def aux_matches(self, aux_room: int, room: int) -> bool:
        """Whether the aux row read is this room's."""
        return aux_room == room

    def release_aux(self, free_aux: list[int], slot: int) -> None:
        free_aux.append(slot)

    def keeps_aborted_entry(self) -> bool:
        """Whether abort cleanup leaves the room's entry in the transfer queue."""
        return False

    def frees_aborted_pages_now(self, settled: bool) -> bool:
        """Whether an aborted room's pages are freed at once (else quarantined until the
        prefill's DONE/FAILED, so no one-sided WRITE can land in reused pages)."""
        return settled


class PrefillHooks:
    """Decisions of the prefill engine's prealloc handling and sender, correct by default."""

    def parks_under_lock(self) -> bool:
        """Whether a prealloc arriving before its request is parked while the lock that checked
        it is still held (else after, when its room may have registered meanwhile)."""
        return True

    def sends(self, buffer: str) -> bool:
        """Whether ``buffer`` is shipped to the decode."""
        return True

    def source_pages(self, last: list[int] | None, src: list[int], cached: int) -> list[int]:
        """The pages shipped for this room (``last``: the worker's previous room's pages;
        ``cached``: prefix pages served from the cache)."""
        return src


@variant("late_notification_recreates_room")
class RecreateOnLateTag(DecodeHooks):
    def stray_tag(self, decode, tag) -> None:
        from engine.disagg.state import RoomState

        decode.states.update(tag.room, RoomState.TRANSFERRING)  # a cleared room comes back


@variant("transfer_timeout_leaks_room")
class LeakOnTimeout(DecodeHooks):
    def on_waiting_timeout(self, decode, room) -> bool:
        del decode.transfer[room.room]  # pages and aux slot never return
        decode._emit_end(room.seq)
        return True


@variant("aux_read_before_landed")
class AuxBeforeLanded(DecodeHooks):
    def waits_for_aux(self) -> bool:
        return False

    def aux_matches(self, aux_room: int, room: int) -> bool:
        return aux_room in (room, 0)  # trusts a zero row: the aux has not landed yet


@variant("aux_slot_double_free")
class AuxDoubleFree(DecodeHooks):
    def release_aux(self, free_aux: list[int], slot: int) -> None:
        free_aux += [slot, slot]  # returned twice: two rooms will share it


@variant("abort_orphan_transfer_entry")
class OrphanOnAbort(DecodeHooks):
    def keeps_aborted_entry(self) -> bool:
        return True  # entry (and its aux slot) stays in the queue forever


@variant("late_write_after_abort")
class FreeOnAbort(DecodeHooks):
    def frees_aborted_pages_now(self, settled: bool) -> bool:
        return True  # the prefill may still be writing into them


@variant("prealloc_parked_after_check")
class ParkAfterCheck(PrefillHooks):
    def parks_under_lock(self) -> bool:
        return False


@variant("index_k_scale_not_sent")
class ScaleNotSent(PrefillHooks):
    def sends(self, buffer: str) -> bool:
        return buffer != "index_k_scale"


@variant("sender_stale_prefix_pages")
class StalePrefixPages(PrefillHooks):
    def source_pages(self, last: list[int] | None, src: list[int], cached: int) -> list[int]:
        if last is None:
            return src
        n = min(cached, len(last), len(src))
        return last[:n] + src[n:]  # the prefix from the previous room's pages
