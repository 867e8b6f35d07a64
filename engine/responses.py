"""OpenAI-compatible response models for ``/v1/chat/completions`` (the server's wire schema).

Responses follow the OpenAI schema plus a per-choice ``dsml_leaked`` flag (and ``token_ids``
when a request asks for them), which the official ``openai`` SDK keeps as extra fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

FinishReason = Literal["stop", "length", "tool_calls", "abort"]


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReason
    dsml_leaked: bool = False


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    dsml_leaked: bool | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE ``data:`` payload; the usage-only final chunk has ``choices == []``."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
