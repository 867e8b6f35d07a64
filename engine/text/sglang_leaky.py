"""Tool-call parser variant ``sglang-leaky``: the observable behaviour of SGLang 0.5.15's
``DeepSeekV32Detector`` behind its ``FunctionCallParser`` and chat serving, the last release
where unparsable DSML reaches ``content``; reimplemented here and checked differentially against
the real code (``tests/test_parser_fidelity.py``).

Its rules, as measured (0.5.6-0.5.15 share the one-shot rule that leaks):

- No tools declared: nothing is parsed; the whole text is content.
- One-shot: only the first closed ``function_calls`` block is read; every invoke in it, closed or
  not, is a candidate. Parameters: ``string="true"`` values are stripped strings, others are
  JSON (NaN allowed) or else the stripped string; the last duplicate wins; text outside the
  parameter tags is ignored; a body that starts with ``{`` and ends with ``}`` is taken as JSON
  arguments. Unknown tool names are dropped. **When no call survives, or a JSON body does not
  parse, the whole text is the content**: raw DSML reaches the user. Otherwise the content is
  the prose before the opener minus one blank line; text after the block is dropped.
- Streaming: prose is released while no DSML marker or tag prefix is in the buffer. Each invoke
  (bare ones too) is streamed as it grows: its name first (unknown names included), then the
  argument JSON, only ever the stable prefix shared by successive partial parses (partial JSON
  values through ``partial_json_parser``, as SGLang does), then the rest when the invoke closes.
  An error inside an increment (a partial value ``partial_json_parser`` rejects) releases the
  whole buffer as content, again on every later increment. Prose before the first invoke, text
  between invokes and anything after the last is never released once markup is buffered. At
  the end of the stream the serving layer appends ``json.dumps`` of the last call's argument
  *string* minus what was streamed, when that streamed part occurs in it (so ``{}`` becomes
  ``{}""``).
"""

from __future__ import annotations

import json
import re
from json.decoder import WHITESPACE

import partial_json_parser
from partial_json_parser.core.options import Allow

from engine.text import tokenizer as T
from engine.text.chat import ToolCall, ToolSpec
from engine.text.dsml import (
    ContentDelta,
    ContentLog,
    LoggedStream,
    ParseResult,
    StreamEvent,
    ToolCallDelta,
)
from engine.text.dsml_grammar import has_marker
from engine.text.sglang_dsml import _BLOCK, _INVOKE, _PARAM, DSML, INVOKE_START, _complete

_PARTIAL_PARAM = re.compile(rf'<{DSML}parameter\s+name="([^"]+)"\s+string="([^"]+)"\s*>(.*)$',
                            re.DOTALL)
_INVOKE_END_PIECES = ("oke", "inv", DSML, "</")  # stripped as character sets, in this order
_PARAM_END_PIECES = ("parameter", DSML, "</")
_MARKERS = (DSML, f"<{DSML[0]}", f"</{DSML[0]}")
_PREFIXES = ("<", f"<{DSML[0]}", "</", f"</{DSML[0]}")


def _partial_loads(raw: str):
    """A partial JSON value, as SGLang's ``_partial_json_loads``: the ``partial_json_parser``
    result, or the first complete value when only trailing data is in the way."""
    try:
        return partial_json_parser.loads(raw, Allow.ALL)
    except (json.JSONDecodeError, IndexError) as exc:
        if "Extra data" not in exc.args[0] and "pop from empty list" not in str(exc):
            raise
        return json.JSONDecoder().raw_decode(raw, WHITESPACE.match(raw, 0).end())[0]


def _value(kind: str, raw: str):
    if kind == "true":
        return raw.strip()
    try:
        return json.loads(raw.strip())
    except ValueError:
        return raw.strip()


def arguments_text(body: str, partial: bool = False) -> str:
    """The argument JSON text SGLang 0.5.15 derives from an invoke body (raises on a partial
    value ``partial_json_parser`` rejects, as SGLang does)."""
    stripped = body.strip()
    if stripped.startswith("{"):
        if partial:
            for chars in _INVOKE_END_PIECES:
                stripped = stripped.rstrip(chars)
            return stripped
        if stripped.endswith("}"):
            return stripped
    params, end = {}, 0
    for m in _PARAM.finditer(body):
        params[m.group(1)] = _value(m.group(2), m.group(3))
        end = m.end()
    if partial:
        rest = body[end:]
        for chars in _PARAM_END_PIECES:
            rest = rest.rstrip(chars)
        m = _PARTIAL_PARAM.search(rest)
        if m and m.group(3):
            params[m.group(1)] = _partial_value(m.group(2), m.group(3))
    return json.dumps(params, ensure_ascii=False)


def _partial_value(kind: str, raw: str):
    if kind == "true":
        return raw.strip()
    try:
        return _partial_loads(raw)
    except json.JSONDecodeError:
        return raw.strip()


def parse_sglang_leaky(text: str, tools: list[ToolSpec] | None) -> ParseResult:
    """One-shot parse as SGLang 0.5.15's ``FunctionCallParser.parse_non_stream``."""
    if not tools or T.FC_OPEN not in text or (block := _BLOCK.search(text)) is None:
        return ParseResult(text, (), has_marker(text))
    names = {t.name for t in tools}
    calls: list[ToolCall] = []
    try:
        for m in _INVOKE.finditer(block.group(1)):
            name, body, _ = _complete(m)
            args = json.loads(arguments_text(body))
            if name in names:
                calls.append(ToolCall(name, args or {}))
    except (ValueError, RecursionError):
        return ParseResult(text, (), has_marker(text))
    if not calls:
        return ParseResult(text, (), has_marker(text))
    content = text[:text.find(T.FC_OPEN)].removesuffix("\n\n")
    return ParseResult(content, tuple(calls), has_marker(content))


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]


class SGLangLeakyStreamParser(LoggedStream):
    """Streaming parse as SGLang 0.5.15's ``parse_stream_chunk`` per delta, plus the chat
    serving's end-of-stream ``_check_for_unstreamed_tool_args``."""

    def __init__(self, tools: list[ToolSpec] | None) -> None:
        self._parse = bool(tools)
        self._buf = ""
        self._name_sent = False
        self._args: list[str | None] = []  # per call: the last parsed argument text
        self._sent: list[str] = []  # per call: argument text streamed so far
        self._names: list[str] = []
        self._log = ContentLog()

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(n, _loads_or_empty(s)) for n, s in zip(self._names, self._sent,
                                                                       strict=False))

    def feed(self, delta: str) -> list[StreamEvent]:
        if not self._parse:
            return self._text(delta)
        self._buf += delta
        buf = self._buf
        if not (T.FC_OPEN in buf or INVOKE_START in buf or any(m in buf for m in _MARKERS)
                or buf.rstrip().endswith(_PREFIXES)):
            self._buf = ""
            return self._text(buf)
        out: list[StreamEvent] = []
        try:
            self._scan(out)
        except Exception:  # noqa: BLE001 - SGLang releases the buffer on any error
            return self._text(self._buf)
        return out

    def _scan(self, out: list[StreamEvent]) -> None:
        while (m := _INVOKE.search(self._buf)) is not None:
            name, body, closed = _complete(m)
            if not self._name_sent:
                self._start_call(name, out)
            i = len(self._names) - 1
            args = arguments_text(body, partial=not closed)
            sent, prev = self._sent[i], self._args[i]
            diff = ""
            if closed:
                diff = args[len(sent):]
            elif prev is not None and args != prev:
                diff = _common_prefix(args, prev)[len(sent):]
            if diff:
                out.append(ToolCallDelta(i, None, None, diff))
                self._sent[i] += diff
            self._args[i] = args
            if not closed:
                return
            self._buf = self._buf[m.end():]
            self._name_sent = False

    def _start_call(self, name: str, out: list[StreamEvent]) -> None:
        i = len(self._names)
        self._names.append(name)
        self._sent.append("")
        self._args.append(None)
        self._name_sent = True
        out.append(ToolCallDelta(i, f"call_{i}", name, ""))

    def finish(self) -> list[StreamEvent]:
        if not self._args:
            return []
        i = len(self._args) - 1
        last = {} if self._args[i] is None else self._args[i]  # a call whose parse raised
        expected, sent = json.dumps(last, ensure_ascii=False), self._sent[i]
        rest = expected.replace(sent, "", 1) if sent in expected else ""
        if not rest:
            return []
        self._sent[i] += rest
        return [ToolCallDelta(i, None, None, rest)]

    def _text(self, text: str) -> list[StreamEvent]:
        if not text:
            return []
        self._log.append(text)
        return [ContentDelta(text)]


def _loads_or_empty(text: str) -> dict:
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
