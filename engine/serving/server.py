"""OpenAI-compatible HTTP server over one ``Engine``.

Routes: POST /v1/chat/completions (stream or not), GET /v1/models, /health, /metrics.
Bad input answers 4xx with an OpenAI-style error body and never reaches the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from engine.core.engine import Engine, PromptTooLongError
from engine.core.sequence import FinishReason, SamplingParams
from engine.serving.debug import add_debug_routes
from engine.serving.errors import BadRequestError
from engine.serving.errors import error_response as error
from engine.serving.generation import Generation, PromptPlan, plan_prompt
from engine.serving.metrics import Metrics, engine_gauges
from engine.serving.protocol import ChatCompletionRequest, parse_chat_request, tool_specs
from engine.serving.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    DeltaFunction,
    DeltaToolCall,
    FunctionCallOut,
    PromptTokensDetails,
    ResponseMessage,
    ToolCallOut,
    Usage,
)
from engine.serving.responses import FinishReason as FinishReasonOut
from engine.text.chat import ToolCall
from engine.text.dsml import (
    ContentDelta,
    StreamingDSMLDetector,
    ToolCallDelta,
    arguments_json,
    parse_tool_calls,
    tool_call_id,
)

log = logging.getLogger(__name__)
MODEL_NAME = "tiny-deepseek"


def sampling_params(req: ChatCompletionRequest, default_max: int) -> SamplingParams:
    return SamplingParams(max_tokens=req.max_tokens or default_max,
                          temperature=req.temperature or 0.0, top_p=req.top_p or 1.0,
                          seed=req.seed or 0)


def finish_reason(gen: Generation, has_calls: bool) -> FinishReasonOut:
    if has_calls:
        return "tool_calls"
    return {FinishReason.LENGTH: "length", FinishReason.ABORT: "abort"}.get(gen.finish_reason,
                                                                          "stop")


def tool_calls_out(calls: Sequence[ToolCall]) -> list[ToolCallOut] | None:
    out = [ToolCallOut(id=tool_call_id(i, c),
                       function=FunctionCallOut(name=c.name, arguments=arguments_json(c.arguments)))
           for i, c in enumerate(calls)]
    return out or None


def usage(gen: Generation) -> Usage:
    n = len(gen.tokens)
    return Usage(prompt_tokens=gen.prompt_tokens, completion_tokens=n,
                 total_tokens=gen.prompt_tokens + n,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=gen.num_cached))


class ChatServer:
    def __init__(self, engine: Engine, debug_token: str | None = None) -> None:
        self.engine = engine
        self.metrics = Metrics()
        self.app = FastAPI(title="pd-workbench engine")
        add_debug_routes(self.app, engine, debug_token)
        self.app.post("/v1/chat/completions")(self.chat)
        self.app.get("/v1/models")(self.models)
        self.app.get("/health")(self.health)
        self.app.get("/metrics")(self.prometheus)

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model",
                                            "owned_by": "pd-workbench", "created": 0}]}

    async def health(self) -> dict:
        return {"status": "ok"}

    async def prometheus(self) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(engine_gauges(self.engine)))

    def plan(self, req: ChatCompletionRequest) -> PromptPlan:
        choice = req.tool_choice
        if isinstance(choice, pydantic.BaseModel):
            choice = choice.model_dump()
        return plan_prompt(self.engine, req.message_dicts(), tool_specs(req), choice)

    def new_generation(self, req: ChatCompletionRequest) -> Generation:
        params = sampling_params(req, min(256, self.engine.cfg.max_new_tokens))
        room = req.bootstrap_room
        gen = Generation(self.engine, self.plan(req), params,
                         rid=None if room is None else f"room-{room}")
        gen.want_token_ids = req.return_token_ids
        return self.start_generation(gen, req)

    def start_generation(self, gen: Generation, req: ChatCompletionRequest) -> Generation:
        """Hands the generation to the engine (the decode role overrides this)."""
        return gen.start()

    async def chat(self, request: Request):
        try:
            req = parse_chat_request(await request.body())
        except BadRequestError as exc:
            self.metrics.inc("requests_total", status="400")
            return exc.response()
        try:
            gen = self.new_generation(req)
        except (PromptTooLongError, ValueError) as exc:
            self.metrics.inc("requests_total", status="400")
            return error(400, str(exc), "messages")
        self.metrics.inc("requests_total", status="200")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(self.stream(gen, request, include_usage),
                                     media_type="text/event-stream")
        return await self.complete(gen, request)

    async def complete(self, gen: Generation, request: Request) -> JSONResponse:
        watcher = asyncio.create_task(self._watch_disconnect(gen, request))
        try:
            async for _ in gen.events():
                pass
        finally:
            watcher.cancel()
        text = gen.plan.forced_prefix + "".join(gen.text_of(t) for t in gen.tokens)
        parsed = parse_tool_calls(text, gen.plan.tools or None)
        self._count_leak(parsed.leaked)
        message = ResponseMessage(content=parsed.content or None,
                                  tool_calls=tool_calls_out(parsed.calls))
        choice = Choice(message=message, dsml_leaked=parsed.leaked,
                        finish_reason=finish_reason(gen, bool(parsed.calls)),
                        token_ids=gen.tokens if gen.want_token_ids else None)
        body = ChatCompletion(id=f"chatcmpl-{gen.rid}", created=int(gen.created), model=MODEL_NAME,
                              choices=[choice], usage=usage(gen))
        return JSONResponse(body.model_dump())

    async def _watch_disconnect(self, gen: Generation, request: Request) -> None:
        while gen.finish_reason is None:
            if await request.is_disconnected():
                self.engine.abort(gen.rid)
                return
            await asyncio.sleep(0.05)

    def _count_leak(self, leaked: bool) -> None:
        self.metrics.inc("responses_total", dsml_leaked=str(leaked).lower())

    async def stream(self, gen: Generation, request: Request, include_usage: bool):
        det = StreamingDSMLDetector(gen.plan.tools or None)
        base = {"id": f"chatcmpl-{gen.rid}", "created": int(gen.created), "model": MODEL_NAME}

        def chunk(delta: Delta, finish: FinishReasonOut | None = None, **extra) -> str:
            choice = ChunkChoice(delta=delta, finish_reason=finish, **extra)
            return ChatCompletionChunk(**base, choices=[choice]).sse()

        yield chunk(Delta(role="assistant", content=""))
        pending = [gen.plan.forced_prefix] if gen.plan.forced_prefix else []
        async for ev in gen.events():
            pending.append(gen.text_of(ev.token))
            for d in det.feed("".join(pending)):
                yield chunk(self._delta(d))
            pending = []
        for d in det.finish():
            yield chunk(self._delta(d))
        self._count_leak(det.leaked)
        yield chunk(Delta(), finish_reason(gen, bool(det.calls)), dsml_leaked=det.leaked,
                    token_ids=gen.tokens if gen.want_token_ids else None)
        if include_usage:
            yield ChatCompletionChunk(**base, choices=[], usage=usage(gen)).sse()
        yield "data: [DONE]\n\n"

    @staticmethod
    def _delta(ev: ContentDelta | ToolCallDelta) -> Delta:
        if isinstance(ev, ContentDelta):
            return Delta(content=ev.text)
        fn = DeltaFunction(name=ev.name, arguments=ev.arguments)
        first = ev.name is not None  # the first delta of a call carries its id and type
        call = DeltaToolCall(index=ev.index, function=fn, id=ev.id if first else None,
                             type="function" if first else None)
        return Delta(tool_calls=[call])


def create_app(engine: Engine, debug_token: str | None = None) -> FastAPI:
    return ChatServer(engine, debug_token).app

