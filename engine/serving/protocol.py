"""OpenAI-compatible request models (pydantic v2) for ``/v1/chat/completions``.

Requests are strict: unknown fields, wrong JSON types and out-of-range values are rejected with a
``ValidationError``; ``parse_chat_request`` turns it into a ``BadRequestError`` naming the field
(``engine.http.errors``). Response bodies are modelled in ``engine.serving.responses``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from engine.http.errors import BadRequestError, json_object, validation_error_message
from engine.serving.tool_params import ParametersSchema
from engine.text import ToolSpec
from engine.text.dsml import TOOL_NAME_PATTERN

DEFAULT_MODEL = "tiny-deepseek"
MAX_TOKENS_LIMIT = 4096


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionCallIn(_Request):
    name: str = Field(pattern=f"^{TOOL_NAME_PATTERN}$")
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, v: str) -> str:
        try:
            if isinstance(json.loads(v), dict):
                return v
        except ValueError:
            pass
        raise ValueError("must be a JSON-encoded object string")


class ToolCallIn(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class Message(_Request):
    """A chat message. Invariant: system/user/tool have string content; assistant has content
    or tool_calls; tool_calls only on assistant; tool_call_id only on tool."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, v: Any) -> Any:
        """Accepts OpenAI content parts ``[{"type": "text", "text": ...}]`` as a string."""
        if not isinstance(v, list):
            return v
        if not all(isinstance(p, dict) and p.keys() == {"type", "text"} and p["type"] == "text"
                   and isinstance(p["text"], str) for p in v):
            raise ValueError("content parts must be {'type': 'text', 'text': str}")
        return "".join(p["text"] for p in v)

    @model_validator(mode="after")
    def _role_rules(self) -> Message:
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"{self.role} message requires content")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise ValueError("assistant message requires content or tool_calls")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls is only allowed on assistant messages")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("tool_call_id is only allowed on tool messages")
        return self


class FunctionDef(_Request):
    name: str = Field(pattern=f"^{TOOL_NAME_PATTERN}$")
    description: str | None = None
    parameters: ParametersSchema | None = None
    strict: bool | None = None


class ToolParam(_Request):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Request):
    include_usage: bool = False


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions`` body.

    Invariants after validation: ``messages`` is non-empty; tool names are unique and
    ``tool_choice`` names a declared tool; ``stop`` is None or a list of 1-4 non-empty strings;
    ``max_tokens`` (alias ``max_completion_tokens``) is None or in 1..4096; ``n == 1``.
    """

    model: str = DEFAULT_MODEL
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolParam] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS_LIMIT,
        validation_alias=AliasChoices("max_tokens", "max_completion_tokens"))
    temperature: float | None = Field(default=0.0, ge=0.0, le=2.0)  # null: the default (0)
    top_p: float | None = Field(default=1.0, gt=0.0, le=1.0)  # null: the default (1)
    # common OpenAI fields: accepted; those set to something not honoured here are named in
    # X-Unsupported-Fields (see ``unsupported``)
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # torch.Generator's range
    n: int = 1
    stop: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, min_length=1, max_length=4)
    return_token_ids: bool = False  # extension: raw completion token ids (for oracles)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # SGLang's fields (its router sends them on every request)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    continue_final_message: bool = False
    separate_reasoning: bool = True  # no reasoning parser here: nothing to separate
    stream_reasoning: bool = True
    return_hidden_states: bool = False
    # PD disaggregation: set by the router on the copies it sends to prefill and decode.
    bootstrap_host: str | None = None
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535)
    bootstrap_room: int | None = Field(default=None, ge=0, lt=2**63)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_shape(cls, v: Any) -> Any:
        if isinstance(v, dict) or v is None or v in ("auto", "none", "required"):
            return v
        raise ValueError("must be 'auto', 'none', 'required' or "
                         "{'type': 'function', 'function': {'name': ...}}")

    @model_validator(mode="before")
    @classmethod
    def _one_max_tokens(cls, data: Any) -> Any:
        if isinstance(data, dict) and {"max_tokens", "max_completion_tokens"} <= data.keys():
            raise ValueError("max_tokens: give only one of max_tokens and max_completion_tokens")
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("n")
    @classmethod
    def _only_one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> ChatCompletionRequest:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: duplicate function name")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice: function {choice.function.name!r} is not in tools")
        if choice == "required" and not names:
            raise ValueError("tool_choice: 'required' needs at least one tool")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs to be true")
        return self

    def unsupported(self) -> list[str]:
        """SGLang fields set to something this server does not honour."""
        names = [k for k in ("continue_final_message", "return_hidden_states", "presence_penalty",
                             "frequency_penalty") if getattr(self, k)]
        if self.response_format and self.response_format.get("type") != "text":
            names.append("response_format")
        return names

    def logprobs_n(self) -> int | None:
        """``SamplingParams.logprobs``: None unless ``logprobs`` is true."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def message_dicts(self) -> list[dict]:
        """Messages as plain dicts for ``engine.chat.render_prompt``."""
        return [m.model_dump(exclude_none=True) for m in self.messages]


def tool_specs(req: ChatCompletionRequest) -> list[ToolSpec]:
    """The request's tools as ``ToolSpec`` (empty when no tools are declared)."""
    return [ToolSpec.from_openai(t.model_dump(exclude_none=True, by_alias=True))
            for t in req.tools or []]


def parse_chat_request(raw: bytes) -> ChatCompletionRequest:
    """The validated chat request in ``raw``; raises BadRequestError naming the field."""
    try:
        return ChatCompletionRequest.model_validate(json_object(raw))
    except ValidationError as exc:
        raise BadRequestError(validation_error_message(exc)) from None
