"""HTTP servers for the PD roles: the prefill bootstrap routes and the decode chat route.

Prefill: ``POST /v1/chat/completions`` (with ``bootstrap_room``) answers once the room's KV
reached the decode (or failed); ``/disagg/endpoint|connect|prealloc|abort`` are the bootstrap
side channel. Decode: ``POST /v1/chat/completions`` (with bootstrap fields) streams like the
single-node server, but its first token and KV come from the prefill over NIXL.
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from engine.core.sequence import SamplingParams
from engine.disagg.decode import DecodeEngine, DecodeRoom
from engine.disagg.messages import Prealloc
from engine.disagg.prefill import PrefillEngine, PrefillRoom
from engine.disagg.state import RoomState
from engine.serving.errors import BadRequestError
from engine.serving.errors import error_response as error
from engine.serving.generation import Generation
from engine.serving.protocol import ChatCompletionRequest, parse_chat_request
from engine.serving.server import ChatServer
from engine.transfer.endpoint import EndpointBlob


class PrefillServer(ChatServer):
    engine: PrefillEngine

    def __init__(self, engine: PrefillEngine, debug_token: str | None = None) -> None:
        super().__init__(engine, debug_token)
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
        except BadRequestError as exc:
            return exc.response()
        if req.bootstrap_room is None:
            return error(400, "prefill server needs bootstrap_room (send through the router)",
                         "bootstrap_room")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[RoomState] = loop.create_future()

        def on_done(state: RoomState) -> None:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(state))

        plan = self.plan(req)
        params = SamplingParams(max_tokens=1, temperature=req.temperature, top_p=req.top_p,
                                seed=req.seed or 0)
        gen = Generation(self.engine, plan, params, rid=f"room-{req.bootstrap_room}")
        try:
            self.engine.add_room(PrefillRoom(req.bootstrap_room, gen.seq, on_done))
        except ValueError as exc:
            return error(400, str(exc), "messages")
        self.engine.rid_of_room[req.bootstrap_room] = gen.rid
        watcher = asyncio.create_task(self._watch(request, req.bootstrap_room, done))
        state = await done
        watcher.cancel()
        return {"room": req.bootstrap_room, "state": state.name,
                "prompt_tokens": len(plan.ids), "cached_tokens": gen.seq.num_cached}

    async def _watch(self, request: Request, room: int, done: asyncio.Future) -> None:
        while not done.done():
            if await request.is_disconnected():
                self.engine.abort_room(room, "client disconnected")
                return
            await asyncio.sleep(0.05)


class DecodeServer(ChatServer):
    engine: DecodeEngine

    def start_generation(self, gen: Generation, req: ChatCompletionRequest) -> Generation:
        if req.bootstrap_room is None or req.bootstrap_host is None:
            raise ValueError("decode server needs bootstrap_host/port/room (use the router)")
        url = f"http://{req.bootstrap_host}:{req.bootstrap_port}"
        self.engine.rid_of_room[req.bootstrap_room] = gen.rid
        self.engine.add_room(DecodeRoom(req.bootstrap_room, gen.seq, url))
        return gen
