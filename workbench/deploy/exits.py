"""Exit statuses of processes that are not our children, from Linux's process-event connector.

A launched vLLM server's engine core and workers are its grandchildren: their parent reaps them
and logs at best ``exit code: None``. The kernel's proc connector (netlink, ``CN_IDX_PROC``)
multicasts every process exit with its wait status and a monotonic timestamp, so the signal that
killed a worker and the moment it died can be read exactly. Listening needs ``CAP_NET_ADMIN``
(root in a container usually has it); without it ``ExitListener.available`` is False and deaths
are reported with an unknown exit status.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

log = logging.getLogger(__name__)
NETLINK_CONNECTOR, CN_IDX_PROC, CN_VAL_PROC = 11, 1, 1
PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT = 1, 0x80000000
_HEADERS = 16 + 20  # nlmsghdr, cn_msg
KEPT = 8192  # exits remembered (the connector reports every process of the host)


@dataclass(frozen=True)
class Exit:
    """One process's end: ``code`` is its exit status when it exited, ``signal`` the signal
    number that killed it (else None); ``at`` is wall-clock seconds (epoch)."""

    pid: int
    code: int | None
    signal: int | None
    core_dumped: bool
    at: float


def decode(status: int, pid: int, at: float) -> Exit:
    """The kernel's wait status (``WIFSIGNALED``: low 7 bits; ``WEXITSTATUS``: next byte)."""
    sig = status & 0x7F
    if sig:
        return Exit(pid, None, sig, bool(status & 0x80), at)
    return Exit(pid, (status >> 8) & 0xFF, None, False, at)


class ExitListener:
    """Listens on the proc connector on a daemon thread and remembers the last ``KEPT`` exits."""

    def __init__(self) -> None:
        self._exits: OrderedDict[int, Exit] = OrderedDict()
        self._lock = threading.Lock()
        self.available = False
        try:
            self._sock = _subscribe()
        except OSError as exc:
            log.info("process exit events unavailable (%s): exit statuses of grandchildren "
                     "will be unknown", exc)
            return
        self.available = True
        threading.Thread(target=self._loop, daemon=True, name="ExitListener").start()

    def exit_of(self, pid: int, wait_s: float = 0.0) -> Exit | None:
        """The recorded end of ``pid`` (waiting up to ``wait_s`` for it to arrive)."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                found = self._exits.get(pid)
            if found is not None or time.monotonic() >= deadline or not self.available:
                return found
            time.sleep(0.02)

    def _loop(self) -> None:
        offset = time.time() - time.monotonic()  # the events carry CLOCK_MONOTONIC
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                continue
            if len(data) < _HEADERS + 36:
                continue
            what, _cpu, ts = struct.unpack_from("=IIQ", data, _HEADERS)
            if what != PROC_EVENT_EXIT:
                continue
            pid, tgid, status, _ = struct.unpack_from("=IIII", data, _HEADERS + 16)
            if pid != tgid:  # a thread, not a process
                continue
            with self._lock:
                self._exits[pid] = decode(status, pid, ts / 1e9 + offset)
                while len(self._exits) > KEPT:
                    self._exits.popitem(last=False)


def _subscribe() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    sock.bind((0, CN_IDX_PROC))
    op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
    cn = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
    sock.send(struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, os.getpid()) + cn)
    return sock


_LISTENER: ExitListener | None = None
_LISTENER_LOCK = threading.Lock()


def listener() -> ExitListener:
    """The process-wide listener, started on first use."""
    global _LISTENER
    with _LISTENER_LOCK:
        if _LISTENER is None:
            _LISTENER = ExitListener()
        return _LISTENER
