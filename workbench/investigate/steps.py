"""Reading a reproduction: its flagged requests, each session's first flag, the HiCache races
the pair counted. ``RACE_ENGINE``/``RACE_FAULTS``/``BUGGY`` are the seed investigation's
settings (the index-K race); nothing uses them unless a caller passes them."""

from __future__ import annotations

import polars as pl

from engine.patches import SEED_RACE
from workbench.deploy import PDPair
from workbench.investigate.bursts import Reproduction
from workbench.investigate.series import RACE_ENGINE as SERIES_ENGINE
from workbench.investigate.series import RACE_FAULTS as SERIES_FAULTS
from workbench.observe import collect

RACE_ENGINE = {**SERIES_ENGINE, "debug_capture": 64}
RACE_FAULTS = SERIES_FAULTS
BUGGY = SEED_RACE


def race_counts(pair: PDPair) -> dict[str, int]:
    """HiCache layer accesses that raced their load, summed over the servers: index-K reads
    (``stale_reads``) and sends (``stale_sends``), K/V reads and sends (``stale_kv_*``)."""
    return dict(collect(pair).stale)


def flagged_requests(rep: Reproduction) -> pl.DataFrame:
    """The flagged rows, with what the oracle saw (content, first differing token, verdicts)."""
    cols = ["seed", "session", "turn", "kind", "room", "finish_reason", "content",
            "v_first_diff", "v_leaked", "v_dropped", "v_well_formed", "v_ref_match",
            "v_aborted", "v_oracle_error", "v_logprob_drift", "v_logprob_drift_max"]
    return rep.requests.filter(pl.col("flagged")).select(cols)


def first_flags(rep: Reproduction) -> pl.DataFrame:
    """The first flagged request of every session (in turn order, the call before the answer).

    A session goes on after a corrupted answer, so later turns carry that corruption in their
    prompt: the reference, run on the same prompt, reproduces it. Only a session's first flag
    has a clean history, so only there must a leak also be a reference mismatch.
    """
    flagged = rep.requests.filter(pl.col("flagged"))
    if not len(flagged):
        return flagged
    step = pl.when(pl.col("kind") == "call").then(0).otherwise(1).alias("_step")
    return (flagged.with_columns(step).sort(["seed", "session", "turn", "_step"])
            .group_by(["seed", "session"], maintain_order=True).first().drop("_step"))
