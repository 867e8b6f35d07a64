"""Buffer dumps: a request's pages in logical token order, as named tensors (safetensors).

The format is defined here once, for the engine's writer and the workbench's reader:
``tokens [T]``, ``pages [P]``, ``num_cached [1]`` (prefix tokens reused from the cache),
``output [O]`` (the tokens the request generated; on a PD prefill its one first token) and, per
layer ``i``, tensors keyed ``DumpKey(i, name)`` (``layer{i}.{name}`` on the wire): ``k|v [T,H,D]``,
``index_k [T,Di]`` (storage dtype), ``index_k_scale [T]``, ``index_k_f32 [T,Di]`` (dequantized)
and, for a request whose prefix came back from HiCache, ``index_k_read_f32 [T,Di]``: index-K as its
indexer read it (the stale content of pages read before their layer landed, else the stored
content). Finished requests stay dumpable from a bounded capture ring (``debug_capture`` entries).

Every dump also carries ``prompt [P]`` and, in its safetensors metadata, the identity of the
request it belongs to (``RequestIdentity``: request id, a hash of the prompt token ids, and every
request that named the same bootstrap room on that server); ``identity_metadata`` writes it and
``RequestIdentity.from_metadata`` (or ``read_metadata`` of a blob) reads it back.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from engine.kernels import get_kernels

DUMP_META = ("tokens", "pages", "num_cached", "output", "prompt")
K, V = TypeVar("K"), TypeVar("V")
_KEY = re.compile(r"layer(\d+)\.(\w+)")


@dataclass(frozen=True, order=True)
class DumpKey:
    """The key of one per-layer tensor of a dump."""

    layer: int
    name: str

    def __str__(self) -> str:
        return f"layer{self.layer}.{self.name}"

    @classmethod
    def parse(cls, key: str) -> DumpKey | None:
        """The key of ``layer{i}.{name}``; None for the per-request entries (``DUMP_META``)."""
        m = _KEY.fullmatch(key)
        return cls(int(m.group(1)), m.group(2)) if m else None


def prompt_hash(ids) -> str:
    """A short stable hash of prompt token ids (the same on every side and in the client)."""
    data = b"".join(struct.pack("<q", int(t)) for t in ids)
    return hashlib.sha256(data).hexdigest()[:16]


@dataclass(frozen=True)
class RequestIdentity:
    """Which request a dump belongs to: ``rid``, ``prompt_hash`` (``prompt_hash`` of its prompt)
    and ``room_requests``: (rid, prompt hash) of every request that named the dump's room on that
    server, oldest first (more than one: the room was given to two requests)."""

    rid: str
    prompt_hash: str
    room_requests: tuple[tuple[str, str], ...] = ()

    def to_metadata(self) -> dict[str, str]:
        return {"rid": self.rid, "prompt_hash": self.prompt_hash,
                "room_requests": json.dumps([list(r) for r in self.room_requests])}

    @classmethod
    def from_metadata(cls, meta: dict[str, str] | None) -> RequestIdentity | None:
        """The identity written by ``to_metadata``; None for a dump without one."""
        if not meta or "rid" not in meta or "prompt_hash" not in meta:
            return None
        named = json.loads(meta.get("room_requests") or "[]")
        return cls(meta["rid"], meta["prompt_hash"], tuple((str(r), str(h)) for r, h in named))


def identity_metadata(rid: str, tensors: dict[str, torch.Tensor],
                      room_requests: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """The safetensors metadata of ``rid``'s dump ``tensors`` (its prompt hashed)."""
    prompt = tensors["prompt"].tolist() if "prompt" in tensors else []
    return RequestIdentity(rid, prompt_hash(prompt), tuple(room_requests)).to_metadata()


def read_metadata(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (empty when it has none)."""
    (n,) = struct.unpack("<Q", blob[:8])
    return dict(json.loads(blob[8:8 + n]).get("__metadata__") or {})


def snapshot_buffers(engine, seq) -> dict[str, torch.Tensor]:
    """Copies the computed positions of ``seq`` out of the pools (engine thread)."""
    pool, S = engine.pool, engine.pool.page_size
    T = seq.num_computed
    pos = torch.arange(T)
    slots = torch.tensor(seq.pages, dtype=torch.long)[pos // S] * S + pos % S if T else pos
    deq = get_kernels("torch").dequantize_index_k
    out = {"tokens": torch.tensor(seq.tokens[:T], dtype=torch.int64),
           "pages": torch.tensor(seq.pages, dtype=torch.int64),
           "num_cached": torch.tensor([seq.num_cached], dtype=torch.int64),
           "output": torch.tensor(list(seq.output), dtype=torch.int64),
           "prompt": torch.tensor(list(seq.prompt), dtype=torch.int64)}
    for li in range(pool.k.shape[0]):
        flat = {n: t[li].reshape(-1, *t.shape[3:]) for n, t in pool.buffers().items()}
        for name, t in flat.items():
            out[str(DumpKey(li, name))] = t[slots].clone()
        out[str(DumpKey(li, "index_k_f32"))] = deq(out[str(DumpKey(li, "index_k"))],
                                                   out[str(DumpKey(li, "index_k_scale"))])
        if seq.load_jobs:
            out[str(DumpKey(li, "index_k_read_f32"))] = index_k_as_read(seq, li, out, deq)
    return out


def index_k_as_read(seq, layer: int, out: dict[str, torch.Tensor], deq) -> torch.Tensor:
    """Stored index-K of ``layer`` [T,Di] with the stale reads of loaded pages substituted."""
    read = out[str(DumpKey(layer, "index_k_f32"))].clone()  # [T,Di]
    T = read.shape[0]
    where = {page: i for i, page in enumerate(seq.pages)}
    for job in seq.load_jobs:
        snap = job.stale_snapshots.get(layer)
        if snap is None:
            continue
        n_pages, S, Di = snap.values.shape
        seen = deq(snap.values.reshape(-1, Di), snap.scale.reshape(-1)).view(n_pages, S, Di)
        for n, page in enumerate(job.device_pages):
            if page not in where or where[page] * S >= T:
                continue  # a loaded page this sequence does not (or not yet) cover
            lo = where[page] * S
            read[lo:lo + S] = seen[n, : min(S, T - lo)]
    return read


class BoundedMap(Generic[K, V]):
    """A thread-safe mapping that keeps its ``capacity`` most recently set keys."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, not {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            return self._items.get(key, default)

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        return len(self._items)


class CaptureRing:
    """The last ``size`` captured request dumps, by request id; ``size`` 0 keeps none."""

    def __init__(self, size: int) -> None:
        self._items: BoundedMap[str, dict[str, torch.Tensor]] | None = (
            BoundedMap(size) if size > 0 else None)

    @property
    def enabled(self) -> bool:
        return self._items is not None

    def put(self, rid: str, tensors: dict[str, torch.Tensor]) -> None:
        if self._items is not None:
            self._items[rid] = tensors

    def get(self, rid: str) -> dict[str, torch.Tensor] | None:
        return self._items.get(rid) if self._items is not None else None

    def keys(self) -> list[str]:
        return self._items.keys() if self._items is not None else []
