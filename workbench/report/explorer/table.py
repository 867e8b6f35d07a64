"""What the flagged-request explorer draws, as data: rows, filters, one request's detail.

``requests_table(result)`` is every judged request of a ``Reproduction`` (or a ``LoadResult``,
a list of them, or their ``requests`` frame) with a ``verdict`` label and a stable ``request``
number; ``filter_requests`` applies an ``ExplorerFilter``; ``detail(row)`` gives the
conversation, the response and the reference token by token, with the first differing token
marked and the per-token logprob drift. ``workbench.report.explorer.view`` draws them.

Invariants: a row's ``verdict`` is the first of ``VERDICTS`` its flags carry (``clean`` when
none); in a ``Detail`` the tokens before ``first_diff`` are ``SAME`` on both sides, the token at
``first_diff`` is ``FIRST_DIFF`` on every side that has one, and later ones ``AFTER``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from engine.text import Tokenizer
from engine.text.tokenizer import SPECIAL_TOKENS

# a flagged request's label: the first that applies, in this order
VERDICTS = ("leaked", "mismatched", "dropped", "malformed", "drifted", "aborted", "oracle_error",
            "clean")
_VERDICT_EXPR = (
    ("leaked", pl.col("v_leaked").fill_null(False)),
    ("mismatched", pl.col("v_ref_match").eq(False).fill_null(False)),
    ("dropped", pl.col("v_dropped").fill_null(False)),
    ("malformed", pl.col("v_well_formed").eq(False).fill_null(False)),
    ("drifted", pl.col("v_logprob_drift").fill_null(False)),
    ("aborted", pl.col("v_aborted").fill_null(False)),
    ("oracle_error", pl.col("v_oracle_error").fill_null("").str.len_chars() > 0),
)
_TOKENIZER = Tokenizer()


class Mark(enum.Enum):
    SAME = "same"
    FIRST_DIFF = "first-diff"
    AFTER = "after"


@dataclass(frozen=True)
class Token:
    """One generated token: its text (verbatim), whether it is a special token, its mark."""

    text: str
    special: bool
    mark: Mark


@dataclass(frozen=True)
class DriftPoint:
    """Server vs reference logprob at one position where both chose the same token."""

    position: int
    server: float
    reference: float

    @property
    def drift(self) -> float:
        return abs(self.server - self.reference)


@dataclass(frozen=True)
class Detail:
    """One request as the explorer shows it. ``first_diff``: the first position where the
    response and the reference differ (None: identical, or no reference)."""

    request: int
    title: str
    messages: tuple[dict, ...]
    response: tuple[Token, ...]
    reference: tuple[Token, ...] | None
    first_diff: int | None
    drift: tuple[DriftPoint, ...]
    content: str
    verdict: str


@dataclass(frozen=True)
class ExplorerFilter:
    """None on a field: any value."""

    verdict: str | None = None
    session: int | None = None
    shape: str | None = None
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if self.verdict is not None and self.verdict not in (*VERDICTS, "flagged"):
            raise ValueError(f"verdict must be one of {[*VERDICTS, 'flagged']}, "
                             f"not {self.verdict!r}")


def _frames(result) -> list[tuple[str, str, pl.DataFrame]]:
    if isinstance(result, pl.DataFrame):
        return [("", "", result)]
    if isinstance(result, Sequence) and not isinstance(result, str):
        return [f for r in result for f in _frames(r)]
    if not isinstance(getattr(result, "requests", None), pl.DataFrame):
        raise TypeError(f"explore needs a Reproduction, LoadResult, a list of them or a requests "
                        f"frame, not {type(result).__name__}")
    return [(getattr(result, "variant", ""), getattr(result, "shape", ""), result.requests)]


def requests_table(result) -> pl.DataFrame:
    """Every judged request (a verdict was given) with ``request``, ``variant``, ``shape`` and
    its ``verdict`` label; unjudged ones (killed, failed) are left out."""
    frames = [df.filter(pl.col("v_leaked").is_not_null()).with_columns(
                  pl.lit(variant).alias("variant"), pl.lit(shape).alias("shape"))
              for variant, shape, df in _frames(result) if len(df) and "v_leaked" in df.columns]
    if not frames:
        return pl.DataFrame(schema={"request": pl.Int64, "verdict": pl.Utf8})
    df = pl.concat(frames, how="diagonal_relaxed")
    label = pl.lit("clean")
    for name, cond in reversed(_VERDICT_EXPR):
        label = pl.when(cond).then(pl.lit(name)).otherwise(label)
    return df.with_row_index("request").with_columns(
        pl.col("request").cast(pl.Int64), label.alias("verdict"))


def filter_requests(df: pl.DataFrame, flt: ExplorerFilter) -> pl.DataFrame:
    """The rows matching every field of ``flt`` (``verdict="flagged"``: any but clean)."""
    if flt.verdict == "flagged":
        df = df.filter(pl.col("verdict") != "clean")
    elif flt.verdict is not None:
        df = df.filter(pl.col("verdict") == flt.verdict)
    for col in ("session", "shape", "finish_reason"):
        value = getattr(flt, col)
        if value is not None:
            df = df.filter(pl.col(col) == value)
    return df


def worst_first(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` ordered by verdict as ``VERDICTS`` ranks them (leaks first), then by request."""
    rank = pl.col("verdict").replace_strict(VERDICTS, list(range(len(VERDICTS))), default=99)
    return df.sort(rank, pl.col("request"))


def options(df: pl.DataFrame, column: str) -> list:
    """The distinct values of ``column`` in order (a filter's choices)."""
    if column not in df.columns:
        return []
    return sorted(v for v in df[column].unique().to_list() if v is not None)


def _loads(value) -> list | None:
    return json.loads(value) if isinstance(value, str) and value else None


def tokens(ids: list[int], first_diff: int | None) -> tuple[Token, ...]:
    """``ids`` as verbatim texts, marked against ``first_diff``."""
    def mark(i: int) -> Mark:
        if first_diff is None or i < first_diff:
            return Mark.SAME
        return Mark.FIRST_DIFF if i == first_diff else Mark.AFTER
    texts = [_TOKENIZER.token_text(t) for t in ids]
    return tuple(Token(t, t in SPECIAL_TOKENS, mark(i)) for i, t in enumerate(texts))


def drift_points(logprobs: list | None, ref_logprobs: list | None,
                 agree: int) -> tuple[DriftPoint, ...]:
    """Per position before ``agree`` (the tokens both chose alike) where both values are known."""
    if not logprobs or not ref_logprobs:
        return ()
    return tuple(DriftPoint(i, a, b) for i, (a, b) in
                 enumerate(zip(logprobs[:agree], ref_logprobs[:agree], strict=False))
                 if a is not None and b is not None)


def detail(row: dict) -> Detail:
    """What the explorer shows for one ``requests_table`` row."""
    ids = _loads(row.get("token_ids")) or []
    ref = _loads(row.get("ref_token_ids"))
    diff = row.get("v_first_diff")
    if diff is None and ref is not None and ids != ref:
        diff = min(len(ids), len(ref))
    agree = diff if diff is not None else len(ids)
    title = (f"#{row['request']} {row.get('variant') or ''} seed {row.get('seed')} session "
             f"{row['session']} turn {row['turn']} {row['kind']}: {row['verdict']}")
    return Detail(row["request"], " ".join(title.split()),
                  tuple(_loads(row.get("messages")) or ()), tokens(ids, diff),
                  tokens(ref, diff) if ref is not None else None, diff,
                  drift_points(_loads(row.get("logprobs")), _loads(row.get("ref_logprobs")),
                               agree),
                  row.get("content") or "", row["verdict"])
