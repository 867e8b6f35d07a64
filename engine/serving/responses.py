"""OpenAI-compatible response models for ``/v1/chat/completions``: what the server sends.

Responses follow the OpenAI schema plus two extensions the official ``openai`` SDK keeps as
extra fields: a per-choice ``dsml_leaked`` flag and, when a request sets ``return_token_ids``,
the raw completion ``token_ids`` (in a stream, each chunk carries the ids generated since the
previous one, as vLLM does).  Fields listed in a model's ``_omit_none`` are left out of the
serialized body while ``None`` (OpenAI omits them too); every other field is always present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import BaseModel, model_serializer

from engine.text import ToolCall
from engine.text.dsml import ContentDelta, ToolCallDelta, arguments_json, tool_call_id
from engine.text.parsers import OPENAI_SERVING, ServingRules

FinishReason = Literal["stop", "length", "tool_calls", "abort"]
ROOM_RID = re.compile(r"room-(\d+)")


def room_rid(room: int) -> str:
    """The request id of a PD request: its bootstrap room, so the id names the room."""
    return f"room-{room}"


def completion_id(rid: str) -> str:
    return f"chatcmpl-{rid}"


def room_of_completion_id(cid: str) -> int | None:
    """The bootstrap room a completion id (``chatcmpl-room-R``) names; None for others. Survives
    any router that passes the decode's body through (SGLang's does; it drops our header)."""
    m = ROOM_RID.fullmatch(cid.removeprefix("chatcmpl-"))
    return int(m.group(1)) if m else None


class _Wire(BaseModel):
    _omit_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_unset_extras(self, handler) -> dict:
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in self._omit_none}

    def sse(self) -> str:
        """The body as one server-sent event (``data: <json>`` and a blank line)."""
        return f"data: {json.dumps(self.model_dump())}\n\n"


class FunctionCallOut(_Wire):
    name: str
    arguments: str


class ToolCallOut(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ResponseMessage(_Wire):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class TopLogprobOut(_Wire):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobOut(_Wire):
    token: str
    logprob: float  # -9999.0 where unknown (OpenAI's convention)
    bytes: list[int]
    top_logprobs: list[TopLogprobOut]


class ChoiceLogprobs(_Wire):
    content: list[TokenLogprobOut]


class Choice(_Wire):
    _omit_none = frozenset({"token_ids", "logprobs"})
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReason
    dsml_leaked: bool = False
    token_ids: list[int] | None = None
    logprobs: ChoiceLogprobs | None = None


class PromptTokensDetails(_Wire):
    cached_tokens: int = 0


class Usage(_Wire):
    _omit_none = frozenset({"prompt_tokens_details"})
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ChatCompletion(_Wire):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class DeltaFunction(_Wire):
    _omit_none = frozenset({"name", "arguments"})
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Wire):
    _omit_none = frozenset({"id", "type", "function"})
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction | None = None


class Delta(_Wire):
    _omit_none = frozenset({"role", "content", "tool_calls"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(_Wire):
    _omit_none = frozenset({"dsml_leaked", "token_ids", "logprobs"})
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    dsml_leaked: bool | None = None
    token_ids: list[int] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(_Wire):
    """One SSE ``data:`` payload; the usage-only final chunk has ``choices == []``."""

    _omit_none = frozenset({"usage"})
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


def tool_calls_out(calls: Sequence[ToolCall]) -> list[ToolCallOut] | None:
    """The wire form of parsed calls (ids from ``tool_call_id``); None when there are none."""
    out = [ToolCallOut(id=tool_call_id(i, c),
                       function=FunctionCallOut(name=c.name, arguments=arguments_json(c.arguments)))
           for i, c in enumerate(calls)]
    return out or None


def delta_of(ev: ContentDelta | ToolCallDelta, rules: ServingRules = OPENAI_SERVING) -> Delta:
    """A stream parser's event as a chunk delta; a call's first delta carries its id, name and
    type (under ``rules.drop_empty_name`` only when the name is not empty)."""
    if isinstance(ev, ContentDelta):
        return Delta(content=ev.text)
    first = ev.name is not None and (ev.name != "" or not rules.drop_empty_name)
    fn = DeltaFunction(name=ev.name if first else None, arguments=ev.arguments)
    call = DeltaToolCall(index=ev.index, function=fn, id=ev.id if first else None,
                         type="function" if first else None)
    return Delta(tool_calls=[call])
