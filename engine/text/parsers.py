"""Tool-call parser variants, chosen per launch (``--set tool_parser=NAME``).

- ``strict``: ours (``engine.text.dsml``); the oracle's parser. A malformed block goes to content
  verbatim with ``leaked`` set; streaming equals one-shot for every chunking.
- ``sglang``: SGLang 0.5.21-0.5.23's ``DeepSeekV32Detector`` behind its ``FunctionCallParser``
  (``engine.text.sglang_dsml``): fail-closed, so corrupted markup mostly vanishes instead of
  leaking; streaming can differ from one-shot and between chunkings, as SGLang's does.
- ``sglang-leaky``: SGLang 0.5.15's detector, serving included (``engine.text.sglang_leaky``):
  when no call parses the whole text, raw DSML included, is the content (0.5.6-0.5.15).
- ``vllm``: vLLM 0.32's DeepSeek-V3.2 engine parser (``engine.text.vllm_dsml``): content is the
  prose before the first opener, truncated and unknown calls are kept, JSON bodies lose their
  arguments, streamed arguments can stay unclosed and depend on the chunking.

Each variant gives ``parse(text, tools) -> ParseResult`` and ``streamer(tools)``, an object with
``feed(delta) -> [StreamEvent]``, ``finish() -> [StreamEvent]``, ``calls``, ``leaked`` and
``result()``, and the ``ServingRules`` of the server it reproduces (both SGLang variants: an
empty content is ``""``, a call streamed with an empty name carries no name and no id, as
SGLang 0.5.15 and 0.5.23's ``serving_chat`` do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.registry import Registry
from engine.text.chat import ToolCall, ToolSpec
from engine.text.dsml import (
    ContentDelta,
    ContentLog,
    ParseResult,
    StreamEvent,
    StreamingDSMLDetector,
    parse_tool_calls,
)
from engine.text.dsml_grammar import has_marker
from engine.text.sglang_dsml import SGLangStreamParser, parse_sglang
from engine.text.sglang_leaky import SGLangLeakyStreamParser, parse_sglang_leaky
from engine.text.vllm_dsml import VllmStreamParser, parse_vllm


class StreamParser(Protocol):
    leaked: bool

    @property
    def calls(self) -> tuple[ToolCall, ...]: ...

    def feed(self, delta: str) -> list[StreamEvent]: ...

    def finish(self) -> list[StreamEvent]: ...

    def result(self) -> ParseResult: ...


@dataclass(frozen=True)
class ServingRules:
    """How the chat serving a variant comes from shapes what the parse gives.

    ``empty_content``: a message's content when the parse leaves none (``None``: JSON null, as
    OpenAI and vLLM send; SGLang sends ``""``). ``drop_empty_name``: a streamed call whose name
    is empty goes out with neither name nor id (SGLang sends both only for a non-empty name)."""

    empty_content: str | None = None
    drop_empty_name: bool = False


OPENAI_SERVING = ServingRules()  # vLLM 0.32 too, for tool_choice auto
SGLANG_SERVING = ServingRules(empty_content="", drop_empty_name=True)


@dataclass(frozen=True)
class ToolParser:
    name: str
    parse: Callable[[str, list[ToolSpec] | None], ParseResult]
    streamer: Callable[[list[ToolSpec] | None], StreamParser]
    description: str
    serving: ServingRules = OPENAI_SERVING


def parse_nothing(text: str, tools: list[ToolSpec] | None) -> ParseResult:
    """No tool-call parsing: the output is content, verbatim (``tool_choice: "none"``)."""
    return ParseResult(text, (), has_marker(text))


class PassThrough:
    """Streaming counterpart of ``parse_nothing``."""

    def __init__(self, tools: list[ToolSpec] | None = None) -> None:
        self._log = ContentLog()
        self.calls: tuple[ToolCall, ...] = ()

    @property
    def leaked(self) -> bool:
        return self._log.leaked

    def feed(self, delta: str) -> list[StreamEvent]:
        if not delta:
            return []
        self._log.append(delta)
        return [ContentDelta(delta)]

    def finish(self) -> list[StreamEvent]:
        return []

    def result(self) -> ParseResult:
        return ParseResult(self._log.text(), (), self.leaked)


NO_CALLS = ToolParser("none", parse_nothing, PassThrough, "no parsing: output is content")
PARSERS: Registry[ToolParser] = Registry("tool parser")
PARSERS.register("strict", ToolParser(
    "strict", parse_tool_calls, StreamingDSMLDetector,
    "ours: malformed blocks go to content with dsml_leaked; stream == one-shot"))
PARSERS.register("sglang", ToolParser(
    "sglang", parse_sglang, SGLangStreamParser,
    "SGLang 0.5.21-0.5.23 DeepSeekV32Detector: fail-closed, malformed markup is dropped",
    SGLANG_SERVING))
PARSERS.register("sglang-leaky", ToolParser(
    "sglang-leaky", parse_sglang_leaky, SGLangLeakyStreamParser,
    "SGLang 0.5.15 DeepSeekV32Detector: no call parsed -> the whole text, DSML too, is content",
    SGLANG_SERVING))
PARSERS.register("vllm", ToolParser(
    "vllm", parse_vllm, VllmStreamParser,
    "vLLM 0.32 DeepSeekV32 engine parser: prose before the first opener, truncated and unknown "
    "calls kept, streamed arguments may be unclosed and chunk-dependent"))


def get_parser(name: str) -> ToolParser:
    """The registered variant ``name`` (``UnknownVariantError`` lists the valid ones)."""
    return PARSERS.get(name)
