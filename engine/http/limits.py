"""Request-size limit (ASGI middleware) and HTTP keep-alive times, shared by the servers and the
router. The connection deadlines are in ``engine.http.timeouts``."""

from __future__ import annotations

import json
import logging

log = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# A server closes a connection idle this long (uvicorn's timeout_keep_alive) ...
SERVER_KEEP_ALIVE_S = 5
# ... so our long-lived clients (router -> servers, decode -> prefill bootstrap) drop a pooled
# connection sooner. With both at 5 s (uvicorn's and httpx's defaults) a request sent on a
# connection idle ~5 s can race the server's close and fail with ReadError.
CLIENT_KEEPALIVE_EXPIRY_S = 2.0


class BodyLimit:
    """Answers 413 to a request whose body exceeds ``max_bytes``, before any handler runs.

    A declared ``Content-Length`` over the limit is refused without reading; otherwise the body
    is read here (at most ``max_bytes + 1`` bytes are held) and replayed to the application. A
    client that leaves before its body is in is logged at INFO and gets nothing; the application
    never sees the request.
    """

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _log_gone(scope, size)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._refuse(send)
            more = message.get("more_body", False)
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _refuse(self, send) -> None:
        payload = json.dumps({"error": {
            "message": f"request body exceeds {self.max_bytes} bytes",
            "type": "invalid_request_error", "param": None, "code": 413}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


def _log_gone(scope, size: int) -> None:
    # nothing to answer and nothing broke: the application never sees the request (it would
    # raise starlette's ClientDisconnect, which uvicorn logs as an unhandled traceback)
    log.info("client left during the upload of %s %s after %d bytes", scope["method"],
             scope["path"], size)


def _replay(messages: list[dict], receive):
    """A ``receive`` that yields ``messages`` first, then defers to the real one (disconnects)."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()
    return replayed
