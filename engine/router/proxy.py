"""HTTP pieces of the PD router: error bodies, upstream failures, disconnects, SSE passthrough."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from engine.http.errors import CLIENT_CLOSED, stream_error


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


def complete_events(buf: bytes) -> int:
    """How many leading bytes of ``buf`` are whole SSE events (each ends with a blank line)."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := buf.rfind(sep)) >= 0]
    return max(ends, default=0)


def error_status(events: bytes) -> int | None:
    """The status an SSE ``error`` event among ``events`` carries as its ``code`` (500 when it
    names none); None when there is no error event."""
    for line in events.splitlines():
        if line.startswith(b'data: {"error"'):
            try:
                code = json.loads(line[6:])["error"].get("code")
            except (ValueError, AttributeError):
                code = None
            return code if isinstance(code, int) and code >= 400 else 500
    return None


class DecodeStream(StreamingResponse):
    """Decode's SSE bytes, unchanged, forwarded whole event by whole event; however the stream
    ends (done, upstream error, client gone) it closes the decode response and settles the
    request with ``on_close(status)``: the decode's status, or the ``code`` of an error event
    it streamed (a stream that ended in an error is not a success). If decode breaks mid-stream,
    the event it was cut inside is dropped and the client gets an ``upstream_error`` event and
    ``[DONE]`` instead."""

    def __init__(self, resp: httpx.Response, on_close: Callable[[int], None],
                 on_error: Callable[[httpx.HTTPError], None], headers: dict[str, str]) -> None:
        self.upstream, self.status = resp, CLIENT_CLOSED
        self._streamed_error: int | None = None
        self._on_close, self._on_error = on_close, on_error
        super().__init__(self._chunks(), headers=headers, media_type="text/event-stream")

    async def _chunks(self) -> AsyncIterator[bytes]:
        pending = b""  # the start of an event not yet complete
        try:
            async for chunk in self.upstream.aiter_bytes():
                pending += chunk
                if cut := complete_events(pending):
                    self._streamed_error = self._streamed_error or error_status(pending[:cut])
                    yield pending[:cut]
                    pending = pending[cut:]
            self.status = self._streamed_error or self.upstream.status_code
            if pending:
                yield pending
        except httpx.HTTPError as exc:
            self._on_error(exc)
            self.status = 502
            message = f"decode stream broke: {type(exc).__name__}"
            yield stream_error(502, message, "upstream_error").encode()

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close(self.status)
            await self.body_iterator.aclose()
            await self.upstream.aclose()
