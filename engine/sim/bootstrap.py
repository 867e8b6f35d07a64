"""The simulated bootstrap: the decode's control plane to its prefills, in process.

``SimBootstrap`` has the ``BootstrapClient`` methods the decode calls. As the HTTP client does, it
keeps one outbox per prefill drained by its own (simulated) thread, handshakes both endpoints on
the first message, and turns a refused prealloc into ``on_failed(room, reason)``; each message
costs a virtual latency, so a prealloc or abort lands at a seeded point among the other threads.
Prefills never die in simulation: ``dead_since`` is always None.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.disagg.control import RejectedPrealloc
from engine.disagg.messages import PeerIdentity, Prealloc
from engine.runtime import Runtime


@dataclass(frozen=True)
class Message:
    url: str
    room: int
    prealloc: Prealloc | None  # None: an abort of ``room``


class SimBootstrap:
    """``prefills`` maps a prefill URL to its ``PrefillEngine`` (the sim's servers)."""

    def __init__(self, endpoint, on_failed: Callable[..., None] | None = None, *,
                 runtime: Runtime, prefills: Mapping[str, object],
                 latency_s: float = 100e-6, identity: PeerIdentity | None = None) -> None:
        self.endpoint, self.on_failed = endpoint, on_failed
        self.identity = identity or PeerIdentity(endpoint.name, bytes(32))
        self.runtime, self.prefills, self.latency_s = runtime, prefills, latency_s
        self.connected: set[str] = set()
        self.failed_sends = 0
        self._outboxes: dict[str, queue.Queue[Message]] = {}

    def send_prealloc(self, url: str, msg: Prealloc) -> None:
        self._outbox(url).put(Message(url, msg.room, msg))

    def send_abort(self, url: str, room: int, client: bool = False) -> None:
        self._outbox(url).put(Message(url, room, None))

    def dead_since(self, url: str) -> float | None:
        return None

    def is_dead(self, url: str) -> bool:
        return False

    def _outbox(self, url: str) -> queue.Queue[Message]:
        if url not in self._outboxes:
            self._outboxes[url] = q = queue.Queue()
            self.runtime.start_thread(lambda: self._drain(q), f"bootstrap {url}")
        return self._outboxes[url]

    def _drain(self, outbox: queue.Queue[Message]) -> None:
        while True:
            msg = self.runtime.get(outbox)
            self.runtime.sleep(self.latency_s)
            self._send(msg)

    def _send(self, msg: Message) -> None:
        prefill = self.prefills.get(msg.url)
        if prefill is None:
            self.failed_sends += 1
            if self.on_failed is not None and msg.prealloc is not None:
                self.on_failed(msg.room, f"prealloc not delivered: no prefill at {msg.url}")
            return
        if msg.url not in self.connected:
            self.endpoint.connect(prefill.endpoint.blob())
            prefill.connect_peer(self.endpoint.blob(), self.identity.key)
            self.connected.add(msg.url)
        if msg.prealloc is None:
            prefill.abort_room(msg.room, "decode abort")
            return
        try:
            prefill.on_prealloc(msg.prealloc)
        except RejectedPrealloc as exc:
            self.failed_sends += 1
            if self.on_failed is not None:
                self.on_failed(msg.room, f"prealloc not delivered: {exc}"[:200], refused=True)
