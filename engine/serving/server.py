"""OpenAI-compatible HTTP server over one ``Engine``, which also speaks SGLang's worker API.

Routes: POST /v1/chat/completions (stream or not), POST /generate (SGLang native), GET
/v1/models, /health, /health_generate, /metrics, /server_info, /model_info (and their /get_*
aliases), /get_load. Bad input answers 4xx with an OpenAI-style error body and never reaches the
engine; SGLang fields with no meaning here are named in ``X-Unsupported-Fields``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.core import Engine, FinishReason, PromptTooLongError
from engine.http import BodyLimit, add_debug_routes
from engine.http import error_response as error
from engine.http.errors import (
    CLIENT_CLOSED,
    FAILURE_STATUS,
    BadRequestError,
    failure_event,
    failure_response,
    guarded_stream,
)
from engine.http.metrics import Metrics, engine_gauges
from engine.serving import native
from engine.serving.admission import (
    Admission,
    ChatAdmitted,
    NativeAdmitted,
    admit_chat_body,
    admit_native_body,
    budgeted,
)
from engine.serving.generation import Generation
from engine.serving.info import MODEL_NAME, InfoRoutes
from engine.serving.logprobs import choice_logprobs
from engine.serving.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    PromptTokensDetails,
    ResponseMessage,
    Usage,
    completion_id,
    delta_of,
    room_rid,
    tool_calls_out,
)
from engine.serving.responses import FinishReason as FinishReasonOut
from engine.serving.variants import ServingHooks
from engine.text.parsers import NO_CALLS, ToolParser, get_parser
from engine.variants import hooks_for

log = logging.getLogger(__name__)


def finish_reason(gen: Generation, has_calls: bool) -> FinishReasonOut:
    if has_calls:
        return "tool_calls"
    return {FinishReason.LENGTH: "length", FinishReason.ABORT: "abort"}.get(gen.finish_reason,
                                                                          "stop")


def usage(gen: Generation, streamed: bool = False) -> Usage:
    n = gen.hooks.completion_tokens(len(gen.tokens), streamed)
    return Usage(prompt_tokens=gen.prompt_tokens, completion_tokens=n,
                 total_tokens=gen.prompt_tokens + n,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=gen.num_cached))


class ChatServer(InfoRoutes):
    mode: native.DisaggMode = "null"

    def __init__(self, engine: Engine, debug_token: str | None = None, port: int = 0, *,
                 debug_open: bool = False) -> None:
        self.engine = engine
        self.port = port
        self.parser = get_parser(engine.cfg.tool_parser)
        self.hooks = hooks_for(ServingHooks, engine.cfg.patches)  # variants, chosen once
        self.default_max_tokens = min(256, engine.cfg.max_new_tokens)
        self.metrics = Metrics(gauges=lambda: engine_gauges(self.engine))
        self.app = FastAPI(title="pd-workbench engine")
        self.app.add_middleware(BodyLimit, max_bytes=engine.cfg.max_body_bytes)
        add_debug_routes(self.app, engine, debug_token, debug_open)
        self.app.post("/v1/chat/completions")(self.chat)
        self.app.post("/generate")(self.generate)
        self.add_info_routes()

    def _observe(self, gen: Generation) -> None:
        """Latency histograms of a finished generation (arrival, first and last token)."""
        if gen.first_token_at is None:
            return
        end = time.time()
        self.metrics.observe("time_to_first_token_seconds", gen.first_token_at - gen.created)
        self.metrics.observe("e2e_request_latency_seconds", end - gen.created)
        if len(gen.tokens) > 1:
            self.metrics.observe("inter_token_latency_seconds",
                                 (end - gen.first_token_at) / (len(gen.tokens) - 1))

    def admit(self, a: Admission) -> Generation:
        """Hands a new generation to the engine (the decode role overrides this)."""
        return self._new_generation(a).start()

    def _new_generation(self, a: Admission) -> Generation:
        rid = None if a.boot.room is None else room_rid(a.boot.room)
        return Generation(self.engine, a.plan, a.params, rid=rid, output=a.output,
                          hooks=self.hooks)

    def authorize(self, request: Request) -> None:
        """Raises ``UnauthorizedError`` for a request this role must not serve without a
        credential (the single role serves anyone; PD roles need the deployment's secret)."""

    def _refuse(self, exc: Exception) -> JSONResponse:
        status = exc.status if isinstance(exc, BadRequestError) else 400
        self.metrics.inc("requests_total", status=str(status))
        if isinstance(exc, BadRequestError):
            return exc.response()
        return error(400, str(exc), "messages")

    async def parse_chat(self, request: Request) -> ChatAdmitted:
        """Parses, validates and tokenizes a chat body on a worker thread, never on the loop
        (a large body must not stall /health or other requests); raises ``BadRequestError``."""
        parsed = await asyncio.to_thread(admit_chat_body, self.engine.tokenizer,
                                         await request.body(), self.default_max_tokens)
        return budgeted(parsed, self.hooks.token_budget)

    async def parse_native(self, request: Request) -> NativeAdmitted:
        """``parse_chat`` for ``/generate`` bodies."""
        return await asyncio.to_thread(admit_native_body, self.engine.tokenizer,
                                       await request.body(), self.default_max_tokens)

    async def chat(self, request: Request):
        try:
            self.authorize(request)
            parsed = await self.parse_chat(request)
            gen = self.admit(parsed.admission)
        except (BadRequestError, PromptTooLongError, ValueError) as exc:
            return self._refuse(exc)
        req = parsed.req
        gen.want_token_ids = req.return_token_ids
        headers = native.unsupported_headers(req.unsupported())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            events = self.stream(gen, request, include_usage, req.logprobs)
            return StreamingResponse(guarded_stream(self._counted(gen, events)),
                                     media_type="text/event-stream", headers=headers)
        return await self.complete(gen, request, req.logprobs, headers)

    async def generate(self, request: Request):
        try:
            self.authorize(request)
            parsed = await self.parse_native(request)
            gen = self.admit(parsed.admission)
        except (BadRequestError, PromptTooLongError, ValueError) as exc:
            return self._refuse(exc)
        req = parsed.req
        headers = native.unsupported_headers(req.unsupported())
        if req.stream:
            events = self.native_stream(gen, request, req.return_logprob)
            return StreamingResponse(guarded_stream(self._counted(gen, events)),
                                     media_type="text/event-stream", headers=headers)
        await self._drain(gen, request)
        self._count_end(gen)
        if gen.failure is not None:
            return failure_response(gen.failure)
        return JSONResponse(native.native_body(gen, req.return_logprob), headers=headers)

    async def native_stream(self, gen: Generation, request: Request, logprobs: bool):
        watcher = asyncio.create_task(self._watch_disconnect(gen, request))
        try:
            async for _ in gen.events():
                yield native.sse(native.native_body(gen, logprobs))
        finally:
            watcher.cancel()
        if gen.failure is not None:
            yield failure_event(gen.failure)
            return
        yield native.sse(native.native_body(gen, logprobs))
        yield "data: [DONE]\n\n"

    async def _drain(self, gen: Generation, request: Request | None) -> None:
        watcher = (asyncio.create_task(self._watch_disconnect(gen, request))
                   if request is not None else None)
        try:
            async for _ in gen.events():
                pass
        finally:
            if watcher is not None:
                watcher.cancel()

    def _count_end(self, gen: Generation, status: int | None = None) -> None:
        """Counts a request once it ended: 200 served, the failure's status (500/502/504), or
        499 when its client left (a stream closed before its end); ``status`` overrides."""
        if status is None and gen.failure is not None:
            status = FAILURE_STATUS[gen.failure.kind]
        elif status is None:
            status = CLIENT_CLOSED if gen.finish_reason in (None, FinishReason.ABORT) else 200
        self.metrics.inc("requests_total", status=str(status))

    async def _counted(self, gen: Generation, events):
        """``events``, counted by ``_count_end`` however the stream ends (500 if it raised)."""
        status = None
        try:
            async for event in events:
                yield event
        except Exception:
            status = 500
            raise
        finally:
            self._count_end(gen, status)

    async def complete(self, gen: Generation, request: Request, logprobs: bool = False,
                       headers: dict | None = None) -> JSONResponse:
        await self._drain(gen, request)
        self._count_end(gen)
        if gen.failure is not None:
            return failure_response(gen.failure)
        self._observe(gen)
        parsed = self._parser(gen).parse(gen.unstreamed_text(), gen.plan.tools or None)
        self._count_leak(parsed.leaked)
        message = ResponseMessage(content=parsed.content or self.parser.serving.empty_content,
                                  tool_calls=tool_calls_out(parsed.calls))
        choice = Choice(message=message, dsml_leaked=parsed.leaked,
                        finish_reason=finish_reason(gen, bool(parsed.calls)),
                        token_ids=gen.tokens if gen.want_token_ids else None,
                        logprobs=choice_logprobs(self.engine.tokenizer, gen.logprobs)
                        if logprobs else None)
        body = ChatCompletion(id=completion_id(gen.rid), created=int(gen.created), model=MODEL_NAME,
                              choices=[choice], usage=usage(gen))
        return JSONResponse(body.model_dump(), headers=headers)

    async def _watch_disconnect(self, gen: Generation, request: Request) -> None:
        while gen.finish_reason is None:
            if await request.is_disconnected():
                self.engine.abort(gen.rid)
                return
            await asyncio.sleep(0.05)

    def _parser(self, gen: Generation) -> ToolParser:
        return self.parser if gen.plan.parse_calls else NO_CALLS

    def _count_leak(self, leaked: bool) -> None:
        self.metrics.inc("responses_total", dsml_leaked=str(leaked).lower())

    async def stream(self, gen: Generation, request: Request, include_usage: bool,
                     logprobs: bool = False):
        det = self._parser(gen).streamer(gen.plan.tools or None)
        base = {"id": completion_id(gen.rid), "created": int(gen.created), "model": MODEL_NAME}
        sent = ids_sent = 0  # logprob entries / token ids already attached to a chunk

        def chunk(delta: Delta, finish: FinishReasonOut | None = None, **extra) -> str:
            nonlocal sent, ids_sent
            if logprobs and len(gen.logprobs) > sent:
                extra["logprobs"] = choice_logprobs(self.engine.tokenizer, gen.logprobs[sent:])
                sent = len(gen.logprobs)
            if gen.want_token_ids and len(gen.tokens) > ids_sent:  # per delta, as vLLM does
                extra["token_ids"] = gen.tokens[ids_sent:]
                ids_sent = len(gen.tokens)
            choice = ChunkChoice(delta=delta, finish_reason=finish, **extra)
            return ChatCompletionChunk(**base, choices=[choice]).sse()

        yield chunk(Delta(role="assistant", content=""))
        pending = [gen.plan.forced_prefix] if gen.plan.forced_prefix else []
        async for _ in gen.events():
            pending.append(gen.take_text())
            for d in det.feed("".join(pending)):
                yield chunk(delta_of(d, self.parser.serving))
            pending = []
        if gen.failure is not None:
            yield failure_event(gen.failure)
            return
        for d in det.feed("".join([*pending, gen.take_text(final=True)])) + det.finish():
            yield chunk(delta_of(d, self.parser.serving))
        self._observe(gen)
        self._count_leak(det.leaked)
        yield chunk(Delta(), finish_reason(gen, bool(det.calls)), dsml_leaked=det.leaked)
        if include_usage:
            yield ChatCompletionChunk(**base, choices=[], usage=usage(gen, streamed=True)).sse()
        yield "data: [DONE]\n\n"


def create_app(engine: Engine, debug_token: str | None = None, port: int = 0, *,
               debug_open: bool = False) -> FastAPI:
    return ChatServer(engine, debug_token, port, debug_open=debug_open).app
