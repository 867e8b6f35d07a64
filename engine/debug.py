"""Debug endpoints: loopback-only and token-protected views into queues, transfers and buffers.

Buffer dumps are safetensors blobs of a request's pages in logical token order: ``tokens [T]``,
``num_cached [1]`` (prefix tokens reused from the cache), ``layer{i}.k|v [T,H,D]``,
``layer{i}.index_k [T,Di]`` (storage dtype), ``layer{i}.index_k_scale [T]`` and
``layer{i}.index_k_f32 [T,Di]`` (dequantized). A request whose prefix came back from HiCache also
has ``layer{i}.index_k_read_f32 [T,Di]``: index-K as its indexer read it (the stale content of
pages read before their layer landed, else the stored content).
Finished requests stay dumpable from a bounded capture ring (``debug_capture`` entries).
"""

from __future__ import annotations

import hmac
import threading
from collections import OrderedDict

import torch
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response
from safetensors.torch import save as st_save

from engine.kernels import get_kernels

LOOPBACK = {"127.0.0.1", "::1", "localhost", "testclient"}


def snapshot_buffers(engine, seq) -> dict[str, torch.Tensor]:
    """Copies the computed positions of ``seq`` out of the pools (engine thread)."""
    pool, S = engine.pool, engine.pool.page_size
    T = seq.num_computed
    pos = torch.arange(T)
    slots = torch.tensor(seq.pages, dtype=torch.long)[pos // S] * S + pos % S if T else pos
    deq = get_kernels("torch").dequantize_index_k
    out = {"tokens": torch.tensor(seq.tokens[:T], dtype=torch.int64),
           "pages": torch.tensor(seq.pages, dtype=torch.int64),
           "num_cached": torch.tensor([seq.num_cached], dtype=torch.int64)}
    for li in range(pool.k.shape[0]):
        flat = {n: t[li].reshape(-1, *t.shape[3:]) for n, t in pool.buffers().items()}
        for name, t in flat.items():
            out[f"layer{li}.{name}"] = t[slots].clone()
        out[f"layer{li}.index_k_f32"] = deq(out[f"layer{li}.index_k"],
                                            out[f"layer{li}.index_k_scale"])
        if seq.load_jobs:
            out[f"layer{li}.index_k_read_f32"] = index_k_as_read(seq, li, out, deq)
    return out


def index_k_as_read(seq, layer: int, out: dict[str, torch.Tensor], deq) -> torch.Tensor:
    """Stored index-K of ``layer`` [T,Di] with the stale reads of loaded pages substituted."""
    read = out[f"layer{layer}.index_k_f32"].clone()  # [T,Di]
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


class CaptureRing:
    """The last ``size`` captured request dumps, by request id (and room when known)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, tensors: dict[str, torch.Tensor]) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[rid] = tensors
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, rid: str) -> dict[str, torch.Tensor] | None:
        with self._lock:
            return self._items.get(rid)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)


def check_access(request: Request, token: str | None) -> None:
    host = request.client.host if request.client else ""
    if host not in LOOPBACK:
        raise HTTPException(403, f"debug endpoints are loopback-only (caller {host})")
    given = request.headers.get("x-debug-token", "")
    if token and not hmac.compare_digest(given, token):
        raise HTTPException(401, "missing or wrong X-Debug-Token")


def _patches(engine) -> dict:
    from engine.patches import PatchSet

    return {"patches": PatchSet(engine.cfg.patches).describe(),
            "index_k_dtype": engine.cfg.index_k_dtype}


def _transfers(engine) -> dict:
    states = getattr(engine, "states", None)
    rows = states.snapshot() if states else []
    return {"rooms": [{"room": r.room, "state": r.state.name, "age_s": r.since,
                       "reason": r.reason} for r in rows]}


def _hicache(engine) -> dict:
    loader = getattr(engine.cache, "loader", None)
    jobs = list(loader.history) if loader else []
    return {"jobs": [{"job": j.job_id, "pages": len(j.host_pages), "done_layers": j.done_layers,
                      "index_k_layers": j.index_k_layers, "stale_reads": list(j.stale_reads),
                      "stale_sends": list(j.stale_sends), "rids": list(j.rids)} for j in jobs]}


def _dump(engine, rid: str | None, room: int | None) -> Response:
    if rid is None and room is not None:
        rid = engine.rid_of_room.get(room)
    if rid is None:
        raise HTTPException(404, "give rid= or a known room=")
    tensors = engine.on_loop(lambda: engine.dump(rid))
    if tensors is None:
        raise HTTPException(404, f"request {rid!r} is neither live nor captured")
    return Response(st_save(tensors, metadata={"rid": rid}), media_type="application/octet-stream")


def add_debug_routes(app: FastAPI, engine, token: str | None) -> None:
    """Mounts ``/debug/{patches,config,queues,transfers,hicache,requests,dump}`` on ``app``;
    every route first passes ``check_access`` (loopback caller, ``X-Debug-Token`` if set)."""
    def guard(request: Request) -> None:
        check_access(request, token)

    router = APIRouter(prefix="/debug", dependencies=[Depends(guard)])
    views = {"/patches": lambda: _patches(engine), "/config": engine.cfg.to_dict,
             "/queues": lambda: engine.on_loop(engine.queue_snapshot),
             "/transfers": lambda: _transfers(engine), "/hicache": lambda: _hicache(engine),
             "/requests": lambda: engine.on_loop(engine.request_table)
             | {"captured": engine.captures.keys()}}
    for path, view in views.items():
        router.add_api_route(path, view, methods=["GET"])

    @router.get("/dump")
    def dump(rid: str | None = None, room: int | None = None) -> Response:
        return _dump(engine, rid, room)

    app.include_router(router)
