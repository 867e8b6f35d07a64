"""HTTP pieces of the PD router: error bodies, upstream failures, disconnects, SSE passthrough."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before the answer


class UpstreamError(Exception):
    """An upstream could not be reached or timed out; ``status`` is what the router answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class ClientGone(Exception):
    """The client disconnected before decode answered."""


async def wait_disconnect(request: Request) -> None:
    """Returns once the client has gone (the body must already be read)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.01)


async def discard(task: asyncio.Task) -> None:
    """Cancels ``task``, waits for it, and closes the response it may have produced."""
    task.cancel()
    try:
        result = await task
    except (asyncio.CancelledError, Exception):
        return
    if isinstance(result, httpx.Response):
        await result.aclose()


def passthrough(resp: httpx.Response, headers: dict[str, str]) -> Response:
    """An upstream's read response as ours: same bytes, status and content type."""
    return Response(resp.content, resp.status_code, headers=headers,
                    media_type=resp.headers.get("content-type"))


def stream_error_event(status: int, message: str) -> bytes:
    """An OpenAI-style SSE error event: a stream that breaks says so instead of just ending."""
    body = {"error": {"message": message, "type": "upstream_error", "code": status}}
    return f"data: {json.dumps(body)}\n\n".encode()


class DecodeStream(StreamingResponse):
    """Decode's SSE bytes, unchanged; however the stream ends (done, upstream error, client
    gone) it closes the decode response and settles the request with ``on_close(status)``."""

    def __init__(self, resp: httpx.Response, on_close: Callable[[int], None],
                 on_error: Callable[[httpx.HTTPError], None], headers: dict[str, str]) -> None:
        self.upstream, self.status = resp, CLIENT_CLOSED
        self._on_close, self._on_error = on_close, on_error
        super().__init__(self._chunks(), headers=headers, media_type="text/event-stream")

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.upstream.aiter_bytes():
                yield chunk
            self.status = self.upstream.status_code
        except httpx.HTTPError as exc:
            self._on_error(exc)
            self.status = 502
            yield stream_error_event(502, f"decode stream broke: {type(exc).__name__}")

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close(self.status)
            await self.body_iterator.aclose()
            await self.upstream.aclose()
