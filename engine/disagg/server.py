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

from fastapi import Request

from engine.core.engine import PromptTooLongError
from engine.disagg.decode import DecodeEngine, DecodeRoom
from engine.disagg.messages import Prealloc
from engine.disagg.prefill import PrefillEngine, PrefillRoom
from engine.disagg.state import RoomState
from engine.serving import native
from engine.serving.admission import Admission, chat_admission, native_admission
from engine.serving.errors import BadRequestError
from engine.serving.generation import Bootstrap, Generation
from engine.serving.protocol import parse_chat_request
from engine.serving.server import ChatServer
from engine.transfer.endpoint import EndpointBlob


class PrefillServer(ChatServer):
    engine: PrefillEngine
    mode = "prefill"

    def __init__(self, engine: PrefillEngine, debug_token: str | None = None,
                 port: int = 0) -> None:
        super().__init__(engine, debug_token, port)
        self.app.get("/disagg/endpoint")(self.endpoint)
        self.app.post("/disagg/connect")(self.connect)
        self.app.post("/disagg/prealloc")(self.prealloc)
        self.app.post("/disagg/abort")(self.abort)

    async def endpoint(self) -> dict:
        return self.engine.endpoint.blob().to_json()

    async def connect(self, request: Request) -> dict:
        blob = EndpointBlob.from_json(await request.json())
        await asyncio.to_thread(self.engine.connect_peer, blob)
        return {"connected": blob.agent_name}

    async def prealloc(self, request: Request) -> dict:
        self.engine.on_prealloc(Prealloc.from_json(await request.json()))
        return {"ok": True}

    async def abort(self, request: Request) -> dict:
        self.engine.abort_room(int((await request.json())["room"]), "decode abort")
        return {"ok": True}

    async def chat(self, request: Request):
        try:
            req = parse_chat_request(await request.body())
            a = chat_admission(self.plan(req), req, self.default_max_tokens)
        except BadRequestError as exc:
            return self._refuse(exc)
        return await self._prefill(request, a)

    async def generate(self, request: Request):
        try:
            req = native.parse_generate_request(await request.body())
            a = native_admission(self.engine.tokenizer, req, self.default_max_tokens)
        except BadRequestError as exc:
            return self._refuse(exc)
        return await self._prefill(request, a)

    async def _prefill(self, request: Request, a: Admission):
        """Runs the room's prompt and answers once its KV reached the decode (or failed)."""
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
        try:
            self.engine.add_room(PrefillRoom(room, gen.seq, on_done))
        except (PromptTooLongError, ValueError) as exc:
            return self._refuse(exc)
        self.engine.rid_of_room[room] = gen.rid
        watcher = asyncio.create_task(self._watch(request, room, done))
        state = await done
        watcher.cancel()
        return {"room": room, "state": state.name, "prompt_tokens": len(a.plan.ids),
                "cached_tokens": gen.seq.num_cached}

    async def _watch(self, request: Request, room: int, done: asyncio.Future) -> None:
        while not done.done():
            if await request.is_disconnected():
                self.engine.abort_room(room, "client disconnected")
                return
            await asyncio.sleep(0.05)


def prefill_url(boot: Bootstrap) -> str:
    """The prefill's bootstrap URL; BadRequestError naming the first missing or invalid field."""
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
    return f"http://[{host}]:{boot.port}" if ":" in host else f"http://{host}:{boot.port}"


class DecodeServer(ChatServer):
    engine: DecodeEngine
    mode = "decode"

    def admit(self, a: Admission) -> Generation:
        url = prefill_url(a.boot)
        gen = self._new_generation(a)
        self.engine.add_room(DecodeRoom(a.boot.room, gen.seq, url))
        self.engine.rid_of_room[a.boot.room] = gen.rid
        return gen
