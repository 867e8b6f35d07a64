"""The routes that describe a server rather than generate: models, health, SGLang's info routes
(``/server_info``, ``/model_info`` and their ``/get_*`` aliases, ``/get_load``) and metrics."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.core import SamplingParams
from engine.http import error_response as error
from engine.serving import native
from engine.serving.generation import Generation, PromptPlan

MODEL_NAME = "tiny-deepseek"


class InfoRoutes:
    """Mixed into ``ChatServer`` (which has ``engine``, ``mode``, ``port``, ``metrics``, ``app``
    and ``_drain``)."""

    def add_info_routes(self) -> None:
        self.app.get("/v1/models")(self.models)
        self.app.get("/health")(self.health)
        self.app.get("/health_generate")(self.health_generate)
        self.app.get("/metrics")(self.prometheus)
        for path in ("/server_info", "/get_server_info"):
            self.app.get(path)(self.server_info)
        for path in ("/model_info", "/get_model_info"):
            self.app.get(path)(self.model_info)
        self.app.get("/get_load")(self.get_load)

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model",
                                            "owned_by": "pd-workbench", "created": 0}]}

    async def health(self):
        """200 while the engine loop runs; 503 once it died (a router stops sending here)."""
        if not self.engine.alive:
            return error(503, "engine loop is not running")
        return {"status": "ok"}

    async def health_generate(self) -> JSONResponse:
        """200 once the engine loop answers (the single role also generates one token)."""
        try:
            if self.mode == "null":
                tk = self.engine.tokenizer
                gen = Generation(self.engine, PromptPlan([tk.bos_id], "", []),
                                 SamplingParams(max_tokens=1)).start()
                await asyncio.wait_for(self._drain(gen, None), 20.0)
            else:
                await asyncio.to_thread(self.engine.on_loop, lambda: True, 10.0)
        except (TimeoutError, asyncio.TimeoutError):
            return error(503, "engine loop did not answer")
        return JSONResponse({"status": "ok"})

    async def server_info(self) -> dict:
        return native.server_info(self.engine, self.mode, self.port)

    async def model_info(self) -> dict:
        return native.model_info(self.engine)

    async def get_load(self) -> list:
        return await asyncio.to_thread(self.engine.on_loop, lambda: native.load_info(self.engine))

    async def prometheus(self, request: Request) -> Response:
        body, content_type = self.metrics.render(request.headers.get("accept", ""))
        return Response(body, media_type=content_type)
