"""Decode-side bootstrap client: connects NIXL agents, sends Prealloc/abort, heartbeats peers.

All HTTP to prefill servers happens on this client's threads, one per prefill, so the engine
thread never blocks on the network and a slow or unreachable prefill delays only its own rooms.
Every call carries the deployment's control-plane secret; the connect also gives the prefill this
decode's signing key (``PeerIdentity``). A prefill that misses ``heartbeat_misses`` pings in a
row is dead; a failed call or a dead prefill forgets the handshake, so a restarted prefill (a new
NIXL agent) is connected again on its next room. An abort that cannot reach its prefill (dead,
paused, unreachable) is kept (bounded) and sent once the prefill answers again, so a prefill that
comes back holds no room its decode gave up on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from engine.disagg.messages import PeerIdentity, Prealloc
from engine.http import CLIENT_KEEPALIVE_EXPIRY_S, SECRET_HEADER
from engine.transfer.endpoint import EndpointBlob, TransferEndpoint

log = logging.getLogger(__name__)
MAX_DEFERRED_ABORTS = 4096  # per prefill


@dataclass(frozen=True)
class Outgoing:
    url: str
    path: str
    body: dict


class BootstrapClient:
    def __init__(self, endpoint: TransferEndpoint, secret: str, heartbeat_s: float = 1.0,
                 heartbeat_misses: int = 5, timeout_s: float = 10.0,
                 on_failed: Callable[..., None] | None = None,
                 identity: PeerIdentity | None = None) -> None:
        """``on_failed(room, reason, refused=)`` is called (on a bootstrap thread) when a
        prealloc for ``room`` could not be delivered (``refused=False``: it may have arrived)
        or was refused (``refused=True``: the prefill keeps nothing of it)."""
        self.endpoint = endpoint
        self.identity = identity or PeerIdentity(endpoint.name)
        self._deferred: dict[str, list[Outgoing]] = {}
        self.on_failed = on_failed
        self.heartbeat_s = heartbeat_s
        self.heartbeat_misses = heartbeat_misses
        self.http = httpx.Client(timeout=timeout_s, headers={SECRET_HEADER: secret},
                                 limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S))
        self.connected: set[str] = set()
        self._watched: set[str] = set()  # every prefill ever connected, heartbeated until exit
        self._dead_since: dict[str, float] = {}
        self.misses: dict[str, int] = {}
        self._outboxes: dict[str, queue.Queue[Outgoing]] = {}
        self._lock = threading.Lock()
        self.failed_sends = 0
        threading.Thread(target=self._beat, name="bootstrap-heartbeat", daemon=True).start()

    def send_prealloc(self, url: str, msg: Prealloc) -> None:
        self._outbox(url).put(Outgoing(url, "/disagg/prealloc", msg.to_json()))

    def send_abort(self, url: str, room: int, client: bool = False) -> None:
        """Tells the prefill to drop ``room``; ``client``: because its client left."""
        self._outbox(url).put(Outgoing(url, "/disagg/abort", {"room": room, "client": client}))

    def _outbox(self, url: str) -> queue.Queue[Outgoing]:
        with self._lock:
            if url not in self._outboxes:
                self._outboxes[url] = q = queue.Queue()
                threading.Thread(target=self._drain, args=(q,), name=f"bootstrap {url}",
                                 daemon=True).start()
            return self._outboxes[url]

    def is_dead(self, url: str) -> bool:
        return self.misses.get(url, 0) >= self.heartbeat_misses

    def dead_since(self, url: str) -> float | None:
        """``time.monotonic()`` when ``url`` was declared dead; None while it answers."""
        return self._dead_since.get(url)

    def _connect(self, url: str) -> None:
        blob = EndpointBlob.from_json(self.http.get(url + "/disagg/endpoint").json())
        self.endpoint.connect(blob)
        r = self.http.post(url + "/disagg/connect", json={**self.endpoint.blob().to_json(),
                                                           "key": self.identity.key.hex()})
        r.raise_for_status()
        self.connected.add(url)
        self._watched.add(url)
        self.misses[url] = 0
        self._dead_since.pop(url, None)
        log.info("connected to prefill %s (%s)", url, blob.agent_name)

    def _send(self, msg: Outgoing) -> None:
        try:
            if msg.url not in self.connected:
                self._connect(msg.url)
            r = self.http.post(msg.url + msg.path, json=msg.body)
            if r.status_code == 409 and "unknown peer" in r.text:  # it restarted: a new agent
                self._connect(msg.url)
                r = self.http.post(msg.url + msg.path, json=msg.body)
            r.raise_for_status()
        except Exception as exc:  # noqa: BLE001 - a bad peer must not kill the thread
            self._failed(msg, exc)

    def _failed(self, msg: Outgoing, exc: Exception) -> None:
        self.failed_sends += 1
        self.connected.discard(msg.url)  # handshake again next time (it may have restarted)
        log.warning("bootstrap %s%s failed: %s", msg.url, msg.path, exc)
        refused = isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code < 500
        if msg.path == "/disagg/abort" and not refused:
            self._defer(msg)
        elif self.on_failed is not None and msg.path == "/disagg/prealloc":
            self.on_failed(int(msg.body["room"]), f"prealloc not delivered: {exc}"[:200],
                           refused=refused)

    def _defer(self, msg: Outgoing) -> None:
        with self._lock:
            kept = self._deferred.setdefault(msg.url, [])
            kept.append(msg)
            del kept[:-MAX_DEFERRED_ABORTS]

    def _resend_deferred(self, url: str) -> None:
        with self._lock:
            kept = self._deferred.pop(url, [])
        for msg in kept:
            self._outbox(url).put(msg)

    def _drain(self, outbox: queue.Queue[Outgoing]) -> None:
        while True:
            msg = outbox.get()
            if msg.path == "/disagg/abort" and self.is_dead(msg.url):
                self._defer(msg)  # sent when it answers again, not into a 10 s timeout now
            else:
                self._send(msg)

    def _heartbeat(self) -> None:
        for url in list(self._watched):
            try:
                ok = self.http.get(url + "/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.misses[url] = 0 if ok else self.misses.get(url, 0) + 1
            if ok:
                self._dead_since.pop(url, None)
                self._resend_deferred(url)
            elif self.is_dead(url) and url not in self._dead_since:
                self._dead_since[url] = time.monotonic()
                self.connected.discard(url)
                log.warning("prefill %s is dead (%d missed heartbeats)", url, self.misses[url])

    def _beat(self) -> None:
        while True:
            time.sleep(self.heartbeat_s)
            self._heartbeat()
