"""What users would see of the same corrupted outputs under each tool-call parser.

The race corrupts tokens; the parser decides the symptom. ``symptoms`` takes the tokens a run
actually generated (its rows' ``token_ids``), rebuilds the completion text exactly as the server
parsed it, and parses it with each registered variant (``engine.text.parsers``), one-shot and
streamed one token at a time. Deterministic: no server, no race, the same tokens every time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import Enum

import polars as pl

from engine.text import Tokenizer, ToolSpec
from engine.text.dsml_grammar import has_marker
from engine.text.parsers import get_parser

PARSERS = ("strict", "sglang-leaky", "sglang")


class Symptom(str, Enum):
    """What a client receives for one completion."""

    CALL = "call"  # some tool call came out (right or wrong)
    LEAKED = "leaked"  # DSML markup in content
    DROPPED = "dropped"  # the completion held markup; neither a call nor markup came out
    TEXT = "text"  # no markup generated, none shown: plain content


def completion_text(token_ids: Sequence[int], tokenizer: Tokenizer) -> str:
    """The completion as the server parsed it: end-of-sequence and control tokens skipped."""
    skip = set(tokenizer.control_ids) | {tokenizer.eos_id}
    return "".join(tokenizer.token_text(t) for t in token_ids if t not in skip)


def classify(generated: str, content: str, n_calls: int) -> Symptom:
    """The symptom of one parse of ``generated`` that gave ``content`` and ``n_calls`` calls."""
    if has_marker(content):
        return Symptom.LEAKED
    if n_calls:
        return Symptom.CALL
    return Symptom.DROPPED if has_marker(generated) else Symptom.TEXT


def _streamed(parser_name: str, text: str, pieces: list[str], tools) -> Symptom:
    s = get_parser(parser_name).streamer(tools)
    events = [e for p in pieces for e in s.feed(p)] + s.finish()
    content = "".join(getattr(e, "text", "") for e in events)
    return classify(text, content, len(s.calls))


def symptoms(requests: pl.DataFrame, parsers: Sequence[str] = PARSERS) -> pl.DataFrame:
    """One row per request in ``requests`` with generated tokens: ``session``, ``turn``,
    ``kind``, ``room`` and, per parser, ``<parser>`` (one-shot ``Symptom`` value) and
    ``<parser>_stream`` (streamed token by token)."""
    tk, rows = Tokenizer(), []
    schema = {"session": pl.Int64, "turn": pl.Int64, "kind": pl.String, "room": pl.Int64,
              **{f"{p}{s}": pl.String for p in parsers for s in ("", "_stream")}}
    for r in requests.filter(pl.col("token_ids") != "null").iter_rows(named=True):
        ids = json.loads(r["token_ids"])
        tools = [ToolSpec.from_openai(t) for t in json.loads(r["tools"])] or None
        text = completion_text(ids, tk)
        pieces = [completion_text([t], tk) for t in ids]
        row = {"session": r["session"], "turn": r["turn"], "kind": r["kind"], "room": r["room"]}
        for name in parsers:
            parsed = get_parser(name).parse(text, tools)
            row[name] = classify(text, parsed.content, len(parsed.calls)).value
            row[f"{name}_stream"] = _streamed(name, text, pieces, tools).value
        rows.append(row)
    return pl.DataFrame(rows, schema=schema)
