"""Which requests of a load count against the engine, shared by the real burst runner and the
simulator: rooms worth comparing with the reference, and failures the load did not cause."""

from __future__ import annotations

import enum

import polars as pl

from engine.config import EngineConfig


class Coverage(enum.Enum):
    """Why a room is worth a buffer comparison: the engine paths its prompt exercised."""

    PREFIX = "prefix"  # a later turn of its session (turn >= 1): a cached prefix was reused
    CHUNK = "chunk"  # its prompt crossed a prefill chunk boundary (prompt > chunk_size)
    PAGE = "page"  # its prompt ends on or next to a page boundary (len % page_size near 0)


def coverage(turn: int, prompt_tokens: int | None, page_size: int, chunk_size: int,
             near: int = 1) -> tuple[Coverage, ...]:
    """The ``Coverage`` kinds of one request; the prompt-length ones need ``prompt_tokens``."""
    out = [Coverage.PREFIX] if turn >= 1 else []
    if prompt_tokens is not None:
        if prompt_tokens > chunk_size:
            out.append(Coverage.CHUNK)
        r = prompt_tokens % page_size
        if min(r, page_size - r) <= near:
            out.append(Coverage.PAGE)
    return tuple(out)


JUDGED_ROOMS = 2
"""Unflagged rooms per burst the buffer oracle compares with the reference, by default
(``None``: every completed one; 0: none). Every default of a ``judge`` parameter is this."""


def judge_rooms(requests: pl.DataFrame, n: int | None, *,
                page_size: int = EngineConfig.page_size,
                chunk_size: int = EngineConfig.chunk_size) -> list[int]:
    """Up to ``n`` (None: all) unflagged completed rooms, chosen to cover the engine's paths:
    round-robin over ``Coverage`` (prefix hits, chunk-boundary prompts, page-aligned prompts)
    and the longest conversations (every room: the fallback). Within a kind, rooms covering
    more kinds come first, then the longest conversation, then the larger room id, so the
    choice is deterministic. Prompt lengths come from the ``prompt_tokens`` column (absent or
    null: only the turn counts)."""
    if (n is not None and n <= 0) or not len(requests):
        return []
    done = requests.filter(pl.col("v_leaked").is_not_null() & pl.col("room").is_not_null()
                           & ~pl.col("flagged"))
    lengths = done["prompt_tokens"] if "prompt_tokens" in done.columns else [None] * len(done)
    rows = [(room, len(msgs), coverage(turn, length, page_size, chunk_size))
            for room, msgs, turn, length in zip(done["room"], done["messages"], done["turn"],
                                                lengths, strict=True)]
    rows.sort(key=lambda r: (-len(r[2]), -r[1], -r[0]))
    queues = [[r[0] for r in rows if kind in r[2]] for kind in Coverage]
    queues.append([r[0] for r in sorted(rows, key=lambda r: (-r[1], -r[0]))])
    return _round_robin(queues, len(rows) if n is None else n)


def _round_robin(queues: list[list[int]], n: int) -> list[int]:
    """Up to ``n`` distinct ids, one from each queue in turn (the last queue: every id)."""
    chosen: list[int] = []
    seen: set[int] = set()
    while len(chosen) < n and any(queues):
        for q in queues:
            while q and q[0] in seen:
                q.pop(0)
            if q and len(chosen) < n:
                seen.add(q[0])
                chosen.append(q.pop(0))
    return chosen


def unexpected_errors(df: pl.DataFrame, expect_timeouts: bool) -> int:
    """Requests that failed without being killed; with ``expect_timeouts`` the decode's KV
    timeouts (504) and unreachable-prefill failures (502) the shape provokes are not counted."""
    if not len(df):
        return 0
    failed = (df["error"] != "") & ~df["killed"]
    if expect_timeouts:
        timeout = (df["status"] == 504) | df["error"].str.contains("prefill unreachable")
        failed = failed & ~timeout
    return int(failed.sum())
