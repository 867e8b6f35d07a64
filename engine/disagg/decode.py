"""Decode side of PD disaggregation.

Queues: prealloc (reserve pages, tell the prefill where to write) -> transfer (poll NIXL
notifications until every KV layer and the aux row landed, check the aux's room) -> running batch.
Aborts mark the room Failed; cleanup happens on the next poll. The fixed cleanup removes the
transfer entry and quarantines its pages until the prefill reports done/failed for the room (or a
timeout no earlier than the prealloc's expiry), because the prefill may still be writing into
them. A room that decodes before its prefill's done keeps its pages and aux slot until that done
too, so no prealloc ever names pages the prefill still holds for another room. Preallocs are
signed with this decode's own key (``PeerIdentity``), numbered and time-limited.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable

import torch

from engine.core import Engine
from engine.core.scheduler import pages_for
from engine.core.sequence import (
    Failure,
    FailureKind,
    FinishReason,
    Sequence,
    Status,
    TokenEvent,
    TokenLogprob,
)
from engine.disagg.bootstrap import BootstrapClient
from engine.disagg.control import CLOCK_SKEW_S
from engine.disagg.messages import (
    AUX_WORDS,
    KV_BUFFERS,
    Aux,
    PeerIdentity,
    Prealloc,
    PreallocSigner,
    Tag,
    TagKind,
)
from engine.disagg.rooms import CLIENT_ABORT, UNREACHABLE, WAITING_TIMEOUT, DecodeRoom, Quarantine
from engine.disagg.state import RoomState, TransferStateTable
from engine.disagg.variants import DecodeHooks
from engine.disagg.views import DecodeViews
from engine.model import TinyDeepSeek
from engine.runtime import THREADS, Runtime
from engine.transfer.endpoint import TransferEndpoint, Transport
from engine.variants import hooks_for

log = logging.getLogger(__name__)
BootstrapFactory = Callable[..., BootstrapClient]  # (endpoint, on_failed=) -> client
SETTLED_MEMORY = 4096  # rooms whose done/failed arrived, remembered for late notifications


class DecodeEngine(DecodeViews, Engine):
    def __init__(self, cfg, name: str, max_transfer_queue: int = 32,
                 waiting_timeout_s: float = 30.0, quarantine_s: float = 30.0, *,
                 secret: str, model: TinyDeepSeek | None = None, runtime: Runtime = THREADS,
                 transport: Transport = TransferEndpoint,
                 bootstrap: BootstrapFactory | None = None) -> None:
        """``runtime``, ``transport`` and ``bootstrap`` (``bootstrap(endpoint, on_failed)``,
        default the HTTP ``BootstrapClient``) are the seams ``engine.sim`` replaces."""
        super().__init__(cfg.replace(prefix_cache=False, hicache=False), model=model,
                         runtime=runtime)
        self.pd_hooks = hooks_for(DecodeHooks, cfg.patches)
        self.aux = torch.zeros((max_transfer_queue, AUX_WORDS), dtype=torch.int64)
        self.free_aux = deque(range(max_transfer_queue))
        buffers = {**self.pool.buffers(), "aux": self.aux}
        self.endpoint = transport(name, buffers,
                                  page_dims={**{b: 1 for b in KV_BUFFERS}, "aux": 0})
        self.states = TransferStateTable(clock=runtime.monotonic)
        self.identity = PeerIdentity(self.endpoint.name, secrets.token_bytes(32))
        self.bootstrap = (bootstrap or functools.partial(BootstrapClient, secret=secret))(
            self.endpoint, on_failed=self.states_fail, identity=self.identity)
        self.signer = PreallocSigner(self.identity)
        self.unsettled: dict[int, DecodeRoom] = {}  # decoding before their prefill's done
        self.refused: set[int] = set()  # rooms whose prealloc the prefill refused
        self.prealloc: deque[DecodeRoom] = deque()
        self.transfer: dict[int, DecodeRoom] = {}
        self.quarantine: dict[int, Quarantine] = {}
        self.max_transfer_queue = max_transfer_queue
        self.waiting_timeout_s = waiting_timeout_s
        self.quarantine_s = quarantine_s
        self.late_writes = 0  # notifications of writes into pages no live room owns
        self.late_notifications = 0  # of settled rooms: the bytes landed before their done
        self.settled: OrderedDict[int, None] = OrderedDict()
        self.quarantined_writes = 0
        self.idle_wait_s = 0.005

    def add_room(self, room: DecodeRoom) -> None:
        """Thread-safe: validates, then queues the room for preallocation."""
        self.validate(room.seq.prompt, room.seq.params.max_tokens)
        room.created = self.runtime.monotonic()
        self.states.update(room.room, RoomState.BOOTSTRAPPING)
        self.call_soon(lambda: self.prealloc.append(room))

    def states_fail(self, room: int, reason: str, refused: bool = False) -> None:
        """Thread-safe: fails ``room``; the engine loop cleans it up on its next pass.
        ``refused``: the prefill refused its prealloc, so it will never write those pages and
        they are freed at once."""
        if not refused:
            return self.states.fail(room, reason)
        self.call_soon(lambda: (self.refused.add(room), self.states.fail(room, reason)))

    # ---- engine thread ----
    def poll(self) -> None:
        self._admit_prealloc()
        self._drain_notifications()
        for room in list(self.transfer.values()):
            self._advance(room)
        self._expire_quarantine()

    def _admit_prealloc(self) -> None:
        while self.prealloc and len(self.transfer) < self.max_transfer_queue and self.free_aux:
            room = self.prealloc[0]
            need = pages_for(room.seq.max_total_tokens, self.cfg.page_size)
            if need > self.allocator.num_free:
                return
            self.prealloc.popleft()
            room.seq.pages = self.allocator.alloc(need)
            room.aux_slot = self.free_aux.popleft()
            self.aux[room.aux_slot] = 0
            self.transfer[room.room] = room
            room.transfer_since = self.runtime.monotonic()
            self.states.update(room.room, RoomState.WAITING_FOR_INPUT)
            self.bootstrap.send_prealloc(room.prefill_url, self._signed_prealloc(room))

    def _signed_prealloc(self, room: DecodeRoom) -> Prealloc:
        """The room's prealloc, valid for ``waiting_timeout_s`` (the room fails then anyway);
        its pages are not reused before ``writable_until`` unless the prefill dropped it."""
        n = pages_for(len(room.seq.prompt), self.cfg.page_size)
        room.writable_until = self.runtime.monotonic() + self.waiting_timeout_s + CLOCK_SKEW_S
        return self.signer.sign(room.room, room.seq.pages[:n], room.aux_slot,
                                self.runtime.wall(), self.waiting_timeout_s)

    def _drain_notifications(self) -> None:
        for note in self.endpoint.notifications():
            t = Tag.parse(note.tag)
            if t is None:
                continue
            if t.room in self.transfer:
                self.transfer[t.room].arrived.add(t)
            elif t.room in self.quarantine:
                if t.kind in (TagKind.DONE, TagKind.FAILED):
                    if self.quarantine[t.room].decoded:  # its state was cleared at decode
                        self.pd_hooks.stray_tag(self, t)
                    self._free_quarantined(t.room)
                    self._settle(t.room)
                else:
                    self.quarantined_writes += 1  # landed in quarantined pages: harmless
            elif t.room in self.unsettled:
                if t.kind in (TagKind.DONE, TagKind.FAILED):
                    self.pd_hooks.stray_tag(self, t)  # its state was cleared at decode
                    room = self.unsettled.pop(t.room)
                    self.pd_hooks.release_aux(self.free_aux, room.aux_slot)
                    self._settle(t.room)
            elif t.kind in (TagKind.LAYER, TagKind.AUX) and t.room in self.settled:
                self.late_notifications += 1  # its bytes landed before the prefill's done
            elif t.kind in (TagKind.LAYER, TagKind.AUX):
                self.late_writes += 1
                log.warning("late write for room %d (%s): no live owner", t.room, t.label)
            else:
                self.pd_hooks.stray_tag(self, t)

    def _advance(self, room: DecodeRoom) -> None:
        state = self.states.get(room.room)
        if state is RoomState.FAILED:
            if not room.orphaned:
                self._cleanup(room)
            return
        died = self.bootstrap.dead_since(room.prefill_url)
        if died is not None and room.created < died:  # later rooms: the bootstrap thread fails
            self.states.fail(room.room, UNREACHABLE)  # them if still unreachable
            return
        since = room.transfer_since if room.transfer_since is not None else room.created
        if self.runtime.monotonic() - since > self.waiting_timeout_s:  # its own queue excluded
            self.states.fail(room.room, WAITING_TIMEOUT)
            room.seq.failure = Failure(FailureKind.TIMEOUT, f"KV of room {room.room} did not "
                                       f"arrive within {self.waiting_timeout_s:g} s")
            if not self.pd_hooks.on_waiting_timeout(self, room):
                self._finish(room.seq, FinishReason.ABORT)
            return
        needed = {Tag(room.room, TagKind.LAYER, i) for i in range(self.model.cfg.n_layers)}
        if self.pd_hooks.waits_for_aux():
            needed.add(Tag(room.room, TagKind.AUX))
        if Tag(room.room, TagKind.FAILED) in room.arrived:
            self.states.fail(room.room, "prefill reported failure")
        elif needed <= room.arrived:
            self._start_decoding(room)

    def _start_decoding(self, room: DecodeRoom) -> None:
        aux = Aux.from_words(self.aux[room.aux_slot].tolist())
        if not self.pd_hooks.aux_matches(aux.room, room.room):
            self.states.fail(room.room, f"aux room {aux.room} != {room.room}")
            return
        del self.transfer[room.room]
        if room.arrived & {Tag(room.room, TagKind.DONE), Tag(room.room, TagKind.FAILED)}:
            self.pd_hooks.release_aux(self.free_aux, room.aux_slot)
            self._settle(room.room)
        else:  # the prefill still holds the room: its pages and slot wait for its done
            self.unsettled[room.room] = room
        self.states.update(room.room, RoomState.SUCCESS)
        self.states.clear(room.room)
        seq = room.seq
        seq.num_computed, seq.num_cached = len(seq.prompt), aux.cached_tokens
        seq.status = Status.RUNNING
        self.scheduler.running.append(seq)
        lp = None
        if seq.params.logprobs is not None and not math.isnan(aux.first_logprob):
            lp = TokenLogprob(aux.first_token, aux.first_logprob)  # top-n stays on the prefill
        self._accept(seq, aux.first_token, lp)

    def _cleanup(self, room: DecodeRoom) -> None:
        """Abort cleanup of a transfer-queue entry: the entry leaves the queue, and its pages
        and aux slot are quarantined until the prefill says it writes no more."""
        seq = room.seq
        log.info("cleanup of room %d (arrived %s)", room.room, room.arrived_labels())
        seq.num_computed = len(seq.prompt)  # the pages as they stand, for dumps of aborted rooms
        self.capture(seq)
        room.orphaned = self.pd_hooks.keeps_aborted_entry()
        if not room.orphaned:
            del self.transfer[room.room]
        if self.pd_hooks.frees_aborted_pages_now(self._prefill_done_with(room)):
            self.allocator.free(seq.pages)
            if not room.orphaned:
                self.free_aux.append(room.aux_slot)
        else:
            deadline = max(self.runtime.monotonic() + self.quarantine_s, room.writable_until)
            aux = None if room.orphaned else room.aux_slot
            self.quarantine[room.room] = Quarantine(tuple(seq.pages), aux, deadline)
        seq.pages = []
        reason = self.states.reason(room.room)
        if seq.failure is None and reason not in (None, CLIENT_ABORT):
            kind = FailureKind.TIMEOUT if reason == WAITING_TIMEOUT else FailureKind.PEER
            seq.failure = Failure(kind, f"KV transfer of room {room.room} failed: {reason}")
        self._emit_end(seq)

    def _prefill_done_with(self, room: DecodeRoom) -> bool:
        """Whether the prefill will write nothing more into a failed room's pages: it said
        done/failed, or refused the prealloc. Else it is told to abort (unless that was sent
        already), so it drops the room now and says so."""
        settled = {Tag(room.room, TagKind.DONE), Tag(room.room, TagKind.FAILED)} & room.arrived
        refused = room.room in self.refused
        self.refused.discard(room.room)
        if settled:
            self._settle(room.room)
        elif self.states.reason(room.room) not in (CLIENT_ABORT, WAITING_TIMEOUT):
            self.bootstrap.send_abort(room.prefill_url, room.room)
        return bool(settled) or refused

    def _settle(self, room_id: int) -> None:
        """Remembers (bounded) a room whose prefill reported done/failed: it posts DONE/FAILED
        only after every WRITE completed, so later notifications of it carry no new bytes."""
        self.settled[room_id] = None
        while len(self.settled) > SETTLED_MEMORY:
            self.settled.popitem(last=False)

    def _free_quarantined(self, room_id: int) -> None:
        q = self.quarantine.pop(room_id)
        self.allocator.free(list(q.pages))
        if q.aux_slot is not None and q.decoded:
            self.pd_hooks.release_aux(self.free_aux, q.aux_slot)
        elif q.aux_slot is not None:
            self.free_aux.append(q.aux_slot)

    def _expire_quarantine(self) -> None:
        now = self.runtime.monotonic()
        for room_id in [r for r, q in self.quarantine.items() if q.deadline < now]:
            self._free_quarantined(room_id)

    def _emit_end(self, seq: Sequence) -> None:
        """Ends a request that never reached the running batch: ERROR when ``seq.failure`` is
        set (an internal failure), else ABORT (the client's)."""
        if seq.status is not Status.FINISHED:
            reason = FinishReason.ABORT if seq.failure is None else FinishReason.ERROR
            seq.status, seq.finish_reason = Status.FINISHED, reason
            self.stats.finished[reason.value] += 1
            seq.sink(TokenEvent(seq.rid, None, reason, 0, failure=seq.failure))

    def _abort(self, rid: str) -> None:
        room = self._room_of(rid)
        if room is None:
            return super()._abort(rid)
        self.states.fail(room.room, CLIENT_ABORT)
        log.info("room %d aborted by client in %s", room.room,
                 "prealloc" if room in self.prealloc else "transfer")
        self.bootstrap.send_abort(room.prefill_url, room.room, client=True)
        if room in self.prealloc:
            self.prealloc.remove(room)
            self._emit_end(room.seq)

    def _room_of(self, rid: str) -> DecodeRoom | None:
        return next((r for r in [*self.prealloc, *self.transfer.values()]
                     if r.seq.rid == rid), None)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        room = self._room_of(seq.rid)
        if room is not None:  # timeout while in the transfer queue
            self.bootstrap.send_abort(room.prefill_url, room.room)
            self._cleanup(room)
            return
        held = next((r for r in self.unsettled.values() if r.seq is seq), None)
        if held is None:
            return super()._finish(seq, reason)
        super()._finish(seq, reason, release=False)  # its prefill has not dropped the room yet
        del self.unsettled[held.room]
        self.quarantine[held.room] = Quarantine(tuple(seq.pages), held.aux_slot,
                                                self.runtime.monotonic() + self.quarantine_s,
                                                decoded=True)
        seq.pages = []
