"""Admissions: what a parsed chat or ``/generate`` request asks the engine for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pydantic import BaseModel

from engine.core import SamplingParams
from engine.http import BadRequestError
from engine.serving.generation import Bootstrap, OutputOptions, PromptPlan, plan_prompt
from engine.serving.native import GenerateRequest, parse_generate_request
from engine.serving.protocol import ChatCompletionRequest, parse_chat_request, tool_specs
from engine.text import Tokenizer


@dataclass(frozen=True)
class Admission:
    """What a parsed request asks the engine for, whichever API it came through."""

    plan: PromptPlan
    params: SamplingParams
    boot: Bootstrap
    output: OutputOptions


@dataclass(frozen=True)
class ChatAdmitted:
    """A chat request and its admission (parsed and tokenized off the event loop)."""

    req: ChatCompletionRequest
    admission: Admission


@dataclass(frozen=True)
class NativeAdmitted:
    """A ``/generate`` request and its admission (parsed and tokenized off the event loop)."""

    req: GenerateRequest
    admission: Admission


def plan_chat(tk: Tokenizer, req: ChatCompletionRequest) -> PromptPlan:
    """The prompt a chat request renders to (tools, ``tool_choice`` prefix), tokenized."""
    choice = req.tool_choice
    if isinstance(choice, BaseModel):
        choice = choice.model_dump()
    return plan_prompt(tk, req.message_dicts(), tool_specs(req), choice)


def chat_admission(plan: PromptPlan, req: ChatCompletionRequest,
                   default_max_tokens: int) -> Admission:
    """A chat request (its prompt already planned) as an admission."""
    params = SamplingParams(max_tokens=req.max_tokens or default_max_tokens,
                            temperature=req.temperature or 0.0, top_p=req.top_p or 1.0,
                            seed=req.seed or 0, ignore_eos=req.ignore_eos,
                            logprobs=req.logprobs_n())
    return Admission(plan, params,
                     Bootstrap(req.bootstrap_host, req.bootstrap_port, req.bootstrap_room),
                     OutputOptions(req.skip_special_tokens, req.no_stop_trim,
                                   tuple(req.stop or ())))


def native_admission(tk: Tokenizer, req: GenerateRequest, default_max_tokens: int) -> Admission:
    """A ``/generate`` request as an admission (BadRequestError for ids outside the vocab)."""
    sp = req.sampling_params
    ids = list(req.input_ids) if req.input_ids is not None else tk.encode(req.text)
    if any(not 0 <= t < len(tk.itos) for t in ids):
        raise BadRequestError(f"input_ids: token ids must be in 0..{len(tk.itos) - 1}",
                              "input_ids")
    params = SamplingParams(max_tokens=sp.max_new_tokens or default_max_tokens,
                            temperature=sp.temperature, top_p=sp.top_p,
                            seed=sp.sampling_seed or 0, ignore_eos=sp.ignore_eos,
                            stop_token_ids=tuple(sp.stop_token_ids or ()),
                            logprobs=req.top_logprobs_num if req.return_logprob else None)
    return Admission(PromptPlan(ids, "", []), params,
                     Bootstrap(req.bootstrap_host, req.bootstrap_port, req.bootstrap_room),
                     OutputOptions(sp.skip_special_tokens, sp.no_stop_trim))


def admit_chat_body(tk: Tokenizer, body: bytes, default_max_tokens: int) -> ChatAdmitted:
    """Parses, validates and tokenizes a chat body (CPU-bound: servers run it on a worker
    thread); raises ``BadRequestError`` or ``ValueError``."""
    req = parse_chat_request(body)
    return ChatAdmitted(req, chat_admission(plan_chat(tk, req), req, default_max_tokens))


def admit_native_body(tk: Tokenizer, body: bytes, default_max_tokens: int) -> NativeAdmitted:
    """``admit_chat_body`` for ``/generate`` bodies."""
    req = parse_generate_request(body)
    return NativeAdmitted(req, native_admission(tk, req, default_max_tokens))


def budgeted(parsed: ChatAdmitted, budget) -> ChatAdmitted:
    """``parsed`` with the token budget ``budget(max_tokens, explicit)`` gives it (the serving
    layer's hook; correct: unchanged)."""
    a = parsed.admission
    n = budget(a.params.max_tokens, parsed.req.max_tokens is not None)
    if n == a.params.max_tokens:
        return parsed
    return dataclasses.replace(parsed, admission=dataclasses.replace(
        a, params=dataclasses.replace(a.params, max_tokens=n)))
