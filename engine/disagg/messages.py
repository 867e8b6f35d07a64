"""Control-plane messages between decode and prefill (JSON over the bootstrap HTTP routes) and
the notification tags and aux layout of the data plane (NIXL)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

AUX_WORDS = 4  # room, first token, cached prompt tokens, prompt tokens
KV_BUFFERS = ("k", "v", "index_k", "index_k_scale")


@dataclass(frozen=True)
class Prealloc:
    """Decode -> prefill: where the room's pages and aux row live on the decode side."""

    room: int
    peer: str
    dst_pages: list[int]
    aux_slot: int

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> Prealloc:
        return cls(int(obj["room"]), str(obj["peer"]), [int(p) for p in obj["dst_pages"]],
                   int(obj["aux_slot"]))


@dataclass(frozen=True)
class Aux:
    """What the prefill writes into the decode's aux row after the KV layers."""

    room: int
    first_token: int
    cached_tokens: int
    prompt_tokens: int

    def words(self) -> list[int]:
        return [self.room, self.first_token, self.cached_tokens, self.prompt_tokens]

    @classmethod
    def from_words(cls, words: list[int]) -> Aux:
        return cls(*[int(w) for w in words[:AUX_WORDS]])


def layer_tag(room: int, layer: int) -> bytes:
    return f"{room}:L{layer}".encode()


def tag(room: int, what: str) -> bytes:
    """``what`` is one of aux, done, failed."""
    return f"{room}:{what}".encode()


@dataclass(frozen=True)
class Tag:
    room: int
    what: str  # "L<i>", "aux", "done", "failed"

    @classmethod
    def parse(cls, raw: bytes) -> Tag | None:
        room, sep, what = raw.decode(errors="replace").partition(":")
        return cls(int(room), what) if sep and room.isdigit() else None
