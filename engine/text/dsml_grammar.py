"""The DSML tool-call block grammar and its recursive-descent parser (shared by batch and
streaming parsing in ``engine.dsml``).

Block grammar (ws = spaces, tabs, newlines)::

    block  := FC_OPEN ws (invoke ws)+ FC_CLOSE
    invoke := INVOKE_OPEN tool_name TAG_END ws (param ws)* INVOKE_CLOSE
    param  := PARAM_OPEN key (STRING_TRUE raw_text | STRING_FALSE json) PARAM_CLOSE

Parameter values may not contain DSML markers; keys are unique within an invoke.
"""

from __future__ import annotations

import json
import re

from engine.text import tokenizer as T
from engine.text.chat import ToolCall, ToolSpec

TOOL_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
PARAM_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}"
LEAK_MARKERS: tuple[str, ...] = ("｜DSML｜", T.STRING_TRUE, T.STRING_FALSE)
_WS = " \t\r\n"


class Incomplete(Exception):
    """The text so far is a proper prefix of some well-formed block."""


class Malformed(Exception):
    """No continuation of the text so far is a well-formed block."""


def has_marker(text: str) -> bool:
    """Whether ``text`` contains any of ``LEAK_MARKERS``."""
    return any(m in text for m in LEAK_MARKERS)


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest proper suffix of ``text`` that is a prefix of ``tag``."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


# (full match, prefix match): every prefix of a valid name, "" included, matches the latter.
_TOOL_NAME = (re.compile(TOOL_NAME_PATTERN), re.compile(f"(?:{TOOL_NAME_PATTERN})?"))
_PARAM_NAME = (re.compile(PARAM_NAME_PATTERN), re.compile(f"(?:{PARAM_NAME_PATTERN})?"))


def _json_value(raw: str):
    def reject(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    try:
        return json.loads(raw, parse_constant=reject)
    except ValueError:
        raise Malformed from None


class BlockParser:
    """Recursive-descent parser of one block; raises ``Incomplete`` or ``Malformed``.

    Monotone: if a text is ``Malformed``, so is every extension of it, which lets the
    streaming detector give up on a block early without changing the final result.
    """

    def __init__(self, text: str, tools: list[ToolSpec] | None) -> None:
        self.s, self.pos = text, 0
        self.known = None if tools is None else {t.name for t in tools}

    def parse(self) -> list[ToolCall]:
        self._expect(T.FC_OPEN)
        calls = []
        tag = self._next_tag(T.INVOKE_OPEN)
        while tag == T.INVOKE_OPEN:
            calls.append(self._invoke())
            tag = self._next_tag(T.INVOKE_OPEN, T.FC_CLOSE)
        if self.pos != len(self.s):
            raise Malformed
        return calls

    def _invoke(self) -> ToolCall:
        name = self._name(_TOOL_NAME)
        if self.known is not None and name not in self.known:
            raise Malformed
        self._expect(T.TAG_END)
        args: dict = {}
        while self._next_tag(T.PARAM_OPEN, T.INVOKE_CLOSE) == T.PARAM_OPEN:
            key = self._name(_PARAM_NAME)
            is_str = self._expect(T.STRING_TRUE, T.STRING_FALSE) == T.STRING_TRUE
            raw = self._value()
            if key in args:
                raise Malformed
            args[key] = raw if is_str else _json_value(raw)
        return ToolCall(name, args)

    def _next_tag(self, *tags: str) -> str:
        while self.pos < len(self.s) and self.s[self.pos] in _WS:
            self.pos += 1
        return self._expect(*tags)

    def _expect(self, *tags: str) -> str:
        rest = self.s[self.pos:]
        for tag in tags:
            if rest.startswith(tag):
                self.pos += len(tag)
                return tag
        raise Incomplete if any(t.startswith(rest) for t in tags) else Malformed

    def _name(self, matchers: tuple[re.Pattern, re.Pattern]) -> str:
        """Reads a name up to (not including) the next quote."""
        full, prefix = matchers
        end = self.s.find('"', self.pos)
        if end < 0:
            raise Incomplete if prefix.fullmatch(self.s, self.pos) else Malformed
        name = self.s[self.pos:end]
        if not full.fullmatch(name):
            raise Malformed
        self.pos = end
        return name

    def _value(self) -> str:
        """Reads a raw value up to and including ``PARAM_CLOSE``."""
        end = self.s.find(T.PARAM_CLOSE, self.pos)
        if end < 0:
            rest = self.s[self.pos:]
            rest = rest[:len(rest) - partial_suffix(rest, T.PARAM_CLOSE)]
            raise Malformed if has_marker(rest) else Incomplete
        raw = self.s[self.pos:end]
        if has_marker(raw):
            raise Malformed
        self.pos = end + len(T.PARAM_CLOSE)
        return raw
