"""Queue and transfer-state snapshots over time, so a wedge shows up as a flat, full line."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
import polars as pl

from workbench.backends import Capability, require
from workbench.launch import PDPair

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
class QueueSampler:
    """Samples every ``interval_s`` on a thread while active (``with QueueSampler(pair): ...``)."""

    pair: PDPair
    interval_s: float = 0.25
    max_samples: int = 10_000
    rows: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> QueueSampler:
        require(self.pair, Capability.DEBUG_QUEUES, "QueueSampler")
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="queue-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.rows += snapshot_queues(self.pair, time.monotonic() - self._t0)

    def _loop(self) -> None:
        while not self._stop.is_set() and len(self.rows) < self.max_samples:
            self.rows += snapshot_queues(self.pair, time.monotonic() - self._t0)
            self._stop.wait(self.interval_s)

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rows, schema=QUEUE_SCHEMA)
