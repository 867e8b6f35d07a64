"""The front half of the ``vllm`` tool-parser variant (``engine.text.vllm_dsml``): what vLLM
0.32's parser engine makes of a text stream before any tool-call bookkeeping.

Token ids: vLLM pairs each streamed delta with its token ids and, once ids flow, honours the
``function_calls`` opener/closer and its dropped specials (BOS, EOS, pad, ``?``) only when they
come as ids. We model a server of our model: ``token_starts`` tokenizes the text with our
tokenizer (special strings first, then one token per known character; unknown characters get
no id -- they would decode as ``?``) and each token's id arrives with the delta holding its first
character. So an opener split across deltas holds back the text since the previous id until it
completes (``Scanner``), and unknown characters ending a delta that carries an opener, closer or
``?`` can be lost, as in vLLM. ``Lexer`` finds literal terminals, holding a partial one back;
``Machine`` runs the states (content, preamble, name, arguments, between calls) to ``Event``
tuples ``(kind, value, index)``; ``Frontend`` gives one batch of events per delta;
``safe_prefix`` is the part of partial arguments JSON vLLM considers stable.
"""

from __future__ import annotations

import re

from engine.text import tokenizer as T

DSML = "｜DSML｜"
INVOKE_PREFIX = f'<{DSML}invoke name="'
NAME_END = '">'
PARAM_START = f"<{DSML}parameter"
DROP = "DROP"
LITERALS: dict[str, str] = {
    T.FC_OPEN: "TOOL_START", T.FC_CLOSE: "TOOL_END", INVOKE_PREFIX: "INVOKE_PREFIX",
    NAME_END: "NAME_END", T.INVOKE_CLOSE: "INVOKE_END", PARAM_START: "PARAM_START",
    T.PARAM_CLOSE: "PARAM_CLOSE",
    # the tokenizer's special tokens (bos, eos, unk "?", pad): vLLM drops them from the text
    T.BOS: DROP, T.EOS: DROP, T.PAD: DROP, T.UNK_CHAR: DROP}
ID_TERMINALS = {T.FC_OPEN: "TOOL_START", T.FC_CLOSE: "TOOL_END", T.BOS: DROP, T.EOS: DROP,
                T.PAD: DROP, T.UNK_CHAR: DROP}
STRICT = frozenset(ID_TERMINALS.values())  # once ids flow, these count only when they come as ids
FIRST = frozenset(lit[0] for lit in LITERALS)
PREFIXES = frozenset(lit[:k] for lit in LITERALS for k in range(1, len(lit)))
KNOWN = frozenset(T.CHARS)
LONGEST = max(len(s) for s in T.SPECIAL_TOKENS)
_FIRST_RE = re.compile("[" + re.escape("".join(sorted(FIRST))) + "]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
Token = tuple[str, str | None]  # (text, terminal kind or None)
Event = tuple[str, str, int]  # (kind, value, tool index)
Action = tuple[str | None, str]  # (terminal or None for text, value)


def token_starts(text: str, start: int, final: bool) -> tuple[list[tuple[int, Token]], int]:
    """Tokens of ``text`` from ``start`` as ``(offset, token)``, up to the first one whose extent
    is not known yet (unless ``final``); also the offset where tokenizing stopped."""
    out: list[tuple[int, Token]] = []
    i, n = start, len(text)
    while i < n:
        if text[i] in '<"':
            tok = next((s for s in T.SPECIAL_TOKENS if text.startswith(s, i)), None)
            if tok is not None:
                out.append((i, (tok, ID_TERMINALS.get(tok))))
                i += len(tok)
                continue
            if not final and n - i < LONGEST and any(s.startswith(text[i:])
                                                      for s in T.SPECIAL_TOKENS):
                break
        if text[i] in KNOWN:
            out.append((i, (text[i], ID_TERMINALS.get(text[i]))))
        i += 1
    return out, i


class Scanner:
    """vLLM's split of a delta into text chunks and id-borne terminals ``("T", kind, text)``;
    text chunks are ``("C", text, n_tokens)`` (only an empty one with tokens has an effect)."""

    def __init__(self) -> None:
        self.deferred: list[tuple] = []
        self.post = ""  # text held until a deferred terminal's text shows up
        self.trail = 0  # tokens after the last deferred terminal

    def scan(self, delta: str, tokens: list[Token]) -> list[tuple]:
        prefix, text, trail = self._resolve(delta) if self.deferred else ([], delta, 0)
        if not any(kind for _, kind in tokens):
            return prefix + [("C", text, trail + len(tokens))] if text else prefix
        items: list[tuple] = [("C", "", trail)] if trail else []
        for tok, kind in tokens:
            if kind:
                items.append(("T", kind, tok))
            elif items and items[-1][0] == "C" and items[-1][1]:
                items[-1] = ("C", items[-1][1] + tok, items[-1][2] + 1)
            else:
                items.append(("C", tok, 1))
        if not text:
            last = max(i for i, it in enumerate(items) if it[0] == "T")
            self.deferred += [it for it in items if it[0] == "T"]
            self.trail += sum(it[2] for it in items[last:] if it[0] == "C")
            return prefix
        return prefix + self._recover(text, items)

    def _recover(self, text: str, items: list[tuple]) -> list[tuple]:
        joined = "".join(it[1] if it[0] == "C" else it[2] for it in items)
        pos = text.find(joined)
        if pos > 0:
            return [("C", text[:pos], 0), *items]
        return items if pos == 0 else self._rebuild(text, items)

    def _rebuild(self, text: str, items: list[tuple]) -> list[tuple]:
        anchors = [it for it in items if it[0] == "T"]
        where, end = [-1] * len(anchors), len(text)
        for i in range(len(anchors) - 1, -1, -1):
            if (p := text.rfind(anchors[i][2], 0, end)) >= 0:
                where[i] = end = p
        out: list[tuple] = []
        done = 0
        for i, anchor in enumerate(anchors):
            if where[i] >= done:
                out += [("C", text[done:where[i]], 0)] if where[i] > done else []
                out.append(anchor)
                done = where[i] + len(anchor[2])
                continue
            if max(where[i + 1:], default=-1) < 0 and done < len(text) and anchor[1] != DROP:
                self.post += text[done:]
                done = len(text)
            self.deferred.append(anchor)
        return out + ([("C", text[done:], 0)] if done < len(text) else [])

    def _resolve(self, delta: str) -> tuple[list[tuple], str, int]:
        waiting, self.deferred = self.deferred, []
        trail, self.trail = self.trail, 0
        rest, self.post = self.post + delta, ""
        out: list[tuple] = []
        for term in waiting:
            pos = rest.find(term[2])
            if pos < 0:
                self.post += rest
                rest = ""
                self.deferred.append(term)
                continue
            out += [("C", rest[:pos], 0), term] if pos > 0 else [term]
            rest = rest[pos + len(term[2]):]
        if self.deferred:
            self.trail, trail = trail, 0
        return out, rest, trail

    def flush(self) -> list[tuple]:
        if not self.deferred and not self.post:
            return []
        out = [("C", self.post, 0)] if self.post else []
        out += self.deferred + ([("C", "", self.trail)] if self.trail else [])
        self.deferred, self.post, self.trail = [], "", 0
        return out


class Lexer:
    """Splits text into literal terminals and text, holding a partial terminal at the end."""

    def __init__(self) -> None:
        self.buf = ""

    def feed(self, text: str) -> list[Action]:
        if not self.buf and FIRST.isdisjoint(text):
            return [(None, text)]
        self.buf += text
        return self._drain(final=False)

    def flush(self) -> list[Action]:
        out = self._drain(final=True)
        if self.buf:
            out.append((None, self.buf))
            self.buf = ""
        return out

    def _drain(self, final: bool) -> list[Action]:
        out: list[Action] = []
        while self.buf:
            if not final and self.buf in PREFIXES:
                break
            lit = next((s for s in LITERALS if self.buf.startswith(s)), None)
            cut = len(lit) if lit else _content_end(self.buf)
            out.append((LITERALS[lit] if lit else None, self.buf[:cut]))
            self.buf = self.buf[cut:]
        return out


def _content_end(buf: str) -> int:
    """Where the text at the head of ``buf`` ends: the next (possibly partial) literal."""
    n = len(buf)
    m = _FIRST_RE.search(buf, 1)
    while m:
        i = m.start()
        if any(buf[i:i + len(s)] == s[:n - i] for s in LITERALS):
            return i
        m = _FIRST_RE.search(buf, i + 1)
    return n


def safe_prefix(doc: str, string_keys: set[str] | None) -> str:
    """The part of a partial arguments JSON that later text cannot change: up to the last
    top-level value, into it when it is an open string of a string parameter."""
    colon, key, last, quote, depth, esc, in_str = -1, None, None, -1, 0, False, False
    for i, c in enumerate(doc):
        if esc or (in_str and c == "\\"):
            esc = not esc
        elif in_str:
            if c == '"':
                in_str, last = False, doc[quote + 1:i] if depth == 1 else last
        elif c == '"':
            in_str, quote = True, i
        elif c in "{[}]":
            depth += 1 if c in "{[" else -1
        elif c == ":" and depth == 1:
            colon, key, last = i, last, None
    if colon < 0:
        return ""
    end = colon + 1
    while end < len(doc) and doc[end] in " \t\n\r":
        end += 1
    if end >= len(doc) or doc[end] != '"' or (string_keys is not None and key not in string_keys):
        return doc[:end]
    m = _STRING.match(doc, end)
    return doc[:m.end() - 1] if m else doc


# (state, terminal) -> (next state, event); states: C(ontent), P(reamble), N(ame), A(rgs), B(etween)
MOVES: dict[tuple[str, str], tuple[str, str | None]] = {
    ("C", "TOOL_START"): ("P", None), ("P", "INVOKE_PREFIX"): ("N", "START"),
    ("C", "INVOKE_PREFIX"): ("N", "START"), ("N", "NAME_END"): ("A", None),
    ("A", "INVOKE_END"): ("B", "END"), ("A", "TOOL_END"): ("B", "END"),
    ("B", "INVOKE_PREFIX"): ("N", "START"), ("B", "TOOL_END"): ("B", None),
    ("B", "TOOL_START"): ("P", None)}
TEXT_EVENTS = {"C": "TEXT", "N": "NAME", "A": "ARG"}


class Machine:
    """Scanner + lexer + state machine: ``feed(delta, tokens)`` and ``finish()`` give events."""

    def __init__(self) -> None:
        self.state, self.index, self.had_ids = "C", -1, False
        self.scanner, self.lexer = Scanner(), Lexer()

    def feed(self, delta: str, tokens: list[Token]) -> list[Event]:
        self.had_ids |= bool(tokens)
        items = self.scanner.scan(delta, tokens)
        if len(items) == 1 and items[0][0] == "C":
            lexed = self.lexer.feed(items[0][1])
            if len(lexed) == 1 and lexed[0][0] is None:
                return self._text(lexed[0][1])
            return self._lexed(lexed)
        return self._items(items)

    def finish(self) -> list[Event]:
        events = self._items(self.scanner.flush()) + self._lexed(self.lexer.flush())
        if self.state != "C" and self.index >= 0:
            events.append(("END", "", self.index))
        self.state = "C"
        return events

    def _items(self, items: list[tuple]) -> list[Event]:
        events: list[Event] = []
        for item in items:
            if item[0] == "T":
                events += self._lexed(self.lexer.flush()) + self._terminal(item[1], item[2])
            elif not item[1] and item[2]:
                events += self._text("")
            else:
                events += self._lexed(self.lexer.feed(item[1]))
        return events

    def _lexed(self, lexed: list[Action]) -> list[Event]:
        events: list[Event] = []
        for name, value in lexed:
            if name is None or (self.had_ids and name in STRICT):
                events += self._text(value) if value else []
            else:
                events += self._terminal(name, value)
        return events

    def _terminal(self, name: str, value: str) -> list[Event]:
        move = MOVES.get((self.state, name))
        if move is None:
            return [] if name == DROP else self._text(value)
        self.state, event = move
        if event == "START":
            self.index += 1
        return [(event, value, self.index)] if event else []

    def _text(self, value: str) -> list[Event]:
        kind = TEXT_EVENTS.get(self.state)
        return [(kind, value, self.index)] if kind else []


class Frontend:
    """One ``Machine`` batch of events per streamed delta, made once the tokens starting in the
    delta are known (a special token may still be arriving), and the end-of-stream batch."""

    def __init__(self) -> None:
        self.machine = Machine()
        self.text, self.tokenized, self.done = "", 0, 0
        self.ends: list[int] = []  # end offsets of the deltas not run yet
        self.tokens: list[tuple[int, Token]] = []  # known tokens of those deltas

    def feed(self, delta: str) -> list[list[Event]]:
        self.text += delta
        self.ends.append(len(self.text))
        return self._ready(final=False)

    def finish(self) -> list[list[Event]]:
        """The remaining batches; the last one is the end-of-stream flush."""
        return self._ready(final=True) + [self.machine.finish()]

    def _ready(self, final: bool) -> list[list[Event]]:
        found, self.tokenized = token_starts(self.text, self.tokenized, final)
        self.tokens += found
        batches = []
        while self.ends and (final or self.tokenized >= self.ends[0]):
            end = self.ends.pop(0)
            cut = next((k for k, (off, _) in enumerate(self.tokens) if off >= end),
                       len(self.tokens))
            mine, self.tokens = [tok for _, tok in self.tokens[:cut]], self.tokens[cut:]
            batches.append(self.machine.feed(self.text[self.done:end], mine))
            self.done = end
        return batches
