"""Queue and transfer-state snapshots over time, so a wedge shows up as a flat, full line."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import polars as pl

from workbench.deploy import Capability, PDPair, require
from workbench.observe.sampler import PeriodicSampler

QUEUE_SCHEMA = {"t_s": pl.Float64, "role": pl.Utf8, "queue": pl.Utf8, "entries": pl.Int64,
                "orphaned": pl.Int64}


def snapshot_queues(pair: PDPair, t_s: float = 0.0) -> list[dict]:
    """One row per (server role, queue) with its entry count and orphaned entries."""
    rows = []
    for role, srv in [*(("prefill", s) for s in pair.prefill), *(("decode", s) for s in
                                                                   pair.decode)]:
        try:
            q = pair.debug("/debug/queues", srv)
        except httpx.HTTPError:
            continue
        for name, entries in q.items():
            if isinstance(entries, list):
                orphaned = sum(bool(e.get("orphaned")) for e in entries if isinstance(e, dict))
                rows.append({"t_s": t_s, "role": role, "queue": name, "entries": len(entries),
                             "orphaned": orphaned})
    return rows


@dataclass(eq=False)
class QueueSampler(PeriodicSampler):
    """Samples every ``interval_s`` on a thread while active (``with QueueSampler(pair): ...``),
    plus one last snapshot on exit."""

    pair: PDPair
    interval_s: float = field(default=0.25, kw_only=True)
    max_samples: int | None = field(default=10_000, kw_only=True)

    def start(self) -> None:
        require(self.pair, Capability.DEBUG_QUEUES, "QueueSampler")

    def sample(self, t_s: float) -> list[dict]:
        return snapshot_queues(self.pair, t_s)

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.rows += snapshot_queues(self.pair, self.elapsed())

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rows, schema=QUEUE_SCHEMA)
