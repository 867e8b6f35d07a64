"""A simulated PD pair: a prefill and a decode engine, the transfer layer between them, the
bootstrap control plane and the router's dispatch, all under one ``SimRuntime``.

The engines are the real ``PrefillEngine`` and ``DecodeEngine``; only their seams differ: the
runtime (threads, sleeps, waits, clock), the transport (``engine.sim.Fabric``: one-sided WRITEs
landing at seeded points, a notification after its data) and the bootstrap
(``engine.sim.SimBootstrap``). Each request gets the next room; the router hands it to both sides
in a seeded order (the decode's prealloc may reach the prefill first, as over HTTP). A killed
client aborts on both sides as the real servers do when their connection drops. After the load
the pair drains (virtual ``Workload.drain_s``) and what stayed is counted as real mode's
``workbench.observe.evidence`` counts it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import random
from collections import Counter

import polars as pl

from engine.config import EngineConfig
from engine.core.sequence import FailureKind, FinishReason, SamplingParams, Sequence, TokenEvent
from engine.disagg.decode import DecodeEngine, DecodeRoom
from engine.disagg.prefill import PrefillEngine, PrefillRoom
from engine.sim import Fabric, SimBootstrap
from workbench.judge import judge_rooms
from workbench.observe import localize
from workbench.observe.buffers import BufferDump, ReferenceBuffers, dump_of
from workbench.observe.evidence import leftovers_of
from workbench.sim.single import EngineSimulation, Served, shared_model
from workbench.sim.workload import SimEvidence

log = logging.getLogger(__name__)
PREFILL_URL = "http://sim-prefill-0"
PD_IDLE_S = 0.01  # virtual seconds an idle PD engine waits unless a message or notification comes


class PDSimulation(EngineSimulation):
    """The threads of one PD run: prefill and decode loops, senders, wires, bootstrap, clients."""

    def main(self) -> None:
        model = shared_model(self.cfg.model_dir)
        self.fabric = Fabric(self.sim)
        self.prefill = PrefillEngine(self.cfg, "sim-prefill-0", model=model, runtime=self.sim,
                                     transport=self.fabric.endpoint)
        boot = functools.partial(SimBootstrap, runtime=self.sim,
                                 prefills={PREFILL_URL: self.prefill})
        self.decode = DecodeEngine(self.cfg, "sim-decode-0",
                                   max_transfer_queue=self.w.transfer_queue,
                                   waiting_timeout_s=self.w.waiting_timeout_s, secret="sim",
                                   model=model, runtime=self.sim,
                                   transport=self.fabric.endpoint, bootstrap=boot)
        self.engine = self.decode  # the clients' tokenizer
        self.next_room = 0
        self.rid_of_room: dict[int, str] = {}
        for role, engine in (("prefill", self.prefill), ("decode", self.decode)):
            engine.runner.before_layer = self._layer
            self.sim.start_thread(functools.partial(self._loop, role, engine), role)
        self._clients()
        self.sim.wait_for(None, lambda: not self._left(), self.w.drain_s)
        self.evidence = SimEvidence(self.decode.late_writes, self._left())

    def _loop(self, role: str, engine) -> None:
        while True:
            self.sim.point(f"{role}.step")
            if self._step(engine) is None:
                self.sim.wait_for(None, lambda: engine.pending()
                                  or engine.endpoint.has_notifications(), PD_IDLE_S)

    def _left(self) -> dict[str, int]:
        left: Counter = Counter()
        for role, engine in (("prefill", self.prefill), ("decode", self.decode)):
            rooms = [{"state": r.state.name} for r in engine.states.snapshot()]
            queues = engine.queue_snapshot() | {"pages": engine.page_counts()}
            left.update(leftovers_of(role, queues, rooms))
        return {k: v for k, v in left.items() if v}

    def _serve(self, i: int, rid: str, ids: list[int], events: list[TokenEvent]) -> Served:
        self.next_room += 1
        room = self.next_room
        self.rid_of_room[room] = rid
        greedy = dict(temperature=0.0, seed=i, logprobs=0)  # the prefill's sends the first's
        pseq = Sequence(f"{rid}-prefill", ids, SamplingParams(max_tokens=1, **greedy),
                        sink=lambda e: None)
        seq = Sequence(rid, ids, SamplingParams(max_tokens=self.w.max_tokens, **greedy),
                       sink=events.append)
        dispatch = [lambda: self.prefill.add_room(PrefillRoom(room, pseq, on_done=_ignore)),
                    lambda: self.decode.add_room(DecodeRoom(room, seq, PREFILL_URL))]
        random.Random(f"dispatch:{self.seed}:{room}").shuffle(dispatch)
        self.sim.point(f"client{i} sends room {room}")
        for send in dispatch:
            send()
            self.sim.point(f"router dispatched room {room}")
        kill_at = self._kill_at(rid)
        limit = min(kill_at, self.w.request_timeout_s)
        if not self.sim.wait_for(None, lambda: seq.finish_reason is not None, limit):
            self._abandon(room, seq)
            if kill_at <= self.w.request_timeout_s:
                return Served(seq, room, killed=True)
            return Served(seq, room, error=f"no response within {limit:g} s (virtual)")
        if seq.finish_reason is FinishReason.ERROR:
            failure = seq.failure
            status = 504 if failure is not None and failure.kind is FailureKind.TIMEOUT else 502
            return Served(seq, room, error=failure.message if failure else "engine error",
                          status=status)
        return Served(seq, room)

    def _kill_at(self, rid: str) -> float:
        """When the client abandons request ``rid`` (virtual seconds after sending; inf: never),
        drawn from the load seed and the request alone, so the kills are part of the workload,
        not of the schedule."""
        rng = random.Random(f"kill:{self.w.load_seed}:{rid}")
        if rng.random() >= self.w.kill_fraction:
            return math.inf
        return rng.uniform(0.0, self.w.kill_window_s)

    def _abandon(self, room: int, seq: Sequence) -> None:
        """The client's connection drops: the decode aborts the request, the router cancels the
        prefill's (the prefill server sees its client gone)."""
        self.decode.abort(seq.rid)
        self.sim.point(f"router cancels room {room}")
        self.prefill.abort_room(room, "client disconnected")


    def engine_config(self) -> EngineConfig:
        return self.cfg

    def room_dumps(self, room: int) -> tuple[BufferDump, BufferDump]:
        """Both sides' buffers of ``room`` (live or captured; after the run)."""
        rid = self.rid_of_room[room]
        pre, dec = self.prefill.dump(f"{rid}-prefill"), self.decode.dump(rid)
        if pre is None or dec is None:
            side = "prefill" if pre is None else "decode"
            raise KeyError(f"room {room}: no buffers on the {side}")
        return dump_of(pre, f"prefill:{room}"), dump_of(dec, f"decode:{room}")

    def judge(self, requests: pl.DataFrame) -> SimEvidence:
        """The buffer-level oracle of real mode's bursts: ``Workload.judge`` unflagged rooms
        (``judge_rooms``) compared with the reference on both sides (``localize``)."""
        rooms = judge_rooms(requests, self.w.judge if self.cfg.debug_capture else 0,
                            page_size=self.cfg.page_size, chunk_size=self.cfg.chunk_size)
        flags = 0
        for room in rooms:
            loc = localize(self, room, _reference(self.cfg))
            flags += loc.first is not None
            if loc.first is not None:
                log.info("sim room %d: %s", room, loc.describe())
        return dataclasses.replace(self.evidence, judged_rooms=len(rooms), buffer_flags=flags)


@functools.lru_cache(maxsize=4)
def _reference(cfg: EngineConfig) -> ReferenceBuffers:
    return ReferenceBuffers(cfg)


def _ignore(state) -> None:
    """A prefill room's ``on_done``: the sim's clients wait on the decode's sequence."""
