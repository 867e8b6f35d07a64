"""Character-level tokenizer with DeepSeek-style special tokens.

Invariant: ``decode(encode(text)) == text`` for any text made of printable ASCII, newlines and
special-token strings; other characters map to ``UNK_CHAR`` ("?").
"""

from __future__ import annotations

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
TOOL = "<｜tool▁output｜>"
PAD = "<｜pad｜>"

FC_OPEN = "<｜DSML｜function_calls>"
FC_CLOSE = "</｜DSML｜function_calls>"
INVOKE_OPEN = '<｜DSML｜invoke name="'
INVOKE_CLOSE = "</｜DSML｜invoke>"
PARAM_OPEN = '<｜DSML｜parameter name="'
PARAM_CLOSE = "</｜DSML｜parameter>"
STRING_TRUE = '" string="true">'
STRING_FALSE = '" string="false">'
TAG_END = '">'

SPECIAL_TOKENS: tuple[str, ...] = (
    PAD, BOS, EOS, USER, ASSISTANT, TOOL,
    FC_OPEN, FC_CLOSE, INVOKE_OPEN, INVOKE_CLOSE, PARAM_OPEN, PARAM_CLOSE,
    STRING_TRUE, STRING_FALSE, TAG_END,
)
CONTROL_TOKENS = (PAD, BOS, EOS, USER, ASSISTANT, TOOL)  # not content: skippable
CHARS: str = "\n" + "".join(chr(c) for c in range(32, 127))
UNK_CHAR = "?"
VOCAB_SIZE = 128


class Tokenizer:
    """Maps text to ids: special tokens by longest match first, then single characters."""

    def __init__(self) -> None:
        self.itos: list[str] = list(SPECIAL_TOKENS) + list(CHARS)
        assert len(self.itos) <= VOCAB_SIZE
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self._specials = sorted(SPECIAL_TOKENS, key=len, reverse=True)
        self.pad_id = self.stoi[PAD]
        self.bos_id = self.stoi[BOS]
        self.eos_id = self.stoi[EOS]
        self.control_ids = frozenset(self.stoi[t] for t in CONTROL_TOKENS)
        self.vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        i, n = 0, len(text)
        while i < n:
            if text[i] in "<\"":
                tok = next((s for s in self._specials if text.startswith(s, i)), None)
                if tok is not None:
                    ids.append(self.stoi[tok])
                    i += len(tok)
                    continue
            ids.append(self.stoi.get(text[i], self.stoi[UNK_CHAR]))
            i += 1
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] if i < len(self.itos) else "" for i in ids)

    def token_text(self, token_id: int) -> str:
        return self.itos[token_id] if token_id < len(self.itos) else ""
