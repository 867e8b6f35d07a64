"""Which requests of a load count against the engine, shared by the real burst runner and the
simulator: rooms worth comparing with the reference, and failures the load did not cause."""

from __future__ import annotations

import polars as pl


def judge_rooms(requests: pl.DataFrame, n: int | None) -> list[int]:
    """Up to ``n`` unflagged completed rooms (``None``: all of them), longest conversation first
    (later turns cross the most prefill chunk boundaries and reuse the most cached prefix)."""
    if (n is not None and n <= 0) or not len(requests):
        return []
    done = requests.filter(pl.col("v_leaked").is_not_null() & pl.col("room").is_not_null()
                           & ~pl.col("flagged"))
    order = done.with_columns(pl.col("messages").str.len_chars().alias("_chars"))
    rooms = order.sort(["_chars", "room"], descending=True)["room"]
    return (rooms if n is None else rooms.head(n)).to_list()


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
