"""A tiny real upstream for the router tests: records every chat request, answers JSON or SSE.

``python tests/support/upstream_app.py --port P --name NAME``. Body knobs: ``delay_s``
(non-streaming: sleep before answering, watching for the client to leave), ``chunks`` and
``chunk_delay_s`` (streaming), ``break_after`` (streaming: cut the connection inside event number
``break_after``), ``status`` (answer that error status). ``GET /seen`` lists the requests in
arrival order with their bodies and whether each finished or saw its client disconnect first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass
class Seen:
    """One request as the upstream saw it (mutable: updated as it runs)."""

    body: dict
    done: bool = False
    disconnected: bool = False


def sse_chunk(name: str, body: dict, i: int) -> str:
    """The ``i``-th SSE event of the stream for ``body``; tests rebuild it to compare bytes."""
    return f"data: {json.dumps({'from': name, 'room': body.get('bootstrap_room'), 'i': i})}\n\n"


async def sleep_unless_gone(request: Request, seconds: float) -> bool:
    """Sleeps ``seconds``; False as soon as the client disconnects."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        if await request.is_disconnected():
            return False
        await asyncio.sleep(0.02)
    return True


class StreamBroke(RuntimeError):
    """Raised mid-stream (``break_after``): uvicorn then cuts the connection mid-body."""


async def stream(name: str, seen: Seen):
    try:
        for i in range(int(seen.body.get("chunks", 3))):
            await asyncio.sleep(float(seen.body.get("chunk_delay_s", 0.02)))
            if i == seen.body.get("break_after"):
                yield sse_chunk(name, seen.body, i)[:12]  # half an event, then the cut
                await asyncio.sleep(0.05)
                raise StreamBroke(f"{name} broke its stream after {i} events")
            yield sse_chunk(name, seen.body, i)
        yield "data: [DONE]\n\n"
        seen.done = True
    finally:
        seen.disconnected = not seen.done


def create_app(name: str) -> FastAPI:
    """The upstream app; ``name`` labels its answers."""
    app = FastAPI()
    seen: list[Seen] = []

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model"}]}

    @app.get("/seen")
    async def get_seen() -> list[dict]:
        return [asdict(s) for s in seen]

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        rec = Seen(json.loads(await request.body()))
        seen.append(rec)
        if rec.body.get("status"):
            rec.done = True
            return JSONResponse({"error": {"message": f"{name} says no", "code": 0}},
                                status_code=int(rec.body["status"]))
        if rec.body.get("stream"):
            return StreamingResponse(stream(name, rec), media_type="text/event-stream")
        if not await sleep_unless_gone(request, float(rec.body.get("delay_s", 0))):
            rec.disconnected = True
            return JSONResponse({}, status_code=499)
        rec.done = True
        return {"object": "chat.completion", "from": name, "room": rec.body.get("bootstrap_room"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": name},
                             "finish_reason": "stop"}]}

    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    uvicorn.run(create_app(args.name), host="127.0.0.1", port=args.port, log_level="warning",
                timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
