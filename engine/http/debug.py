"""Debug endpoints: loopback-only and token-protected views into queues, transfers and buffers
(the dump format is ``engine.core.dump``'s)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response
from safetensors.torch import save as st_save

from engine.core.dump import identity_metadata
from engine.patch_set import PatchSet

LOOPBACK = {"127.0.0.1", "::1", "localhost", "testclient"}


def check_access(request: Request, token: str | None, open_: bool = False) -> None:
    """Loopback callers only; with a token, only those sending it; with neither a token nor
    ``open_`` (``--debug-open``), nobody."""
    host = request.client.host if request.client else ""
    if host not in LOOPBACK:
        raise HTTPException(403, f"debug endpoints are loopback-only (caller {host})")
    if not token:
        if open_:
            return
        raise HTTPException(403, "debug endpoints are closed: start the server with "
                                 "--debug-token (or --debug-open)")
    if not hmac.compare_digest(request.headers.get("x-debug-token", ""), token):
        raise HTTPException(401, "missing or wrong X-Debug-Token")


def _patches(engine) -> dict:
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
                      "stale_sends": list(j.stale_sends), "stale_kv_reads": list(j.stale_kv_reads),
                      "stale_kv_sends": list(j.stale_kv_sends), "rids": list(j.rids)}
                     for j in jobs]}


def _dump(engine, rid: str | None, room: int | None) -> Response:
    """A request's dump with its identity (``engine.core.dump.RequestIdentity``) as metadata."""
    if rid is None and room is not None:
        rid = engine.rid_of_room.get(room)
    if rid is None:
        raise HTTPException(404, "give rid= or a known room=")
    tensors = engine.on_loop(lambda: engine.dump(rid))
    if tensors is None:
        raise HTTPException(404, f"request {rid!r} is neither live nor captured")
    named = (engine.room_requests.get(room) or ()) if room is not None else ()
    meta = identity_metadata(rid, tensors, named)
    return Response(st_save(tensors, metadata=meta), media_type="application/octet-stream")


def add_debug_routes(app: FastAPI, engine, token: str | None, open_: bool = False) -> None:
    """Mounts ``/debug/{patches,config,queues,transfers,hicache,requests,dump}`` on ``app``;
    every route first passes ``check_access`` (loopback caller; the token, or ``open_``)."""
    def guard(request: Request) -> None:
        check_access(request, token, open_)

    router = APIRouter(prefix="/debug", dependencies=[Depends(guard)])
    views = {"/patches": lambda: _patches(engine), "/config": engine.cfg.to_dict,
             "/queues": lambda: engine.on_loop(
                 lambda: engine.queue_snapshot() | {"pages": engine.page_counts()}),
             "/transfers": lambda: _transfers(engine), "/hicache": lambda: _hicache(engine),
             "/requests": lambda: engine.on_loop(engine.request_table)
             | {"captured": engine.captures.keys()}}
    for path, view in views.items():
        router.add_api_route(path, view, methods=["GET"])

    @router.get("/dump")
    def dump(rid: str | None = None, room: int | None = None) -> Response:
        return _dump(engine, rid, room)

    app.include_router(router)
