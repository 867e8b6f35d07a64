"""Tool-call parser variant ``sglang``: the observable behaviour of SGLang 0.5.21-0.5.23's
``DeepSeekV32Detector`` behind its ``FunctionCallParser`` (fail-closed), reimplemented here and
checked differentially against the real code (``tests/test_parser_fidelity.py``).

Its rules, as measured (they differ from ``strict`` on purpose):

- No tools declared: nothing is parsed; the whole text is content.
- One-shot: content is the prose before the first ``FC_OPEN`` (or before the first DSML tag when
  only bare invokes are present), minus one trailing blank line; text between and after blocks
  is dropped. Every closed ``function_calls`` block (or, without any opener, the text from the
  first bare invoke on) is scanned for invokes; unclosed or malformed invokes and unknown tool
  names are dropped silently. Text with no opener and no invoke is returned whole, stray DSML
  closers included (SGLang's remaining leak).
- Parameters: ``string="true"`` values are stripped strings; other values are JSON (NaN and
  infinities refused) or else the stripped string; the last duplicate wins; a body that is one
  JSON object is taken as the arguments; DSML left outside the parameter tags, or prose with no
  parameter tag, makes the invoke malformed.
- Streaming: prose is released while no DSML marker or tag prefix is buffered; a complete invoke
  anywhere in the buffer becomes one whole call (unknown names included); the prose before the
  first complete invoke is released once; after that, buffered text is never released. So the
  streamed result can differ from the one-shot one, and between chunkings, exactly as SGLang's.
"""

from __future__ import annotations

import json
import re

from engine.text import tokenizer as T
from engine.text.chat import ToolCall, ToolSpec
from engine.text.dsml import (
    ContentDelta,
    ContentLog,
    LoggedStream,
    ParseResult,
    StreamEvent,
    ToolCallDelta,
    tool_call_id,
)
from engine.text.dsml_grammar import has_marker

DSML = "｜DSML｜"
_INVOKE = re.compile(rf'<{DSML}invoke\s+name="(?P<name>[^"]+)"\s*'
                     rf"(?:(?P<self_close>/>)|>(?P<body>.*?)(?P<end></{DSML}invoke>|$))",
                     re.DOTALL)
_PARAM = re.compile(rf'<{DSML}parameter\s+name="([^"]+)"\s+string="([^"]+)"\s*>(.*?)'
                    rf"</{DSML}parameter>", re.DOTALL)
_BLOCK = re.compile(rf"{re.escape(T.FC_OPEN)}(.*?){re.escape(T.FC_CLOSE)}", re.DOTALL)
INVOKE_START = f"<{DSML}invoke"
_HOLD_MARKERS = (DSML, f"<{DSML[0]}", f"</{DSML[0]}")
_HOLD_SUFFIXES = ("<", f"<{DSML[0]}", "</", f"</{DSML[0]}")


class MalformedInvoke(ValueError):
    """An invoke whose body does not parse; SGLang drops it."""


def _no_constants(name: str):
    raise ValueError(f"JSON constant {name} is not allowed")


def invoke_arguments(body: str) -> dict:
    """The arguments of an invoke body (raises ``MalformedInvoke``)."""
    text = body.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text, parse_constant=_no_constants)
        except ValueError as exc:
            raise MalformedInvoke(str(exc)) from None
        if not isinstance(obj, dict):
            raise MalformedInvoke("arguments must be a JSON object")
        return obj
    args, leftover, last = {}, [], 0
    for m in _PARAM.finditer(body):
        leftover.append(body[last:m.start()])
        last = m.end()
        value = m.group(3).strip()
        if m.group(2) == "true":
            args[m.group(1)] = value
        else:
            try:
                args[m.group(1)] = json.loads(value, parse_constant=_no_constants)
            except ValueError:
                args[m.group(1)] = value
    rest = "".join(leftover) + body[last:]
    if DSML in rest or (last == 0 and rest.strip()):
        raise MalformedInvoke("text outside the parameter tags")
    return args


def _complete(m: re.Match) -> tuple[str, str, bool]:
    """(name, body, closed) of an invoke match; a self-closing invoke is closed and empty."""
    if m.group("self_close"):
        return m.group("name").strip(), "", True
    return m.group("name").strip(), m.group("body"), bool(m.group("end"))


def text_before_dsml(text: str) -> str:
    """Prose before the first DSML tag (its ``<`` or ``</`` too), minus one blank line."""
    i = text.find(DSML)
    if i < 0:
        return text
    i -= 2 if text[max(0, i - 2):i] == "</" else 1 if text[i - 1:i] == "<" else 0
    return text[:i].removesuffix("\n\n")


def _has_call_markup(text: str) -> bool:
    return T.FC_OPEN in text or INVOKE_START in text


def parse_sglang(text: str, tools: list[ToolSpec] | None) -> ParseResult:
    """One-shot parse as SGLang's ``FunctionCallParser.parse_non_stream``."""
    if not tools:
        return ParseResult(text, (), has_marker(text))
    names = {t.name for t in tools}
    if (i := text.find(T.FC_OPEN)) >= 0:
        content, sections = text[:i].removesuffix("\n\n"), _BLOCK.findall(text)
    elif (i := text.find(INVOKE_START)) >= 0:
        content, sections = text_before_dsml(text), [text[i:]]
    else:
        return ParseResult(text, (), has_marker(text))
    calls: list[ToolCall] = []
    try:
        for section in sections:
            for m in _INVOKE.finditer(section):
                name, body, closed = _complete(m)
                if not closed:
                    continue
                try:
                    args = invoke_arguments(body)
                except MalformedInvoke:
                    continue
                if name in names:
                    calls.append(ToolCall(name, args))
    except RecursionError:  # SGLang fails closed: the prose and the calls so far
        pass
    return ParseResult(content, tuple(calls), has_marker(content))


class SGLangStreamParser(LoggedStream):
    """Streaming parse as SGLang's ``parse_streaming_increment`` + ``finish``."""

    def __init__(self, tools: list[ToolSpec] | None) -> None:
        self._parse = bool(tools)
        self._buf = ""
        self._started = False  # a complete invoke was seen (SGLang's current_tool_id != -1)
        self._calls: list[ToolCall] = []
        self._log = ContentLog()

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self._calls)

    def feed(self, delta: str) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if not self._parse:
            self._text(delta, out)
            return out
        self._buf += delta
        buf = self._buf
        if not (_has_call_markup(buf) or any(m in buf for m in _HOLD_MARKERS)
                or buf.rstrip().endswith(_HOLD_SUFFIXES)):
            prose = buf.rstrip()
            self._buf = buf[len(prose):]
            self._text(prose.replace(T.FC_CLOSE, "").replace(f"</{DSML}invoke>", ""), out)
            return out
        try:
            self._scan(out)
        except RecursionError:  # SGLang fails closed: drops the buffer, keeps the prose
            if not self._started:
                self._text(text_before_dsml(self._buf), out)
            self._buf = ""
        return out

    def _scan(self, out: list[StreamEvent]) -> None:
        while (m := _INVOKE.search(self._buf)) is not None:
            name, body, closed = _complete(m)
            if not closed:
                return
            if not self._started:
                self._started = True
                start = self._buf.rfind(T.FC_OPEN, 0, m.start())
                self._text(self._buf[:m.start() if start < 0 else start].removesuffix("\n\n"),
                           out)
            self._buf = self._buf[m.end():]
            try:
                args = invoke_arguments(body)
            except MalformedInvoke:
                continue
            self._call(ToolCall(name, args), out)

    def finish(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        buffered, self._buf = self._buf, ""
        if buffered and not self._started:
            self._text(text_before_dsml(buffered), out)
        return out

    def _text(self, text: str, out: list[StreamEvent]) -> None:
        if text:
            self._log.append(text)
            out.append(ContentDelta(text))

    def _call(self, call: ToolCall, out: list[StreamEvent]) -> None:
        index = len(self._calls)
        self._calls.append(call)
        out.append(ToolCallDelta(index, tool_call_id(index, call), call.name, ""))
        out.append(ToolCallDelta(index, None, None, json.dumps(call.arguments,
                                                               ensure_ascii=False)))
