"""PD router: one OpenAI-compatible front door over pools of prefill and decode servers.

Like SGLang's mini load balancer: each chat request gets a prefill and a decode server (by
policy, seeded by ``--seed``) and an unpredictable 63-bit ``bootstrap_room`` from the OS's
randomness (never from the seed: a guessable room could be registered first by someone else).
Both upstream requests carry the deployment's secret (``$PDWB_PD_SECRET``) as ``X-PD-Secret``,
without which a PD server refuses a request naming a room. The body goes
to both servers at once, with the prefill server's host and port as ``bootstrap_host`` and
``bootstrap_port``: to prefill with ``stream: false``, to decode as the client asked. The client
gets decode's answer (SSE bytes passed through unchanged) with an ``X-Bootstrap-Room`` header.
If decode fails, or prefill cannot be reached before decode answers, the request fails and the
other upstream request is cancelled; a successful request leaves prefill to finish in the
background. A client that goes away cancels both upstream requests, so the servers see the
disconnect and abort.

``python -m engine.router --prefill URL [URL ...] --decode URL [URL ...] --seed S``
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict

import httpx
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import Response

from engine.http import (
    CLIENT_KEEPALIVE_EXPIRY_S,
    SECRET_HEADER,
    BadRequestError,
    BodyLimit,
    check_access,
    json_object,
)
from engine.http import error_response as error
from engine.http.metrics import ROUTER, Metrics
from engine.router.health import HealthTable, NoHealthyServer, probe_forever, recheck
from engine.router.proxy import (
    CLIENT_CLOSED,
    ClientGone,
    DecodeStream,
    UpstreamError,
    discard,
    passthrough,
    wait_disconnect,
)
from engine.router.state import POLICIES, RoomAssignment, RoomLog, RouterConfig, bootstrap_fields
from engine.router.variants import RouterHooks
from engine.variants import hooks_for

log = logging.getLogger(__name__)
CHAT_PATH = "/v1/chat/completions"
ROOM_HEADER = "X-Bootstrap-Room"


class Router:
    """Routes chat requests to a prefill/decode pair; see the module docstring."""

    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics(prefix="pdwb_router", families=ROUTER, gauges=lambda: {
            "in_flight_requests": ("requests being routed", len(self._active))})
        self.rooms = RoomLog(cfg.history)
        self.client = httpx.AsyncClient(timeout=cfg.timeout_s, trust_env=False,
                                        limits=httpx.Limits(
                                            max_connections=None,
                                            keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S))
        self.room_rng = random.SystemRandom()
        self.hooks = hooks_for(RouterHooks, cfg.patches)  # variants, chosen once
        policy_rng = random.Random(cfg.seed) if cfg.seed is not None else random.SystemRandom()
        self._auth = {SECRET_HEADER: cfg.secret} if cfg.secret else {}
        factory = POLICIES.get(cfg.policy)
        self._prefill_policy, self._decode_policy = factory(policy_rng), factory(policy_rng)
        self._active: set[int] = set()
        self._background: set[asyncio.Task] = set()
        self.upstreams = HealthTable(cfg.prefill + cfg.decode)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Lifespan: probes upstream health; on exit cancels background prefill requests and
        closes the client."""
        if self.cfg.health_interval_s > 0:
            self._spawn(probe_forever(self.client, self.upstreams,
                                      self.cfg.prefill + self.cfg.decode,
                                      self.cfg.health_interval_s))
        try:
            yield
        finally:
            tasks = list(self._background)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.aclose()

    async def _assign_rechecked(self) -> RoomAssignment:
        """``assign``; when a pool has no healthy server, its servers are probed once first."""
        room = await self.hooks.draw_room(self)
        try:
            return self.assign(room)
        except NoHealthyServer:
            await recheck(self.client, self.upstreams, (*self.cfg.prefill, *self.cfg.decode))
            return self.assign(room)

    def assign(self, room: int | None = None) -> RoomAssignment:
        """Picks healthy servers for ``room`` (None: a fresh one; no await in between:
        replayable by seed); raises ``NoHealthyServer`` when a pool has none."""
        pools = {role: self.upstreams.healthy(pool) for role, pool in
                 (("prefill", self.cfg.prefill), ("decode", self.cfg.decode))}
        for role, pool in pools.items():
            if not pool:
                raise NoHealthyServer(role)
        room = self.room_rng.getrandbits(63) if room is None else room
        a = RoomAssignment(room=room, prefill=self._prefill_policy.pick(pools["prefill"]),
                           decode=self._decode_policy.pick(pools["decode"]), started=time.time())
        self.rooms.add(a)
        self._active.add(a.room)
        return a

    def _settle(self, a: RoomAssignment, status: int, prefill: asyncio.Task) -> None:
        """Ends the request once: room log, metrics; a failed one also cancels its prefill."""
        if status >= 400:
            prefill.cancel()
        if a.room in self._active:
            if status == CLIENT_CLOSED:
                log.info("client left: room %d cancelled on %s and %s", a.room, a.prefill,
                         a.decode)
            self._active.discard(a.room)
            self.rooms.finish(a.room, status)
            self.metrics.inc("requests_total", status=str(status))

    def _count_error(self, role: str, url: str, reason: str) -> None:
        self.metrics.inc("upstream_errors_total", role=role, server=url, reason=reason)

    @asynccontextmanager
    async def _upstream(self, role: str, url: str) -> AsyncIterator[None]:
        """httpx failures become a logged, counted ``UpstreamError``: 504 on timeout, else 502."""
        try:
            yield
        except httpx.HTTPError as exc:
            timeout = isinstance(exc, httpx.TimeoutException)
            reason = ("timeout" if timeout else
                      "connect" if isinstance(exc, httpx.ConnectError) else "transport")
            message = (f"{role} server {url} timed out after {self.cfg.timeout_s:g}s" if timeout
                       else f"cannot reach {role} server {url}: {type(exc).__name__}: {exc}")
            log.warning("%s", message)
            self._count_error(role, url, reason)
            if reason == "connect" and self.cfg.health_interval_s > 0:  # probes bring it back
                self.upstreams.mark(url, False, "connection refused")
            raise UpstreamError(504 if timeout else 502, message) from exc

    async def _prefill(self, a: RoomAssignment, body: dict) -> UpstreamError | None:
        try:
            async with self._upstream("prefill", a.prefill):
                resp = await self.client.post(a.prefill + CHAT_PATH, json=body,
                                              headers=self._auth)
        except UpstreamError as exc:
            return exc
        if resp.status_code >= 400:
            log.warning("prefill %s answered %d for room %d: %.300s", a.prefill,
                        resp.status_code, a.room, resp.text)
            self._count_error("prefill", a.prefill, f"http_{resp.status_code}")
        return None

    async def _decode(self, a: RoomAssignment, body: dict, stream: bool) -> httpx.Response:
        async with self._upstream("decode", a.decode):
            req = self.client.build_request("POST", a.decode + CHAT_PATH, json=body,
                                            headers=self._auth)
            resp = await self.client.send(req, stream=True)
            if not stream or resp.status_code >= 400:
                try:
                    await resp.aread()
                finally:
                    await resp.aclose()
            return resp

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("prefill task failed", exc_info=task.exception())
            self.metrics.inc("internal_errors_total")

    async def _await_decode(self, request: Request, decode: asyncio.Task,
                            prefill: asyncio.Task) -> httpx.Response:
        """Decode's response; raises ``UpstreamError`` if decode fails or prefill cannot be
        reached first, ``ClientGone`` if the client leaves. Decode is cancelled on failure."""
        watcher = asyncio.create_task(wait_disconnect(request))
        try:
            while True:
                waiting = {decode, watcher} | (set() if prefill.done() else {prefill})
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if decode in done:
                    return decode.result()
                if watcher in done:
                    raise ClientGone
                if not prefill.cancelled() and isinstance(prefill.result(), UpstreamError):
                    raise prefill.result()
        except BaseException:
            await discard(decode)
            raise
        finally:
            watcher.cancel()

    async def chat(self, request: Request) -> Response:
        """POST /v1/chat/completions."""
        try:
            body = json_object(await request.body())
        except BadRequestError as exc:
            self.metrics.inc("requests_total", status="400")
            return exc.response()
        try:
            a = await self._assign_rechecked()
        except NoHealthyServer as exc:
            self.metrics.inc("requests_total", status="503")
            return error(503, f"{exc} (probed every {self.cfg.health_interval_s:g}s): "
                              f"{self.upstreams.snapshot()}")
        stream = body.get("stream") is True
        fields = bootstrap_fields(a)
        to_prefill = {k: v for k, v in body.items() if k != "stream_options"}
        prefill = self._spawn(self._prefill(a, {**to_prefill, **fields, "stream": False}))
        decode = asyncio.create_task(self._decode(a, {**body, **fields}, stream))
        try:
            resp = await self._await_decode(request, decode, prefill)
        except (UpstreamError, ClientGone) as exc:
            return self._failed(a, prefill, exc)
        except BaseException:
            self._settle(a, 500, prefill)
            raise
        return self._answer(a, prefill, resp, stream)

    def _failed(self, a: RoomAssignment, prefill: asyncio.Task,
                exc: UpstreamError | ClientGone) -> Response:
        if isinstance(exc, ClientGone):
            self._settle(a, CLIENT_CLOSED, prefill)
            return Response(status_code=CLIENT_CLOSED, headers={ROOM_HEADER: str(a.room)})
        self._settle(a, exc.status, prefill)
        answer = error(exc.status, exc.message)
        answer.headers[ROOM_HEADER] = str(a.room)
        return answer

    def _answer(self, a: RoomAssignment, prefill: asyncio.Task, resp: httpx.Response,
                stream: bool) -> Response:
        headers = {ROOM_HEADER: str(a.room)}
        if resp.status_code >= 400:
            self._count_error("decode", a.decode, f"http_{resp.status_code}")
        if not stream or resp.status_code >= 400:
            self._settle(a, resp.status_code, prefill)
            return passthrough(resp, headers)
        return DecodeStream(resp, lambda status: self._settle(a, status, prefill),
                            lambda exc: self._stream_error(a, exc), headers)

    def _stream_error(self, a: RoomAssignment, exc: httpx.HTTPError) -> None:
        log.warning("decode %s stream for room %d broke: %s: %s", a.decode, a.room,
                    type(exc).__name__, exc)
        self._count_error("decode", a.decode, "stream")

    async def models(self) -> Response:
        """GET /v1/models, proxied to the first decode server."""
        url = self.cfg.decode[0]
        try:
            async with self._upstream("decode", url):
                resp = await self.client.get(url + "/v1/models")
        except UpstreamError as exc:
            return error(exc.status, exc.message)
        return passthrough(resp, {})

    async def health(self) -> dict:
        """GET /health: the router itself is up; ``upstreams`` is what it knows of its
        servers."""
        return {"status": "ok", "upstreams": self.upstreams.snapshot()}

    async def prometheus(self, request: Request) -> Response:
        """GET /metrics (OpenMetrics when the scraper asks for it)."""
        body, content_type = self.metrics.render(request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    async def debug_rooms(self, limit: int = Query(100, ge=1)) -> list[dict]:
        """GET /debug/rooms?limit=N: the last N assignments, oldest first."""
        return [asdict(a) for a in self.rooms.recent(limit)]


def create_app(cfg: RouterConfig) -> FastAPI:
    """The router's ASGI app."""
    router = Router(cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with router.running():
            yield

    app = FastAPI(title="pd-workbench router", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)
    app.state.router = router
    app.post(CHAT_PATH)(router.chat)
    app.get("/v1/models")(router.models)
    app.get("/health")(router.health)
    app.get("/metrics")(router.prometheus)
    def guard(request: Request) -> None:
        check_access(request, cfg.debug_token, cfg.debug_open)

    app.get("/debug/rooms", dependencies=[Depends(guard)])(router.debug_rooms)
    return app
