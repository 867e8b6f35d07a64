"""HTTP servers for the PD roles: the prefill bootstrap routes and the decode generation routes.

Prefill: ``POST /v1/chat/completions`` and ``POST /generate`` (with ``bootstrap_room``) answer
once the room's KV reached the decode (or failed); ``/disagg/endpoint|connect|prealloc|abort``
are the bootstrap side channel, served on the prefill's own port (its ``/server_info`` gives it as
``disaggregation_bootstrap_port``). Decode: the same two routes (with bootstrap host, port and
room, else 400 at once) stream like the single-node server, but the first token and KV come
from the prefill over NIXL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse

from engine.core import PromptTooLongError
from engine.disagg.control import RejectedPrealloc, presents_secret, require_secret
from engine.disagg.decode import DecodeEngine
from engine.disagg.messages import Prealloc
from engine.disagg.prefill import PrefillEngine, PrefillRoom
from engine.disagg.rooms import CLIENT_ABORT, DecodeRoom
from engine.disagg.state import RoomState
from engine.http import BadRequestError, UnauthorizedError, json_object
from engine.http import error_response as error
from engine.http.errors import CLIENT_CLOSED
from engine.serving.admission import Admission
from engine.serving.generation import Bootstrap, Generation
from engine.serving.server import ChatServer
from engine.transfer.endpoint import ChannelError, EndpointBlob


class PrefillServer(ChatServer):
    engine: PrefillEngine
    mode = "prefill"

    def __init__(self, engine: PrefillEngine, debug_token: str | None = None,
                 port: int = 0, *, secret: str, debug_open: bool = False) -> None:
        super().__init__(engine, debug_token, port, debug_open=debug_open)
        self.secret = secret
        engine.on_transfer = self._on_transfer
        self.app.get("/disagg/endpoint")(self.endpoint)
        self.app.post("/disagg/connect")(self.connect)
        self.app.post("/disagg/prealloc")(self.prealloc)
        self.app.post("/disagg/abort")(self.abort)

    def _on_transfer(self, seconds: float, nbytes: int) -> None:
        self.metrics.observe("transfer_seconds", seconds)
        self.metrics.inc("transfer_bytes", nbytes)

    async def _control_body(self, request: Request) -> dict:
        """The body of a control-plane call: 401 without the secret, 400 unless a JSON object."""
        require_secret(request, self.secret)
        try:
            return json_object(await request.body())
        except BadRequestError as exc:
            raise HTTPException(400, str(exc)) from None

    async def endpoint(self, request: Request) -> dict:
        require_secret(request, self.secret)
        return self.engine.endpoint.blob().to_json()

    async def connect(self, request: Request) -> dict:
        body = await self._control_body(request)
        try:
            blob = EndpointBlob.from_json(body)
            key = bytes.fromhex(str(body.get("key", "")))
            await asyncio.to_thread(self.engine.connect_peer, blob, key)
        except RejectedPrealloc as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except (ChannelError, ValueError, RuntimeError) as exc:
            raise HTTPException(400, f"connect: {exc}") from None
        return {"connected": blob.agent_name}

    async def prealloc(self, request: Request):
        body = await self._control_body(request)
        try:
            msg = Prealloc.from_json(body)
        except (KeyError, TypeError, ValueError) as exc:
            raise HTTPException(400, f"prealloc: bad body ({exc!r})") from None
        try:
            await asyncio.to_thread(self.engine.on_prealloc, msg)
        except RejectedPrealloc as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        return {"ok": True}

    async def abort(self, request: Request) -> dict:
        body = await self._control_body(request)
        room = body.get("room")
        if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room < 2**63:
            raise HTTPException(400, "abort: body needs an integer room")
        self.engine.abort_room(room, CLIENT_ABORT if body.get("client") is True else "decode abort")
        return {"ok": True}

    def authorize(self, request: Request) -> None:
        _require_room_credential(request, self.secret)

    async def chat(self, request: Request):
        try:
            self.authorize(request)
            a = (await self.parse_chat(request)).admission
        except BadRequestError as exc:
            return self._refuse(exc)
        return await self._prefill(request, a)

    async def generate(self, request: Request):
        try:
            self.authorize(request)
            a = (await self.parse_native(request)).admission
        except BadRequestError as exc:
            return self._refuse(exc)
        return await self._prefill(request, a)

    async def _prefill(self, request: Request, a: Admission):
        """Runs the room's prompt and answers once its KV reached the decode (200), or the room
        failed (502 with the reason; 499 when the router went away first)."""
        room = a.boot.room
        if room is None:
            return self._refuse(BadRequestError(
                "prefill server needs bootstrap_room (send through the router)", "bootstrap_room"))
        loop = asyncio.get_running_loop()
        done: asyncio.Future[RoomState] = loop.create_future()

        def on_done(state: RoomState) -> None:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(state))

        gen = self._new_generation(dataclasses.replace(
            a, params=dataclasses.replace(a.params, max_tokens=1)))
        self.engine.name_room(room, gen.rid, gen.seq.prompt)
        try:
            self.engine.add_room(PrefillRoom(room, gen.seq, on_done))
        except (PromptTooLongError, ValueError) as exc:
            return self._refuse(exc)
        self.engine.rid_of_room[room] = gen.rid
        watcher = asyncio.create_task(self._watch(request, room, done))
        state = await done
        watcher.cancel()
        return self._answer_room(room, state, gen, len(a.plan.ids))

    def _answer_room(self, room: int, state: RoomState, gen: Generation, prompt_tokens: int):
        reason = self.engine.states.reason(room) or ""
        status = (200 if state is RoomState.SUCCESS else
                  CLIENT_CLOSED if reason == CLIENT_ABORT else 502)
        self.metrics.inc("requests_total", status=str(status))
        if status != 200:
            return error(status, f"room {room} failed: {reason}")
        return {"room": room, "state": state.name, "prompt_tokens": prompt_tokens,
                "cached_tokens": gen.seq.num_cached}

    async def _watch(self, request: Request, room: int, done: asyncio.Future) -> None:
        while not done.done():
            if await request.is_disconnected():
                self.engine.abort_room(room, CLIENT_ABORT)
                return
            await asyncio.sleep(0.05)


def _require_room_credential(request: Request, secret: str) -> None:
    """Only a holder of the deployment's secret (the router) may register a bootstrap room: a
    caller naming a room could otherwise pair its prompt with another user's decode (a squat)."""
    if not presents_secret(request, secret):
        raise UnauthorizedError("requests naming a bootstrap room must come through the PD "
                                "router (missing or wrong X-PD-Secret)", "bootstrap_room")


def prefill_url(boot: Bootstrap, allowed: frozenset[str] | None = None) -> str:
    """The prefill's bootstrap URL; BadRequestError naming the first missing or invalid field,
    or the address when it is not one of ``allowed`` (None: any loopback address)."""
    for name in ("room", "host", "port"):
        if getattr(boot, name) is None:
            raise BadRequestError(f"decode server needs bootstrap_{name} (send through a PD "
                                  "router that knows the prefill's bootstrap port)",
                                  f"bootstrap_{name}")
    host = boot.host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise BadRequestError(f"bootstrap_host {host!r} is not an IP address",
                                  "bootstrap_host") from None
    url = f"http://[{host}]:{boot.port}" if ":" in host else f"http://{host}:{boot.port}"
    ok = url in allowed if allowed is not None else _loopback(host)
    if not ok:
        raise BadRequestError(f"bootstrap address {url} is not an allowed prefill",
                              "bootstrap_host")
    return url


def _loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


class DecodeServer(ChatServer):
    """``allowed_prefills``: the only bootstrap addresses a request may name (``http://H:P``);
    None allows any loopback address."""

    engine: DecodeEngine
    mode = "decode"

    def __init__(self, engine: DecodeEngine, debug_token: str | None = None, port: int = 0, *,
                 secret: str, allowed_prefills: frozenset[str] | None = None,
                 debug_open: bool = False) -> None:
        super().__init__(engine, debug_token, port, debug_open=debug_open)
        self.secret = secret
        self.allowed_prefills = allowed_prefills

    def authorize(self, request: Request) -> None:
        _require_room_credential(request, self.secret)

    def admit(self, a: Admission) -> Generation:
        url = prefill_url(a.boot, self.allowed_prefills)
        gen = self._new_generation(a)
        self.engine.name_room(a.boot.room, gen.rid, gen.seq.prompt)
        self.engine.add_room(DecodeRoom(a.boot.room, gen.seq, url))
        self.engine.rid_of_room[a.boot.room] = gen.rid
        return gen
