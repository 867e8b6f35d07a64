"""Tool-call parser variant ``vllm``: the observable behaviour of vLLM 0.32's DeepSeek-V3.2 parser
(``--tool-call-parser deepseek_v32``, ``DeepSeekV32EngineToolParser``) as its OpenAI chat serving
drives it, reimplemented here and checked differentially against the real code
(``tests/support/vllm_parser_run.py``). The front half (token ids, scanner, lexer, states) and
how we model the token ids vLLM sees with each delta are in ``engine.text.vllm_dsml_lexer``.

Its rules, as measured (they differ from ``strict`` and ``sglang`` on purpose):

- Terminals are literals found anywhere: the opener/closer, ``<｜DSML｜invoke name="``, ``">``,
  ``</｜DSML｜invoke>``, ``<｜DSML｜parameter``, ``</｜DSML｜parameter>``; the tokenizer's special
  strings (BOS, EOS, pad and ``?``, its unk) are deleted wherever they appear, content included.
- Content is the text before the first opener or bare ``invoke`` opener; everything after it is
  dropped (text between and after blocks too), and it never returns to content. Stray closers,
  ``<｜DSML｜tool_calls>`` (the V4 opener), ASCII bars and the like are plain content. When calls
  were started, a whitespace-only content is dropped.
- Every ``invoke`` opener starts a call; the name is all text up to the next ``">`` (markup
  included, so a self-closing or ``" >`` invoke swallows what follows), stripped one-shot, as-is
  streamed. Unknown names are accepted; an empty name makes no call (unless the call's text has
  a JSON ``"name"``). A call ends at ``</｜DSML｜invoke>``, at the closer, or at the end of the
  text (truncated calls are kept).
- Arguments come only from ``parameter`` tags in the call's text (JSON bodies and other text are
  ignored, so they give ``{}``): a tag ends at its closer or at the next parameter tag (an open
  one counts only while streaming); ``string="true"`` values are raw and unstripped, others are
  ``json.loads`` (NaN and infinities allowed) or else the raw text; the last duplicate wins.
  Values are then coerced to the tool's schema types (non-strings become strings for a
  ``string`` parameter, NaN and infinities strings for a number or integer; a type list or
  union tries ``null``, integer, number, boolean, object, array, string in turn), objects and
  arrays in place through their node's own ``properties``/``items`` (a ``$ref`` is not
  followed: ``engine.text.tool_schema``); a lone ``arguments``/``input`` wrapper parameter is
  unwrapped. A string-only parameter's value (``string``, a string ``enum``, a bare ``$ref``)
  streams open.
- Streaming: arguments are re-derived when a piece of call text containing ``>`` arrives and
  the stable JSON prefix is sent (a string value of a string parameter streams open); at the
  end of the call the rest is sent only if the final JSON extends what was sent. So a call whose
  final arguments disagree with an earlier prefix (duplicates, a truncated or unclosed value,
  ``<｜DSML｜parameter`` without its closer) streams an unclosed JSON prefix, and the result can
  depend on the chunking. Whitespace-only content is held until non-space content arrives, so it
  can come out after later content.
- No tools: the same parse, calls discarded (vLLM's ``tool_choice: "none"`` default), except
  that streamed call deltas made by the end-of-stream flush still go out, as vLLM's do.
"""

from __future__ import annotations

import json

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
from engine.text.tool_schema import Schema
from engine.text.vllm_dsml_lexer import Event, Frontend, Machine, safe_prefix
from engine.text.vllm_dsml_values import (
    NAME_KEY,
    Delta,
    coerce_object,
    dsml_arguments,
    loads_value,
    name_and_args,
)


class _Slot:
    def __init__(self) -> None:
        self.name, self.args, self.sent = "", "", ""  # sent: argument JSON streamed so far
        self.named = False
        self.string_keys: set[str] | None = None


class _Core:
    """vLLM's event-to-delta bookkeeping: call slots, argument streaming, held content."""

    def __init__(self, tools: list[ToolSpec] | None) -> None:
        self.schemas: dict[str, tuple[tuple[str, Schema], ...]] = {}
        for t in tools or []:  # the first tool of a name wins, as in vLLM's lookup
            self.schemas.setdefault(t.name, t.params)
        self.has_tools = bool(tools)
        self.slots: list[_Slot] = []
        self.held, self.spoke = "", False  # held whitespace content; non-space content seen

    def batch(self, events: list[Event], finished: bool) -> tuple[str, list[Delta]]:
        """One delta's events -> (content, call deltas)."""
        if not events and not self.held:
            return "", []
        deltas: list[Delta] = []
        parts: list[str] = []
        carried, seen = self.held, False
        for kind, value, idx in events:
            if kind == "TEXT":  # text after a call event waits for a batch without one
                if seen:
                    self.held += value
                else:
                    parts.append(value)
                continue
            seen = True
            if kind == "START":
                self.slots += [_Slot() for _ in range(idx + 1 - len(self.slots))]
            elif kind == "NAME":
                self.slots[idx].name += value
            elif kind == "ARG":
                self._arg(idx, value, deltas)
            elif idx < len(self.slots):
                self._end(idx, deltas)
        if self.held and (not seen or not deltas):
            parts = [carried, *parts, self.held[len(carried):]]
            self.held = ""
        return self._content("".join(parts), finished), deltas

    def _content(self, text: str, finished: bool) -> str:
        if self.spoke or not text:
            return text
        if text.strip():
            self.spoke = True
        elif self.slots:
            return ""
        elif not finished:
            self.held = text
            return ""
        return text

    def _arg(self, idx: int, value: str, deltas: list[Delta]) -> None:
        slot = self.slots[idx]
        slot.args += value
        if not slot.named:
            self._name(idx, slot.name or (self._name_in_args(idx) if value else None), deltas)
        elif ">" in value and (diff := self._advance(slot, partial=True)):
            deltas.append((idx, None, diff))

    def _name(self, idx: int, name: str | None, deltas: list[Delta], args: str | None = None):
        if name:
            slot = self.slots[idx]
            slot.name, slot.named = name, True
            props = self.schemas.get(name)
            slot.string_keys = {k for k, s in props if s.only_string()} if props else None
            deltas.append((idx, name, args))

    def _end(self, idx: int, deltas: list[Delta]) -> None:
        slot = self.slots[idx]
        rest = self._advance(slot, partial=False)
        if not slot.named and (name := slot.name or self._name_in_args(idx)):
            self._name(idx, name, deltas, rest or "")
        elif rest and slot.named:
            deltas.append((idx, None, rest))

    def _advance(self, slot: _Slot, partial: bool) -> str | None:
        """The next argument fragment: mid-call the stable prefix, at the end the whole JSON
        (neither when it does not extend what was sent)."""
        doc = self.fix(self.convert(slot.args, partial), slot.name)
        doc = safe_prefix(doc, slot.string_keys) if partial else doc
        if len(doc) <= len(slot.sent) or not doc.startswith(slot.sent):
            return None
        diff, slot.sent = doc[len(slot.sent):], doc
        return diff

    def _name_in_args(self, idx: int) -> str | None:
        m = NAME_KEY.search(self.slots[idx].args)
        return m.group(1) if m and m.group(1) else None

    def convert(self, body: str, partial: bool) -> str:
        """``dsml_arguments``, a lone ``arguments``/``input`` wrapper unwrapped (tools only)."""
        doc = dsml_arguments(body, partial)
        owner = next((s.name for s in self.slots if s.args == body), "")
        props = self.schemas.get(owner) if self.has_tools else None
        args, _ = loads_value(doc)
        wrapper = next(iter(args)) if props and len(args) == 1 else ""
        if wrapper not in ("arguments", "input") or wrapper in dict(props):
            return doc
        inner, ok = (args[wrapper], True) if not isinstance(args[wrapper], str) else loads_value(
            args[wrapper])
        ok = ok and isinstance(inner, dict) and set(inner) <= {k for k, _ in props}
        return json.dumps(inner, ensure_ascii=False) if ok else doc

    def fix(self, doc: str, name: str) -> str:
        """Schema coercion of a call's arguments JSON."""
        props = self.schemas.get(name) if self.has_tools and name else None
        args, ok = loads_value(doc) if props else (None, False)
        if not ok or not isinstance(args, dict) or not coerce_object(args, props):
            return doc
        return json.dumps(args, ensure_ascii=False)

    def extracted(self) -> list[tuple[str, str]]:
        """The calls of a one-shot parse: (name, arguments JSON)."""
        calls = []
        for slot in self.slots:
            name = slot.name.strip()
            if not name and slot.args.strip():
                name, doc = name_and_args(slot.args)
            else:
                doc = self.convert(slot.args, False) if slot.args.strip() else "{}"
            if name:
                calls.append((name, self.fix(doc, name)))
        return calls


def _as_call(name: str, doc: str) -> ToolCall:
    args, ok = loads_value(doc)
    return ToolCall(name, args if ok and isinstance(args, dict) else {})


def parse_vllm(text: str, tools: list[ToolSpec] | None) -> ParseResult:
    """One-shot parse as vLLM's non-streamed chat completion."""
    core, machine = _Core(tools), Machine()
    content, _ = core.batch(machine.feed(text, []) + machine.finish(), finished=True)
    calls = core.extracted() if tools else []  # (content is already "" if blank with calls)
    return ParseResult(content, tuple(_as_call(n, a) for n, a in calls), has_marker(content))


class VllmStreamParser(LoggedStream):
    """Streaming parse as vLLM's ``parse_delta`` per delta, then its end-of-stream flush."""

    def __init__(self, tools: list[ToolSpec] | None) -> None:
        self._core, self._front = _Core(tools), Frontend()
        self._emit_calls = bool(tools)
        self._calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]
        self._log = ContentLog()

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(_as_call(n, a) for n, a in self._calls.values())

    def feed(self, delta: str) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for events in self._front.feed(delta) if delta else ():
            self._out(*self._core.batch(events, finished=False), out)
        return out

    def finish(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        *batches, last = self._front.finish()
        for events in batches:
            self._out(*self._core.batch(events, finished=False), out)
        self._emit_calls = True  # vLLM strips calls per delta, not from the end-of-stream flush
        self._out(*self._core.batch(last, finished=True), out)
        return out

    def _out(self, content: str, deltas: list[Delta], out: list[StreamEvent]) -> None:
        if content:
            self._log.append(content)
            out.append(ContentDelta(content))
        for idx, name, args in deltas if self._emit_calls else ():
            if name is not None:
                self._calls[idx] = [name, args or ""]
                out.append(ToolCallDelta(idx, tool_call_id(idx, ToolCall(name)), name,
                                         args or ""))
            elif args:
                self._calls.setdefault(idx, ["", ""])[1] += args
                out.append(ToolCallDelta(idx, None, None, args))
