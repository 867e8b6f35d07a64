"""Prompts that end exactly on a boundary: the load's padding for aligned-length modes.

A bug at page- or chunk-aligned prompt lengths fires on about one prompt in ``align`` by chance
(one in 256 for the default chunk); padding each request's last message with spaces (one token
each under the engine's tokenizer) makes every prompt end on a multiple of ``align`` tokens.
"""

from __future__ import annotations

from engine.config import EngineConfig
from engine.serving.generation import plan_prompt
from engine.text import Tokenizer, ToolSpec

_TOKENIZER = Tokenizer()
MAX_PROMPT_TOKENS = EngineConfig.max_prompt_tokens


def prompt_length(messages: list[dict], tools: list[dict]) -> int:
    """Tokens of the prompt the engine builds for ``messages`` and ``tools``."""
    specs = [ToolSpec.from_openai(t) for t in tools]
    return len(plan_prompt(_TOKENIZER, messages, specs, None).ids)


def pad_to_boundary(messages: list[dict], tools: list[dict], align: int,
                    limit: int = MAX_PROMPT_TOKENS) -> int:
    """Pads the last message's text in place so the prompt is a multiple of ``align`` tokens
    long; returns the tokens added (0 when already aligned, when the last message has no text,
    or when the padded prompt would exceed ``limit``)."""
    if align < 1:
        raise ValueError(f"align must be >= 1, not {align}")
    n = prompt_length(messages, tools)
    pad = -n % align
    last = messages[-1]
    if pad == 0 or not isinstance(last.get("content"), str) or n + pad > limit:
        return 0
    last["content"] += " " * pad
    return pad
