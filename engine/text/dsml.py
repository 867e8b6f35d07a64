"""DSML tool-call parsing: batch (``parse_tool_calls``) and streaming (``StreamingDSMLDetector``).

Both share one set of rules, so for any split of a text into deltas the streamed content and
calls equal the batch parse of the whole text:

- A block starts at ``FC_OPEN`` and extends to the first ``FC_CLOSE`` after it (or to the end
  of the text when unclosed).
- A block that parses completely becomes tool calls. Any other block (unclosed, bad nesting,
  invalid JSON for ``string="false"``, unknown tool name when tools are given, empty block)
  goes to content verbatim and sets ``leaked``.
- Text outside blocks is content. Content containing a DSML marker (``LEAK_MARKERS``, e.g. a
  stray ``</｜DSML｜invoke>``) also sets ``leaked``.

The block grammar and its parser live in ``engine.dsml_grammar``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from engine.text import tokenizer as T
from engine.text.chat import ToolCall, ToolSpec
from engine.text.dsml_grammar import (
    LEAK_MARKERS,
    PARAM_NAME_PATTERN,
    TOOL_NAME_PATTERN,
    BlockParser,
    Incomplete,
    Malformed,
    has_marker,
    partial_suffix,
)

__all__ = ["LEAK_MARKERS", "PARAM_NAME_PATTERN", "TOOL_NAME_PATTERN", "ContentDelta",
           "ParseResult", "StreamingDSMLDetector", "ToolCallDelta", "arguments_json",
           "parse_tool_calls", "tool_call_id"]
_MARKER_TAIL = max(len(m) for m in LEAK_MARKERS) - 1


@dataclass(frozen=True)
class ParseResult:
    """Outcome of parsing one complete model output.

    ``content`` is every character of the text not consumed by a well-formed block, in order;
    ``leaked`` is True iff some block was malformed or ``content`` contains a DSML marker.
    """

    content: str
    calls: tuple[ToolCall, ...]
    leaked: bool

    def call_ids(self) -> tuple[str, ...]:
        """Ids of ``calls``, identical to those the streaming detector assigns."""
        return tuple(tool_call_id(i, c) for i, c in enumerate(self.calls))


@dataclass(frozen=True)
class ContentDelta:
    """A piece of normal (non-tool-call) text."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of tool call ``index``.

    The first delta of a call carries ``id`` and ``name`` with empty ``arguments``; later ones
    carry only argument fragments, whose concatenation equals ``json.dumps(arguments)``.
    """

    index: int
    id: str | None
    name: str | None
    arguments: str


StreamEvent = ContentDelta | ToolCallDelta


class ContentLog:
    """A stream's emitted content and whether it holds a DSML marker, checked per append over the
    new text plus the tail of the old (so a marker split across deltas is caught)."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._tail = ""
        self.leaked = False

    def append(self, text: str) -> bool:
        """Adds ``text``; True when the content now holds a marker."""
        window = self._tail + text
        self.leaked |= has_marker(window)
        self._tail = window[-_MARKER_TAIL:]
        self._parts.append(text)
        return self.leaked

    def text(self) -> str:
        return "".join(self._parts)


def arguments_json(arguments: dict) -> str:
    """The canonical JSON text of a call's arguments (what OpenAI clients receive)."""
    return json.dumps(arguments)


class LoggedStream:
    """``leaked`` and ``result()`` of a streaming parser variant that keeps its emitted content
    in ``self._log`` (a ``ContentLog``) and its calls in ``self.calls``."""

    _log: ContentLog
    calls: tuple[ToolCall, ...]

    @property
    def leaked(self) -> bool:
        return self._log.leaked

    def result(self) -> ParseResult:
        return ParseResult(self._log.text(), self.calls, self.leaked)


def tool_call_id(index: int, call: ToolCall) -> str:
    """Deterministic id: ``call_<index>_<first 8 hex of sha1(name + arguments_json)>``."""
    digest = hashlib.sha1((call.name + arguments_json(call.arguments)).encode()).hexdigest()
    return f"call_{index}_{digest[:8]}"


def parse_tool_calls(text: str, tools: list[ToolSpec] | None = None) -> ParseResult:
    """Splits ``text`` into content and tool calls (see module docstring for the rules).

    ``tools=None`` accepts any tool name; a list (even empty) accepts only the names in it.
    """
    content: list[str] = []
    calls: list[ToolCall] = []
    bad = False
    pos = 0
    while (start := text.find(T.FC_OPEN, pos)) >= 0:
        content.append(text[pos:start])
        close = text.find(T.FC_CLOSE, start + len(T.FC_OPEN))
        pos = len(text) if close < 0 else close + len(T.FC_CLOSE)
        try:
            calls += BlockParser(text[start:pos], tools).parse()
        except (Malformed, Incomplete):
            content.append(text[start:pos])
            bad = True
    content.append(text[pos:])
    joined = "".join(content)
    return ParseResult(joined, tuple(calls), bad or has_marker(joined))


class StreamingDSMLDetector:
    """Incremental DSML parser: ``feed`` deltas, then call ``finish`` once.

    Text that might start a block is held back; a block's calls are emitted when its
    ``FC_CLOSE`` arrives. A block is passed through as content as soon as it is known to be
    malformed (or at ``finish`` when unclosed). Invariant: for any split of a text, the
    concatenated ``ContentDelta`` texts, the calls and ``leaked`` equal ``parse_tool_calls``.
    """

    def __init__(self, tools: list[ToolSpec] | None = None) -> None:
        self._tools = tools
        self._buf = ""  # held text: a possible FC_OPEN prefix, or the open block's text
        self._in_block = False
        self._bad = False  # the open block is malformed; its text is passing through
        self._log = ContentLog()
        self._calls: list[ToolCall] = []
        self._finished = False
        self.leaked = False

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self._calls)

    @property
    def content(self) -> str:
        return self._log.text()

    def result(self) -> ParseResult:
        """Everything emitted so far, as a ``ParseResult`` (complete after ``finish``)."""
        return ParseResult(self.content, self.calls, self.leaked)

    def feed(self, delta: str) -> list[StreamEvent]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        out: list[StreamEvent] = []
        self._buf += delta
        while self._step_block(out) if self._in_block else self._step_outside(out):
            pass
        return out

    def finish(self) -> list[StreamEvent]:
        """Flushes held text; an unclosed block is emitted as content with ``leaked=True``."""
        out: list[StreamEvent] = []
        if not self._finished:
            self._finished = True
            self.leaked |= self._in_block
            self._emit_content(self._buf, out)
            self._buf, self._in_block = "", False
        return out

    def _step_outside(self, out: list[StreamEvent]) -> bool:
        start = self._buf.find(T.FC_OPEN)
        if start < 0:
            self._emit_all_but(partial_suffix(self._buf, T.FC_OPEN), out)
            return False
        self._emit_content(self._buf[:start], out)
        self._buf = self._buf[start:]
        self._in_block, self._bad = True, False
        return True

    def _step_block(self, out: list[StreamEvent]) -> bool:
        close = self._buf.find(T.FC_CLOSE, 0 if self._bad else len(T.FC_OPEN))
        if close >= 0:
            end = close + len(T.FC_CLOSE)
            block, self._buf = self._buf[:end], self._buf[end:]
            self._in_block = False
            self._close_block(block, out)
            return True
        if not self._bad and _is_malformed_prefix(self._buf, self._tools):
            self._bad = self.leaked = True
        if self._bad:
            self._emit_all_but(partial_suffix(self._buf, T.FC_CLOSE), out)
        return False

    def _close_block(self, block: str, out: list[StreamEvent]) -> None:
        if self._bad:
            self._emit_content(block, out)
            return
        try:
            calls = BlockParser(block, self._tools).parse()
        except (Malformed, Incomplete):
            self.leaked = True
            self._emit_content(block, out)
            return
        for call in calls:
            self._emit_call(call, out)

    def _emit_call(self, call: ToolCall, out: list[StreamEvent]) -> None:
        index = len(self._calls)
        self._calls.append(call)
        out.append(ToolCallDelta(index, tool_call_id(index, call), call.name, ""))
        out += [ToolCallDelta(index, None, None, f) for f in _argument_fragments(call.arguments)]

    def _emit_all_but(self, keep: int, out: list[StreamEvent]) -> None:
        cut = len(self._buf) - keep
        self._emit_content(self._buf[:cut], out)
        self._buf = self._buf[cut:]

    def _emit_content(self, text: str, out: list[StreamEvent]) -> None:
        if not text:
            return
        self.leaked |= self._log.append(text)
        out.append(ContentDelta(text))


def _argument_fragments(arguments: dict) -> list[str]:
    """One fragment per parameter; ``"".join`` of the result equals ``arguments_json``."""
    if not arguments:
        return [arguments_json(arguments)]
    parts = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in arguments.items()]
    frags = ["{" + parts[0]] + [", " + p for p in parts[1:]]
    frags[-1] += "}"
    return frags


def _is_malformed_prefix(text: str, tools: list[ToolSpec] | None) -> bool:
    try:
        BlockParser(text, tools).parse()
    except Malformed:
        return True
    except Incomplete:
        pass
    return False
