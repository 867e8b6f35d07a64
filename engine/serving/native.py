"""SGLang's native worker API, so SGLang's router (and its users' scripts) can drive our servers.

``POST /generate`` (text or ``input_ids``, ``sampling_params``, ``stream``, ``return_logprob``,
bootstrap fields) answers ``{"text", "output_ids", "meta_info"}``; streamed, every
``data:`` chunk carries the cumulative text and ids, then ``data: [DONE]``. The info routes
``/server_info``, ``/model_info`` (and their ``/get_*`` aliases) and ``/get_load`` carry the fields
SGLang's router reads. Fields SGLang accepts that have no meaning here are accepted and named in
the ``X-Unsupported-Fields`` response header (``UNSUPPORTED``); fields SGLang does not know get 400.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.core import FinishReason
from engine.http.errors import BadRequestError, json_object, validation_error_message
from engine.serving.generation import Generation

UNSUPPORTED_HEADER = "X-Unsupported-Fields"
VERSION = "pd-workbench-0.1"


class _Native(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class NativeSampling(_Native):
    """``sampling_params`` of ``/generate``: the keys SGLang's router forwards."""

    max_new_tokens: int | None = Field(default=None, ge=1, le=4096)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop_token_ids: list[int] | None = None
    # accepted, not honoured (named in X-Unsupported-Fields when set)
    top_k: int | None = None
    min_p: float | None = None
    min_new_tokens: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    n: int | None = None


class GenerateRequest(_Native):
    """``POST /generate``. Invariant: exactly one of ``text`` and ``input_ids`` is given."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: NativeSampling = Field(default_factory=NativeSampling)
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(default=0, ge=0, le=20)
    rid: str | None = None
    model: str | None = None
    bootstrap_host: str | None = None
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535)
    bootstrap_room: int | None = Field(default=None, ge=0, lt=2**63)
    # SGLang fields with no meaning here (its router always sends them)
    logprob_start_len: int | None = None
    return_text_in_logprobs: bool = False
    log_metrics: bool = True
    return_hidden_states: bool = False
    background: bool = False
    no_logs: bool = False
    return_bytes: bool = False
    return_entropy: bool = False

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("text: give exactly one of text and input_ids")
        if self.input_ids is not None and not self.input_ids:
            raise ValueError("input_ids: must not be empty")
        return self

    def unsupported(self) -> list[str]:
        """The fields set to something this server does not honour."""
        sp = self.sampling_params
        names = [f"sampling_params.{k}" for k in ("top_k", "min_p", "min_new_tokens",
                                                  "frequency_penalty", "presence_penalty",
                                                  "repetition_penalty", "stop", "json_schema",
                                                  "regex", "ebnf", "n") if getattr(sp, k)]
        names += [k for k in ("return_hidden_states", "background", "return_entropy")
                  if getattr(self, k)]
        return names


def parse_generate_request(raw: bytes) -> GenerateRequest:
    """The validated ``/generate`` body in ``raw``; raises BadRequestError naming the field."""
    body = json_object(raw)
    if isinstance(body.get("text"), list) or isinstance(body.get("sampling_params"), list):
        raise BadRequestError("batched /generate is not supported: send one prompt", "text")
    try:
        return GenerateRequest.model_validate(body)
    except ValidationError as exc:
        raise BadRequestError(validation_error_message(exc)) from None


def finish_reason_of(gen: Generation) -> dict[str, Any] | None:
    """SGLang's ``meta_info.finish_reason``: ``{"type": "stop"|"length"|"abort", ...}``."""
    match gen.finish_reason:
        case None:
            return None
        case FinishReason.STOP:
            return {"type": "stop", "matched": gen.tokens[-1] if gen.tokens else None}
        case FinishReason.LENGTH:
            return {"type": "length", "length": len(gen.tokens)}
        case _:
            return {"type": "abort", "message": "request aborted"}


def native_body(gen: Generation, logprobs: bool) -> dict[str, Any]:
    """One ``/generate`` answer (or cumulative stream chunk) for ``gen`` as it stands."""
    meta = {"id": gen.rid, "finish_reason": finish_reason_of(gen),
            "prompt_tokens": gen.prompt_tokens, "completion_tokens": len(gen.tokens),
            "cached_tokens": gen.num_cached}
    if logprobs:
        meta["output_token_logprobs"] = [[lp.logprob, lp.token, None] for lp in gen.logprobs]
    return {"text": gen.text(), "output_ids": list(gen.tokens), "meta_info": meta}


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def unsupported_headers(names: list[str]) -> dict[str, str]:
    return {UNSUPPORTED_HEADER: ",".join(names)} if names else {}


DisaggMode = Literal["null", "prefill", "decode"]


def server_info(engine, mode: DisaggMode, port: int) -> dict[str, Any]:
    """``/server_info``: the fields SGLang's router reads, plus limits and the bootstrap port
    (the prefill's own HTTP port: its ``/disagg/*`` routes are the bootstrap server)."""
    cfg = engine.cfg
    return {"model_path": str(cfg.model_dir), "served_model_name": "tiny-deepseek",
            "tokenizer_path": str(cfg.model_dir), "tp_size": 1, "dp_size": 1,
            "load_balance_method": "round_robin", "disaggregation_mode": mode,
            "disaggregation_bootstrap_port": port if mode == "prefill" else None,
            "disaggregation_transfer_backend": "nixl", "status": "ready",
            "max_total_num_tokens": cfg.num_pages * cfg.page_size,
            "max_req_input_len": cfg.max_prompt_tokens, "page_size": cfg.page_size,
            "version": VERSION, "internal_states": []}


def model_info(engine) -> dict[str, Any]:
    return {"model_path": str(engine.cfg.model_dir), "tokenizer_path": str(engine.cfg.model_dir),
            "is_generation": True, "model_type": "tiny_deepseek",
            "architectures": ["TinyDeepSeek"], "weight_version": "default",
            "has_image_understanding": False, "has_audio_understanding": False}


def load_info(engine) -> list[dict[str, Any]]:
    """``/get_load``: one entry (one DP rank); ``num_tokens`` is what the router sums."""
    sched = engine.scheduler
    running, waiting = list(sched.running), list(sched.waiting)
    tokens = sum(s.num_tokens for s in running) + sum(len(s.prompt) for s in waiting)
    return [{"dp_rank": 0, "num_reqs": len(running) + len(waiting),
             "num_waiting_reqs": len(waiting), "num_tokens": tokens}]
