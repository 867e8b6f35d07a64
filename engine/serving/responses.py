"""OpenAI-compatible response models for ``/v1/chat/completions``: what the server sends.

Responses follow the OpenAI schema plus two extensions the official ``openai`` SDK keeps as
extra fields: a per-choice ``dsml_leaked`` flag and, when a request sets ``return_token_ids``,
the raw completion ``token_ids``.  Fields listed in a model's ``_omit_none`` are left out of the
serialized body while ``None`` (OpenAI omits them too); every other field is always present.
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from pydantic import BaseModel, model_serializer

FinishReason = Literal["stop", "length", "tool_calls", "abort"]


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


class Choice(_Wire):
    _omit_none = frozenset({"token_ids"})
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReason
    dsml_leaked: bool = False
    token_ids: list[int] | None = None


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
    _omit_none = frozenset({"dsml_leaked", "token_ids"})
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    dsml_leaked: bool | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Wire):
    """One SSE ``data:`` payload; the usage-only final chunk has ``choices == []``."""

    _omit_none = frozenset({"usage"})
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
