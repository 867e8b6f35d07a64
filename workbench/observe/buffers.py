"""Dump a request's KV / index-K buffers from a live server and diff them against the reference.

``dump_buffers(pair, room=...)`` pulls the pages through the debug endpoint; ``diff_against_
reference(dump, cfg)`` recomputes the same buffers with the no-cache oracle and reports, per layer
and buffer, the max abs / relative difference and the first bad position.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import httpx
import polars as pl
import torch
from safetensors.torch import load as st_load

from engine.config import EngineConfig
from engine.core.dump import DumpKey, RequestIdentity, read_metadata
from engine.model import Reference, load_model
from workbench.deploy import Capability, EngineDown, PDPair, lasting, require

log = logging.getLogger(__name__)
ROLES = ("decode", "prefill")


def capture_name(room: int, role: str) -> str:
    """The file name of a captured dump of ``room`` on ``role`` (writer and reader use this)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; valid: {', '.join(ROLES)}")
    return f"room-{room}-{role}.safetensors"


WHAT = {"kv": ("k", "v"), "index_k": ("index_k_f32",), "index_k_read": ("index_k_read_f32",),
        "scale": ("index_k_scale",)}  # scales: compared across the transfer only (no reference)


@dataclass(frozen=True)
class BufferDump:
    """Buffers of one request in logical token order: ``tensors[str(DumpKey(i, name))]``."""

    source: str
    tokens: list[int]
    tensors: dict[str, torch.Tensor]
    num_cached: int = 0
    output: tuple[int, ...] = ()  # tokens the request generated (a PD prefill: its first)
    identity: RequestIdentity | None = None  # whose dump (None: a dump written without one)

    @property
    def num_layers(self) -> int:
        return 1 + max(key.layer for k in self.tensors if (key := DumpKey.parse(k)))

    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        save_file({**self.tensors, "tokens": torch.tensor(self.tokens),
                   "num_cached": torch.tensor([self.num_cached]),
                   "output": torch.tensor(list(self.output), dtype=torch.int64)}, str(path),
                  metadata={"source": self.source,
                            **(self.identity.to_metadata() if self.identity else {})})
        return Path(path)


def parse_dump(blob: bytes, source: str, what=("kv", "index_k", "index_k_read")) -> BufferDump:
    """A dump blob with its request identity (safetensors metadata), if it carries one."""
    ident = RequestIdentity.from_metadata(read_metadata(blob))
    return dump_of(st_load(blob), source, what, ident)


def dump_of(raw: dict[str, torch.Tensor], source: str,
            what=("kv", "index_k", "index_k_read"),
            identity: RequestIdentity | None = None) -> BufferDump:
    """The ``BufferDump`` of an engine's dump tensors (``Engine.dump``, or a parsed blob)."""
    names = {n for w in what for n in WHAT[w]}
    keep = {k: v for k, v in raw.items() if (key := DumpKey.parse(k)) and key.name in names}
    cached = int(raw["num_cached"][0]) if "num_cached" in raw else 0
    output = tuple(raw["output"].tolist()) if "output" in raw else ()
    return BufferDump(source, raw["tokens"].tolist(), keep, cached, output, identity)


def load_identity(path: str | Path) -> RequestIdentity | None:
    """The request identity a dump file carries, read from its header alone."""
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        return RequestIdentity.from_metadata(read_metadata(head + f.read(n)) if n else {})


def load_dump(path: str | Path, what=("kv", "index_k", "index_k_read")) -> BufferDump:
    return parse_dump(Path(path).read_bytes(), str(path), what)


def dump_buffers(pair: PDPair, room: int | None = None, rid: str | None = None,
                 what=("kv", "index_k", "index_k_read"), role: str = "decode") -> BufferDump:
    """Fetches a live or captured request's buffers from the ``role`` server of ``pair``."""
    require(pair, Capability.BUFFER_DUMPS, "dump_buffers")
    unknown = set(what) - set(WHAT)
    if unknown:
        raise ValueError(f"unknown buffer kinds {sorted(unknown)}; valid: {sorted(WHAT)}")
    srv = {"decode": pair.decode[0], "prefill": pair.prefill[0]}[role]
    params = {"room": room} if room is not None else {"rid": rid}
    try:
        blob = pair.debug_bytes("/debug/dump", srv, **params)
    except httpx.TransportError as exc:
        down = [o for o in lasting(pair.down()) if o.server == srv.name]
        if down:
            raise EngineDownError(down[0]) from exc
        raise
    return parse_dump(blob, f"{role}:{room if room is not None else rid}", what)


class EngineDownError(RuntimeError):
    """A dump asked of a server the deployment's watch saw die or hang; ``observation`` is the
    ``EngineDied``/``EngineHung`` evidence (a dump has no partial result to return)."""

    def __init__(self, observation: EngineDown) -> None:
        super().__init__(observation.describe())
        self.observation = observation


@dataclass(frozen=True)
class BufferDiff:
    """``summary``: one row per (layer, buffer); ``per_position[DumpKey]``: [T] max abs diff."""

    summary: pl.DataFrame
    per_position: dict[DumpKey, torch.Tensor]
    first_bad_layer: int | None
    first_bad_position: int | None

    def errors(self, layer: int, buffer: str) -> torch.Tensor:
        """[T] max abs difference of ``buffer`` at ``layer`` per position (KeyError if absent)."""
        return self.per_position[DumpKey(layer, buffer)]


class ReferenceBuffers:
    """Recomputes buffers on the oracle path; reuse one across many diffs (loads the model once)."""

    def __init__(self, cfg: EngineConfig, memo: int = 64) -> None:
        model = load_model(Path(cfg.model_dir) / "model.safetensors").to(cfg.device)
        self.ref = Reference(model, cfg.replace(batch_invariant=True))
        self.memo = memo
        self._seen: OrderedDict[tuple[int, ...], tuple[dict[str, torch.Tensor], list[int]]] = \
            OrderedDict()

    def buffers(self, tokens: list[int]) -> dict[str, torch.Tensor]:
        """Every layer's reference K, V and index-K for ``tokens`` (a pure function of them: the
        last ``memo`` answers are kept, so judging many schedules of one load recomputes none)."""
        return self._forward(tokens)[0]

    def greedy(self, tokens: list[int]) -> list[int]:
        """The reference's greedy next token after each prefix of ``tokens`` ([T], argmax of its
        logits; memoized with ``buffers``)."""
        return self._forward(tokens)[1]

    def _forward(self, tokens: list[int]) -> tuple[dict[str, torch.Tensor], list[int]]:
        key = tuple(tokens)
        if key in self._seen:
            self._seen.move_to_end(key)
            return self._seen[key]
        out = {}
        res = self.ref.forward(tokens)
        for i, lb in enumerate(res.layers):
            out[str(DumpKey(i, "k"))], out[str(DumpKey(i, "v"))] = lb.k, lb.v
            for name in ("index_k_f32", "index_k_read_f32"):
                out[str(DumpKey(i, name))] = lb.index_k
        self._seen[key] = (out, res.logits.argmax(-1).tolist())
        if len(self._seen) > self.memo:
            self._seen.popitem(last=False)
        return self._seen[key]


def diff_against_reference(dump: BufferDump, cfg: EngineConfig | ReferenceBuffers,
                           rtol: float = 1e-5) -> BufferDiff:
    """Per-layer, per-position comparison of ``dump`` with the recomputed reference buffers."""
    refb = cfg if isinstance(cfg, ReferenceBuffers) else ReferenceBuffers(cfg)
    ref = refb.buffers(dump.tokens)
    rows, per_pos = [], {}
    for dk, key, got in sorted((DumpKey.parse(k), k, v) for k, v in dump.tensors.items()):
        want = ref[key].to(got.dtype).float()
        err = (got.float() - want).abs().flatten(1).amax(1)  # [T]
        scale = want.abs().flatten(1).amax(1).clamp_min(1e-6)
        bad = (err / scale > rtol).nonzero().flatten()
        layer, name = dk.layer, dk.name
        per_pos[dk] = err
        rows.append({"layer": layer, "buffer": name, "max_abs": float(err.max()),
                     "max_rel": float((err / scale).max()), "bad_positions": len(bad),
                     "first_bad_position": int(bad[0]) if len(bad) else None,
                     "positions": len(err)})
    summary = pl.DataFrame(rows, schema_overrides={"first_bad_position": pl.Int64})
    bad_rows = summary.filter(pl.col("bad_positions") > 0)
    return BufferDiff(summary, per_pos,
                      int(bad_rows["layer"].min()) if len(bad_rows) else None,
                      int(bad_rows["first_bad_position"].min()) if len(bad_rows) else None)

