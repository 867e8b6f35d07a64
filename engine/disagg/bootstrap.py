"""Decode-side bootstrap client: connects NIXL agents, sends Prealloc/abort, heartbeats peers.

All HTTP to prefill servers happens on this client's own thread, so the engine thread never
blocks on the network. A prefill that misses ``heartbeat_misses`` pings in a row is dead.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import httpx

from engine.disagg.messages import Prealloc
from engine.transfer.endpoint import EndpointBlob, TransferEndpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outgoing:
    url: str
    path: str
    body: dict


class BootstrapClient:
    def __init__(self, endpoint: TransferEndpoint, heartbeat_s: float = 1.0,
                 heartbeat_misses: int = 5, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.heartbeat_s = heartbeat_s
        self.heartbeat_misses = heartbeat_misses
        self.http = httpx.Client(timeout=timeout_s)
        self.connected: set[str] = set()
        self.misses: dict[str, int] = {}
        self.outbox: queue.Queue[Outgoing] = queue.Queue()
        self.failed_sends = 0
        threading.Thread(target=self._loop, name="bootstrap", daemon=True).start()

    def send_prealloc(self, url: str, msg: Prealloc) -> None:
        self.outbox.put(Outgoing(url, "/disagg/prealloc", msg.to_json()))

    def send_abort(self, url: str, room: int) -> None:
        self.outbox.put(Outgoing(url, "/disagg/abort", {"room": room}))

    def is_dead(self, url: str) -> bool:
        return self.misses.get(url, 0) >= self.heartbeat_misses

    def _connect(self, url: str) -> None:
        blob = EndpointBlob.from_json(self.http.get(url + "/disagg/endpoint").json())
        self.endpoint.connect(blob)
        r = self.http.post(url + "/disagg/connect", json=self.endpoint.blob().to_json())
        r.raise_for_status()
        self.connected.add(url)
        self.misses.setdefault(url, 0)
        log.info("connected to prefill %s (%s)", url, blob.agent_name)

    def _send(self, msg: Outgoing) -> None:
        try:
            if msg.url not in self.connected:
                self._connect(msg.url)
            self.http.post(msg.url + msg.path, json=msg.body).raise_for_status()
        except Exception as exc:  # noqa: BLE001 - a bad peer must not kill the thread
            self.failed_sends += 1
            log.warning("bootstrap %s%s failed: %s", msg.url, msg.path, exc)

    def _heartbeat(self) -> None:
        for url in list(self.connected):
            try:
                ok = self.http.get(url + "/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.misses[url] = 0 if ok else self.misses.get(url, 0) + 1

    def _loop(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_s
        while True:
            try:
                self._send(self.outbox.get(timeout=max(0.0, next_beat - time.monotonic())))
            except queue.Empty:
                pass
            if time.monotonic() >= next_beat:
                self._heartbeat()
                next_beat = time.monotonic() + self.heartbeat_s
