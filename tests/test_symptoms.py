"""The same corrupted tokens under each parser variant: leak, drop or call
(workbench.judge.symptoms)."""

from __future__ import annotations

import json

import polars as pl
from support.dsml_fuzz import TOOLS, block, invoke, param

from engine.text import Tokenizer
from workbench.judge import Symptom, symptoms

OPENAI_TOOLS = [{"type": "function", "function": {"name": t.name}}
                for t in TOOLS]


def _rows(texts: list[str]) -> pl.DataFrame:
    tk = Tokenizer()
    return pl.DataFrame([{"session": i, "turn": 0, "kind": "call", "room": i,
                          "tools": json.dumps(OPENAI_TOOLS),
                          "token_ids": json.dumps(tk.encode(t) + [tk.eos_id])}
                         for i, t in enumerate(texts)])


def test_a_corrupted_block_leaks_under_strict_and_leaky_sglang_and_vanishes_under_sglang():
    good = block(invoke("get_weather", "\n" + param("city", "Paris") + "\n"))
    truncated_tag = good.replace(f"</{'｜DSML｜'}parameter>", "</｜DSML｜param>", 1)
    unknown_tool = good.replace("get_weather", "get_wether")
    unclosed = good.removesuffix("</｜DSML｜function_calls>")
    out = symptoms(_rows(["Sure.\n\n" + good, "Sure.\n\n" + unclosed, unknown_tool,
                          truncated_tag]))
    c, leak, drop = Symptom.CALL, Symptom.LEAKED, Symptom.DROPPED
    assert out["strict"].to_list() == [c, leak, leak, leak]
    assert out["sglang-leaky"].to_list() == [c, leak, leak, c]  # 0.5.15 ignores stray text
    assert out["sglang"].to_list() == [c, drop, drop, drop]
    assert out["strict_stream"].to_list() == out["strict"].to_list()  # chunk-independent
    # SGLang streams an invoke once it closes, whatever its name and whether the block closes
    assert out["sglang_stream"].to_list() == [c, c, c, drop]
    assert out["sglang-leaky_stream"].to_list() == [c, c, c, c]


def test_plain_text_is_text_and_rows_without_tokens_are_skipped():
    rows = _rows(["hello"]).with_columns(pl.lit("answer").alias("kind"))
    assert symptoms(rows)["sglang"].to_list() == [Symptom.TEXT]
    empty = symptoms(rows.with_columns(pl.lit("null").alias("token_ids")))
    assert empty.is_empty() and "sglang-leaky_stream" in empty.columns
