"""Reference outcomes of vLLM's DeepSeek-V3.2 tool parser (``--tool-call-parser deepseek_v32``),
driven the way vLLM's OpenAI chat serving drives it. Run with the vLLM venv's python::

    <vllm python> tests/support/vllm_parser_ref.py IN.json OUT.json [TOOLS.json]

TOOLS.json holds the OpenAI tool definitions of the request, passed to vLLM as they are
(``support.vllm_parser_run`` sends ``[t.to_openai() for t in support.dsml_fuzz.TOOLS]`` or the
nested fuzz's ``NESTED_TOOLS``; ``TOOLS`` below is a flat default for running by hand). IN is a
JSON list of ``{"text": str, "runs": {label: [chunk, ...]}}``; OUT is a JSON list (same order) of
``{"one_shot": OUTCOME, "runs": {label: OUTCOME}}`` with OUTCOME ``[content, [[name, args_str],
...]]`` (a crash of the parser is ``["<crash ExcType>", []]``).

How serving drives it (vLLM 0.32, ``ParserManager.get_parser`` composes a ``DelegatingParser``
with no reasoning parser and ``DeepSeekV32EngineToolParser``):

- Non-streamed: ``parser.parse(output.text, request, enable_auto_tools=True,
  model_output_token_ids=...)``; the engine parses the text alone (no token ids). A ``None``
  content is recorded as ``""``; args are each call's ``function.arguments``.
- Streamed: one ``parser.parse_delta(delta_text, delta_token_ids, request, prompt_token_ids,
  finished=...)`` per chunk, ``finished=True`` on the last one, which also flushes the engine
  (``finish_streaming``). Content is every ``delta.content`` joined; a call's args are its index's
  argument fragments joined; its name is the first non-null name.

Token ids of a streamed delta: the whole text is tokenized once with the model's tokenizer
(``data/llama``) and each token's id goes with the chunk holding its first character, so ids may
run ahead of their text (as with detokenizer hold-back) but never lag it. Unknown characters
(outside the vocabulary; they would decode as ``?``) get no id: a real server's text would show
``?`` for them, and sending the unk id (``?`` is the tokenizer's unk and a special token, so vLLM
drops it) against other text would make the scanner wait forever for a ``?``. No EOS id is sent
(a stream cut by max_tokens).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)  # before vLLM's imports log anything

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "data" / "llama"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"},
                                         "filters": {"type": "string"}},
        "required": ["query", "filters"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {
        "type": "object", "properties": {}, "required": []}}},
]


class Reference:
    """One tokenizer, one parser class and one request for every case."""

    def __init__(self, tools: list[dict]) -> None:
        self.tok = get_tokenizer(str(MODEL_DIR))
        self.parser_cls = ParserManager.get_parser(
            tool_parser_name="deepseek_v32", enable_auto_tools=True, tokenizer=self.tok)
        choice = {"tools": tools, "tool_choice": "auto"} if tools else {}  # else "none"
        self.request = ChatCompletionRequest(
            model="tiny-llama", messages=[{"role": "user", "content": "hi"}], **choice)
        self.prompt_ids = self.tok.encode("<｜User｜>hi<｜Assistant｜>", add_special_tokens=False)
        self.unk = self.tok.unk_token_id

    def parser(self):
        return self.parser_cls(self.tok, self.request.tools)

    def token_starts(self, text: str) -> list[tuple[int, int]]:
        """``(start offset, id)`` of each token of ``text``, unknown characters left out."""
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(s, i) for i, (s, e) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
                if i != self.unk or text[s:e] == "?"]

    def one_shot(self, text: str) -> list:
        _, content, calls = self.parser().parse(text, self.request, enable_auto_tools=True,
                                                model_output_token_ids=[])
        return [content or "", [[c.name, c.arguments] for c in calls or []]]

    def streamed(self, text: str, chunks: list[str]) -> list:
        if not chunks:
            return ["", []]
        parser, starts = self.parser(), self.token_starts(text)
        content: list[str] = []
        calls: dict[int, list] = {}
        pos, k = 0, 0
        for n, chunk in enumerate(chunks):
            end, ids = pos + len(chunk), []
            while k < len(starts) and starts[k][0] < end:
                ids.append(starts[k][1])
                k += 1
            pos = end
            delta = parser.parse_delta(chunk, ids, self.request, self.prompt_ids,
                                       finished=n == len(chunks) - 1)
            if delta is None:
                continue
            content.append(delta.content or "")
            for tc in delta.tool_calls or []:
                slot = calls.setdefault(tc.index, [None, ""])
                fn = tc.function
                if fn is not None:
                    slot[0] = slot[0] if slot[0] is not None else fn.name
                    slot[1] += fn.arguments or ""
        return ["".join(content), [[calls[i][0] or "", calls[i][1]] for i in sorted(calls)]]


def _safe(fn, *args) -> list:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a crash is an outcome
        return [f"<crash {type(exc).__name__}>", []]


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    cases = json.loads(Path(argv[1]).read_text())
    ref = Reference(json.loads(Path(argv[3]).read_text()) if len(argv) == 4 else TOOLS)
    out = [{"one_shot": _safe(ref.one_shot, c["text"]),
            "runs": {label: _safe(ref.streamed, c["text"], chunks)
                     for label, chunks in c["runs"].items()}} for c in cases]
    Path(argv[2]).write_text(json.dumps(out, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
