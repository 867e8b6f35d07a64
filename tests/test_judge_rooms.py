"""``judge_rooms``: the buffer oracle's budget covers prefix hits, chunk-boundary prompts and
page-aligned prompts, not only the longest conversations (issue 25). Pure: synthetic frames."""

from __future__ import annotations

import polars as pl

from workbench.judge import judge_rooms
from workbench.judge.rules import Coverage, coverage


def _frame(rows: list[tuple[int, int, int | None, int]]) -> pl.DataFrame:
    """(room, turn, prompt_tokens, message chars) rows of unflagged completed requests."""
    return pl.DataFrame({
        "room": [r[0] for r in rows], "turn": [r[1] for r in rows],
        "prompt_tokens": [r[2] for r in rows], "messages": ["x" * r[3] for r in rows],
        "v_leaked": [False] * len(rows), "flagged": [False] * len(rows)},
        schema_overrides={"prompt_tokens": pl.Int64})


def test_coverage_kinds_of_one_request():
    assert coverage(0, 100, 16, 256) == ()
    assert coverage(1, 260, 16, 256) == (Coverage.PREFIX, Coverage.CHUNK)
    assert coverage(0, 320, 16, 256) == (Coverage.CHUNK, Coverage.PAGE)  # 320 = 20 pages
    assert coverage(0, 33, 16, 256) == (Coverage.PAGE,)  # one past a boundary is near
    assert coverage(0, 34, 16, 256) == ()
    assert coverage(2, None, 16, 256) == (Coverage.PREFIX,)  # no length: only the turn counts


def test_the_budget_covers_each_kind_before_a_second_long_conversation():
    rows = [(1, 0, 200, 9000), (2, 0, 190, 8000),  # long, first turns, short unaligned prompts
            (3, 1, 150, 100), (4, 0, 300, 200), (5, 0, 96, 300), (6, 0, 100, 400)]
    df = _frame(rows)
    assert judge_rooms(df, 4) == [3, 4, 5, 1]  # prefix, chunk, page, then the longest
    assert judge_rooms(df, 4) == judge_rooms(df.reverse(), 4)  # deterministic, order-free
    assert sorted(judge_rooms(df, None)) == [1, 2, 3, 4, 5, 6]  # None: every room
    assert judge_rooms(df, 0) == [] and judge_rooms(df.head(0), None) == []
    # the engine's sizes decide the kinds: with 64-token chunks every prompt crosses one
    assert judge_rooms(df, 2, page_size=50, chunk_size=64)[:2] == [3, 1]


def test_flagged_unfinished_and_roomless_requests_are_never_judged():
    df = _frame([(1, 1, 300, 10), (2, 1, 300, 10), (3, 1, 300, 10)]).with_columns(
        flagged=pl.Series([True, False, False]),
        v_leaked=pl.Series([False, None, False]))
    assert judge_rooms(df, None) == [3]
    no_lengths = _frame([(7, 0, None, 50), (8, 1, None, 10)]).drop("prompt_tokens")
    assert judge_rooms(no_lengths, 1) == [8]  # a later turn before a longer first one
