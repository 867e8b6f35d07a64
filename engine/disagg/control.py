"""The PD control plane's guard: the deployment secret (``engine.http.auth``) on every
``/disagg/*`` call and on every request that names a bootstrap room, and checks that a prealloc
names a connected peer and pages no other live room of that peer holds."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request

from engine.disagg.messages import Prealloc
from engine.http import SECRET_ENV, SECRET_HEADER, presents_secret
from engine.http.auth import MissingSecret, secret_from_env

MAX_PREALLOC_PAGES = 1 << 16  # more than any pool here; a bigger list is an attack, not a room
MAX_EARLY_PREALLOCS = 1024  # preallocs held for rooms whose prefill request has not arrived
__all__ = ["SECRET_ENV", "SECRET_HEADER", "MissingSecret", "PeerBook", "RejectedPrealloc",
           "check_prealloc", "presents_secret", "require_secret", "secret_from_env"]


class RejectedPrealloc(ValueError):
    """A prealloc that must not be honoured; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def require_secret(request: Request, secret: str) -> None:
    """Raises 401 unless the request carries the deployment's secret."""
    if not presents_secret(request, secret):
        raise HTTPException(401, f"control plane: missing or wrong {SECRET_HEADER} header")


def check_prealloc(msg: Prealloc, peers: set[str], held: dict[int, Prealloc]) -> None:
    """Raises ``RejectedPrealloc`` unless ``msg`` comes from a connected peer and its pages are
    distinct, in range and not held by another live room of the same peer (``held``: room ->
    its accepted prealloc)."""
    if msg.peer not in peers:
        raise RejectedPrealloc(f"prealloc from unknown peer {msg.peer!r}: connect first")
    pages = msg.dst_pages
    if not pages or len(pages) > MAX_PREALLOC_PAGES or min(pages) < 0:
        raise RejectedPrealloc(f"prealloc for room {msg.room}: bad page list", 400)
    if len(set(pages)) != len(pages):
        raise RejectedPrealloc(f"prealloc for room {msg.room} repeats a page", 400)
    if msg.aux_slot < 0:
        raise RejectedPrealloc(f"prealloc for room {msg.room}: bad aux slot", 400)
    mine = set(pages)
    for room, other in held.items():  # held: the caller leaves out expired preallocs
        if room == msg.room or other.peer != msg.peer:
            continue
        if mine.intersection(other.dst_pages) or other.aux_slot == msg.aux_slot:
            raise RejectedPrealloc(f"prealloc for room {msg.room} names pages or the aux slot "
                                   f"of live room {room}")


CLOCK_SKEW_S = 2.0  # how far apart decode and prefill wall clocks may be (same host: 0)


class PeerBook:
    """What a prefill knows of its decodes: each one's signing key, bound at its first connect
    (a later connect under the same name must bring the same key), and the highest prealloc
    ``seq`` it accepted from each. Not thread-safe: the prefill calls it under its lock."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._last_seq: dict[str, int] = {}

    def bind(self, name: str, key: bytes) -> None:
        """Raises ``RejectedPrealloc`` (409) when ``name`` is bound to another key, 400 when
        ``key`` is too short to sign with."""
        if len(key) < 16:
            raise RejectedPrealloc(f"connect from {name!r}: a peer key needs 16+ bytes", 400)
        bound = self._keys.setdefault(name, key)
        if not hmac.compare_digest(bound, key):
            raise RejectedPrealloc(f"peer {name!r} is already bound to another key")

    def accept(self, msg: Prealloc, now: float) -> None:
        """Raises ``RejectedPrealloc`` unless ``msg`` is signed by its bound peer, unexpired at
        wall time ``now`` and newer than every prealloc accepted from that peer; then records
        its ``seq``."""
        key = self._keys.get(msg.peer)
        if key is None:
            raise RejectedPrealloc(f"prealloc from unknown peer {msg.peer!r}: connect first")
        if not hmac.compare_digest(msg.mac, msg.signature(key)):
            raise RejectedPrealloc(f"prealloc for room {msg.room} is not signed by {msg.peer}",
                                   403)
        if not msg.issued_at - CLOCK_SKEW_S <= now <= msg.expires_at:
            raise RejectedPrealloc(f"prealloc for room {msg.room} is outside its validity "
                                   f"({msg.issued_at:.3f} + {msg.ttl_s:g} s, now {now:.3f})")
        if msg.seq <= self._last_seq.get(msg.peer, -1):
            raise RejectedPrealloc(f"prealloc for room {msg.room} replays seq {msg.seq}")
        self._last_seq[msg.peer] = msg.seq

    def __contains__(self, name: str) -> bool:
        return name in self._keys
