"""Control-plane messages between decode and prefill (JSON over the bootstrap HTTP routes) and
the notification tags and aux layout of the data plane (NIXL)."""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import struct
from dataclasses import asdict, dataclass, replace

AUX_WORDS = 5  # room, first token, cached prompt tokens, prompt tokens, first token's logprob
KV_BUFFERS = ("k", "v", "index_k", "index_k_scale")


@dataclass(frozen=True)
class Prealloc:
    """Decode -> prefill: where the room's pages and aux row live on the decode side.

    Signed by its decode (``mac``: HMAC-SHA256 of ``payload()`` under the key the decode gave
    at connect), numbered per peer (``seq`` strictly increases, so a replay is refused) and
    valid from ``issued_at`` (the decode's wall clock) for ``ttl_s``: past that the decode may
    hand the pages to another room, so the prefill must not write.
    """

    room: int
    peer: str
    dst_pages: list[int]
    aux_slot: int
    seq: int = 0
    issued_at: float = 0.0
    ttl_s: float = 0.0
    mac: str = ""

    @property
    def expires_at(self) -> float:
        return self.issued_at + self.ttl_s

    def payload(self) -> bytes:
        """Every field but ``mac``, in one canonical encoding."""
        pages = ",".join(map(str, self.dst_pages))
        return (f"{self.room}|{self.peer}|{pages}|{self.aux_slot}|{self.seq}|"
                f"{self.issued_at!r}|{self.ttl_s!r}").encode()

    def signature(self, key: bytes) -> str:
        return hmac.new(key, self.payload(), hashlib.sha256).hexdigest()

    def signed(self, key: bytes) -> Prealloc:
        return replace(self, mac=self.signature(key))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> Prealloc:
        return cls(int(obj["room"]), str(obj["peer"]), [int(p) for p in obj["dst_pages"]],
                   int(obj["aux_slot"]), int(obj.get("seq", 0)),
                   _finite(obj.get("issued_at", 0.0)), _finite(obj.get("ttl_s", 0.0)),
                   str(obj.get("mac", "")))


def _finite(value) -> float:
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{value!r} is not a finite number")
    return out


@dataclass(frozen=True)
class PeerIdentity:
    """A decode's identity towards its prefills: its NIXL agent name and the key it signs
    preallocs with (random per process, given to each prefill at connect, never logged)."""

    name: str
    key: bytes = b""

    def __repr__(self) -> str:
        return f"PeerIdentity({self.name!r})"


@dataclass(frozen=True)
class Aux:
    """What the prefill writes into the decode's aux row after the KV layers."""

    room: int
    first_token: int
    cached_tokens: int
    prompt_tokens: int
    first_logprob: float = math.nan  # NaN when the request did not ask for logprobs

    def words(self) -> list[int]:
        bits = struct.unpack("<q", struct.pack("<d", self.first_logprob))[0]
        return [self.room, self.first_token, self.cached_tokens, self.prompt_tokens, bits]

    @classmethod
    def from_words(cls, words: list[int]) -> Aux:
        w = [int(x) for x in words[:AUX_WORDS]]
        return cls(*w[:4], struct.unpack("<d", struct.pack("<q", w[4]))[0])


class TagKind(enum.Enum):
    """What a data-plane notification announces for its room."""

    LAYER = "L"  # one layer's K, V, index-K and scale pages landed
    AUX = "aux"  # the aux row landed (after every layer)
    DONE = "done"  # the prefill will write nothing more for the room
    FAILED = "failed"  # the prefill failed the room


@dataclass(frozen=True)
class Tag:
    """A NIXL notification tag: ``{room}:L{layer}`` or ``{room}:{aux|done|failed}`` on the wire.

    Invariant: ``layer`` is set iff ``kind`` is ``LAYER``.
    """

    room: int
    kind: TagKind
    layer: int | None = None

    def __post_init__(self) -> None:
        if (self.layer is None) == (self.kind is TagKind.LAYER):
            raise ValueError(f"a layer is given iff the tag is a layer tag: {self}")

    @property
    def label(self) -> str:
        return f"L{self.layer}" if self.kind is TagKind.LAYER else self.kind.value

    def encode(self) -> bytes:
        return f"{self.room}:{self.label}".encode()

    @classmethod
    def parse(cls, raw: bytes) -> Tag | None:
        """The tag encoded in ``raw``; None for anything else (never raises)."""
        room, sep, what = raw.decode(errors="replace").partition(":")
        if not (sep and room.isdigit()):
            return None
        if what[:1] == "L" and what[1:].isdigit():
            return cls(int(room), TagKind.LAYER, int(what[1:]))
        kind = next((k for k in TagKind if k is not TagKind.LAYER and k.value == what), None)
        return cls(int(room), kind) if kind else None


class PreallocSigner:
    """Numbers (``seq`` strictly increases) and signs one decode's preallocs."""

    def __init__(self, identity: PeerIdentity) -> None:
        self.identity = identity
        self._seq = 0

    def sign(self, room: int, pages: list[int], aux_slot: int, issued_at: float,
             ttl_s: float) -> Prealloc:
        self._seq += 1
        msg = Prealloc(room, self.identity.name, pages, aux_slot, self._seq, issued_at, ttl_s)
        return msg.signed(self.identity.key)
