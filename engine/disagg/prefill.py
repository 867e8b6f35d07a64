"""Prefill side of PD disaggregation.

Queues: bootstrap (request known, waiting for the decode's Prealloc) -> waiting (in the engine
scheduler) -> forward -> inflight (KV layers + aux WRITEs posted by a sender worker, polled until
done) -> Success / Failed. Sender workers are sharded by room. A room's pages stay owned by the
prefill until every posted WRITE completed, even when the room failed.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.core import Engine, FinishReason, Sequence
from engine.disagg.control import (
    MAX_EARLY_PREALLOCS,
    PeerBook,
    RejectedPrealloc,
    check_prealloc,
)
from engine.disagg.messages import AUX_WORDS, KV_BUFFERS, Aux, Prealloc, Tag, TagKind
from engine.disagg.state import RoomState, TransferStateTable
from engine.disagg.variants import PrefillHooks
from engine.disagg.views import PrefillViews
from engine.model import TinyDeepSeek
from engine.runtime import THREADS, Runtime
from engine.transfer.endpoint import PageWrite, TransferEndpoint, TransferStatus, Transport
from engine.variants import hooks_for

log = logging.getLogger(__name__)
PREALLOC_EXPIRED = "prealloc expired before the KV was sent"


@dataclass(eq=False)
class PrefillRoom:
    room: int
    seq: Sequence
    on_done: object  # Callable[[RoomState], None], called once from a worker or engine thread
    created: float = field(default_factory=time.monotonic)
    prealloc: Prealloc | None = None
    posted: int = 0
    handed: bool = False  # given to a sender worker, which reports done/failed to the decode


class PrefillEngine(PrefillViews, Engine):
    """An engine whose finished prefills hand their pages to the KV sender instead of freeing."""

    def __init__(self, cfg, name: str, sender_workers: int = 2,
                 bootstrap_timeout_s: float = 300.0, *, model: TinyDeepSeek | None = None,
                 runtime: Runtime = THREADS, transport: Transport = TransferEndpoint) -> None:
        """``runtime`` runs the sender workers and times their waits; ``transport`` builds the
        endpoint (NIXL in real mode; ``engine.sim.SimEndpoint`` in simulation)."""
        super().__init__(cfg, model=model, runtime=runtime)
        self.pd_hooks = hooks_for(PrefillHooks, cfg.patches)
        # A prefill request ends at its first token (max_tokens=1). With overlap scheduling that
        # token is processed a step late; like SGLang's PD prefill loop, never decode meanwhile.
        self.scheduler.prefill_only = self.overlap is not None
        self.aux = torch.zeros((sender_workers, AUX_WORDS), dtype=torch.int64)
        buffers = {**self.pool.buffers(), "aux": self.aux}
        self.endpoint = transport(name, buffers,
                                  page_dims={**{b: 1 for b in KV_BUFFERS}, "aux": 0})
        self.states = TransferStateTable(clock=runtime.monotonic)
        self.rooms: dict[int, PrefillRoom] = {}
        self.early: OrderedDict[int, Prealloc] = OrderedDict()  # bounded: MAX_EARLY_PREALLOCS
        self.peers: dict = {}
        self.peer_book = PeerBook()
        self.bootstrap_timeout_s = bootstrap_timeout_s
        self.on_transfer: Callable[[float, int], None] | None = None  # (seconds, bytes) per room
        self._lock = threading.Lock()
        self._last_sent: dict[int, list[int]] = {}  # worker -> source pages of its last room
        self.queues = [queue.Queue() for _ in range(sender_workers)]
        for i, q in enumerate(self.queues):
            runtime.start_thread(lambda i=i, q=q: self._sender(i, q), f"kv-sender-{i}")

    # ---- control plane (HTTP threads) ----
    def connect_peer(self, blob, key: bytes) -> None:
        """Connects a decode's NIXL agent; ``key`` is the one its preallocs are signed with
        (``RejectedPrealloc`` when the agent name is bound to another key)."""
        with self._lock:
            self.peer_book.bind(blob.agent_name, key)
            self.peers[blob.agent_name] = self.endpoint.connect(blob)

    def add_room(self, room: PrefillRoom) -> None:
        self.validate(room.seq.prompt, room.seq.params.max_tokens)
        room.created = self.runtime.monotonic()
        with self._lock:
            if self.states.get(room.room) is RoomState.FAILED or room.room in self.rooms:
                raise ValueError(f"room {room.room} already used")
            self.rooms[room.room] = room
            self.states.update(room.room, RoomState.BOOTSTRAPPING)
            early = self.early.pop(room.room, None)
        if early is not None:
            try:
                self._admit(early)
            except RejectedPrealloc as exc:
                self.abort_room(room.room, str(exc))

    def on_prealloc(self, msg: Prealloc) -> None:
        """A prealloc for a failed room is answered with "failed" so the decode frees at once.
        Raises ``RejectedPrealloc`` and keeps nothing for a prealloc its peer did not sign, that
        expired or replays an earlier one (``PeerBook.accept``), or that names another live
        room's pages (``check_prealloc``)."""
        with self._lock:
            self.peer_book.accept(msg, self.runtime.wall())
        self._admit(msg)

    def _admit(self, msg: Prealloc) -> None:
        failed = self.states.get(msg.room) is RoomState.FAILED
        now = self.runtime.wall()
        with self._lock:
            held = {r.room: r.prealloc for r in self.rooms.values()
                    if r.prealloc is not None and r.prealloc.expires_at >= now}
            check_prealloc(msg, set(self.peers), held)
            room = self.rooms.get(msg.room)
            early = room is None and not failed
            if early and self.pd_hooks.parks_under_lock():
                self._park(msg)
                return
            if room is not None:
                if room.prealloc is not None:
                    raise RejectedPrealloc(f"room {msg.room} is already preallocated")
                room.prealloc = msg
        if early:  # parked past the lock (a hook's choice): its room may have registered since
            self.runtime.point(f"prefill parks prealloc {msg.room}")
            with self._lock:
                self._park(msg)
            return
        if room is None:
            self._notify_failed(msg)
        elif self.states.update(msg.room, RoomState.WAITING_FOR_INPUT) is RoomState.FAILED:
            self.call_soon(lambda: self._abort_on_loop(room))
        else:
            self.submit(room.seq)

    def _park(self, msg: Prealloc) -> None:
        """Keeps (bounded) a prealloc that came before its room's request (lock held)."""
        self.early[msg.room] = msg
        while len(self.early) > MAX_EARLY_PREALLOCS:
            self.early.popitem(last=False)

    def abort_room(self, room_id: int, reason: str) -> None:
        """Fails ``room_id``; a decode that already preallocated for it (even before this
        prefill saw the request) is told at once, so it never waits out its quarantine."""
        self.states.fail(room_id, reason)
        with self._lock:
            room = self.rooms.get(room_id)
            early = self.early.pop(room_id, None)
        if early is not None:
            self._notify_failed(early)
        if room is not None:
            self.call_soon(lambda: self._abort_on_loop(room))

    def _notify_failed(self, msg: Prealloc | None) -> None:
        """Tells the decode that preallocated for ``msg`` (if any) the room failed; a peer that
        is gone is logged, never raised (the engine loop calls this)."""
        if msg is None:
            return
        peer = self.peers.get(msg.peer)
        if peer is None:
            return
        try:
            self.endpoint.send_notif(peer, Tag(msg.room, TagKind.FAILED).encode())
        except Exception as exc:  # noqa: BLE001 - NIXL raises its own types for a lost peer
            log.warning("room %d: cannot tell decode %s it failed: %s", msg.room, msg.peer, exc)

    # ---- engine thread ----
    def _abort_on_loop(self, room: PrefillRoom) -> None:
        """Aborts a room wherever it is: scheduled, not yet submitted, or already sending."""
        if room.handed or room.room not in self.rooms:
            return  # the sender reports; or already failed
        if self.scheduler.find(room.seq.rid) is not None:
            self._abort(room.seq.rid)
        else:
            self._fail(room, "aborted before prefill")

    def poll(self) -> None:
        now = self.runtime.monotonic()
        for room in list(self.rooms.values()):
            late = room.prealloc is None and now - room.created > self.bootstrap_timeout_s
            if late:
                self._fail(room, "bootstrap timeout")
            elif self._expired(room) and not room.handed:
                self.states.fail(room.room, PREALLOC_EXPIRED)
                self._abort_on_loop(room)

    def _expired(self, room: PrefillRoom) -> bool:
        """Past its prealloc's validity the decode may give those pages to another room."""
        return room.prealloc is not None and self.runtime.wall() > room.prealloc.expires_at

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        room = next((r for r in self.rooms.values() if r.seq is seq), None)
        if room is None or reason in (FinishReason.ABORT, FinishReason.ERROR) or not seq.output:
            super()._finish(seq, reason)
            if room is not None:
                self._fail(room, "aborted before transfer")
            return
        self.scheduler.finish(seq, reason, release=False)
        self.stats.finished[reason.value] += 1
        if self.states.update(room.room, RoomState.TRANSFERRING) is RoomState.FAILED:
            self._forget(room)
            self._notify_failed(room.prealloc)
            self._release(room, RoomState.FAILED)
            return
        room.handed = True
        self.queues[room.room % len(self.queues)].put(room)

    def _fail(self, room: PrefillRoom, reason: str) -> None:
        """Fails a room that was never handed to a sender; the decode is told right away."""
        self.states.fail(room.room, reason)
        with self._lock:
            self.rooms.pop(room.room, None)
        self._notify_failed(room.prealloc)
        room.on_done(RoomState.FAILED)

    def _forget(self, room: PrefillRoom) -> None:
        """Drops a room that writes no more from the live set, before the decode hears it is
        done/failed: the decode may reuse its pages at once, and a prealloc naming them must not
        be refused as another live room's (the soak's 409s)."""
        with self._lock:
            self.rooms.pop(room.room, None)

    def _release(self, room: PrefillRoom, final: RoomState) -> None:
        def free() -> None:
            self.capture(room.seq)
            self.scheduler.release(room.seq)
        self.call_soon(free)
        with self._lock:
            self.rooms.pop(room.room, None)
        room.on_done(final)

    # ---- sender workers ----
    def _sender(self, worker: int, jobs: queue.Queue) -> None:
        count = 0
        while True:
            room = self.runtime.get(jobs)
            self.runtime.sleep(self.faults.peer_pause(count))
            count += 1
            try:
                final = self._send(worker, room)
            except Exception as exc:  # noqa: BLE001 - a lost peer fails its room, not the worker
                log.warning("room %d transfer failed: %s: %s", room.room, type(exc).__name__, exc)
                self.states.fail(room.room, str(exc))
                final = RoomState.FAILED
            self._release(room, final)

    def _send(self, worker: int, room: PrefillRoom) -> RoomState:
        peer = self.peers[room.prealloc.peer]
        S = self.pool.page_size
        n_pages = -(-len(room.seq.prompt) // S)
        src, dst = room.seq.pages[:n_pages], room.prealloc.dst_pages[:n_pages]
        src = self._patched_source(worker, room, src)
        buffers = tuple(b for b in KV_BUFFERS if self.pd_hooks.sends(b))
        layer_bytes = sum(self.pool.page_bytes().values()) * n_pages
        handles, t0 = [], self.runtime.monotonic()
        for layer in range(self.model.cfg.n_layers):
            if self._expired(room):
                self.states.fail(room.room, PREALLOC_EXPIRED)
            if self.states.get(room.room) is RoomState.FAILED:
                break
            self.runtime.sleep(self.faults.transfer_delay((room.room, layer), layer_bytes))
            for job in room.seq.load_jobs:
                job.note_send(layer)
            writes = [PageWrite(b, src, dst, layer) for b in buffers]
            layer_tag = Tag(room.room, TagKind.LAYER, layer).encode()
            handles.append(self.endpoint.write_pages(peer, writes, layer_tag))
            room.posted += 1
        failed = self.states.get(room.room) is RoomState.FAILED
        if not failed:
            self.runtime.sleep(self.faults.aux_delay(room.room))
            lp = room.seq.logprobs[0].logprob if room.seq.logprobs else math.nan
            aux = Aux(room.room, room.seq.output[0], room.seq.num_cached, len(room.seq.prompt),
                      lp)
            self.aux[worker] = torch.tensor(aux.words())
            aux_write = PageWrite("aux", [worker], [room.prealloc.aux_slot])
            aux_tag = Tag(room.room, TagKind.AUX).encode()
            handles.append(self.endpoint.write_pages(peer, [aux_write], aux_tag))
        ok = self._wait_all(handles)
        final = RoomState.SUCCESS if ok and not failed else RoomState.FAILED
        if final is RoomState.SUCCESS and self.on_transfer is not None:
            self.on_transfer(self.runtime.monotonic() - t0, layer_bytes * self.model.cfg.n_layers)
        kind = TagKind.DONE if final is RoomState.SUCCESS else TagKind.FAILED
        self._forget(room)
        self.runtime.sleep(self.faults.done_delay(room.room))
        self.endpoint.send_notif(peer, Tag(room.room, kind).encode())
        self.states.update(room.room, final)
        return final

    def _patched_source(self, worker: int, room: PrefillRoom, src: list[int]) -> list[int]:
        """The pages shipped for ``room`` (the hook's; this worker's previous room's pages are
        remembered for it)."""
        last = self._last_sent.get(worker)
        self._last_sent[worker] = list(src)
        return self.pd_hooks.source_pages(last, src, room.seq.num_cached // self.pool.page_size)

    def _wait_all(self, handles, timeout_s: float = 60.0) -> bool:
        ok = True
        for h in handles:
            ok &= self.endpoint.wait(h, timeout_s=timeout_s) is TransferStatus.DONE
            self.endpoint.release(h)
        return ok
