"""A recording reverse proxy: the network path between a decode and its prefill, as an attacker
on it would see it.

``python -m bench.tap --target URL --port P --record FILE`` forwards every request to ``URL``
unchanged (headers and body; answers buffered, which the prefill's routes allow) and appends the
body of every ``POST /disagg/prealloc`` to ``FILE`` as one JSON line once the prefill answered it,
so ``bench.attacks`` can replay and tamper with real preallocs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


def create_app(target: str, record: Path) -> FastAPI:
    client = httpx.AsyncClient(base_url=target, timeout=None, trust_env=False)
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        resp = await client.request(request.method, "/" + path, content=body, headers=headers,
                                    params=request.query_params)
        if path == "disagg/prealloc":  # after the prefill answered: a replay comes second
            with record.open("a") as f:
                f.write(json.dumps(json.loads(body)) + "\n")
        out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
        return Response(resp.content, status_code=resp.status_code, headers=out)

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(prog="bench.tap")
    ap.add_argument("--target", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--record", type=Path, required=True)
    args = ap.parse_args()
    uvicorn.run(create_app(args.target.rstrip("/"), args.record), host="127.0.0.1",
                port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
