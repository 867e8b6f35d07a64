"""Durable, append-only trial store (SQLite, WAL) and a resumable trial runner.

A *trial* is one run of a flaky reproduction against one *candidate* (a version, a config, a
subset of changes).  Trials are keyed by ``(experiment, candidate, trial_index)``; the store
never holds two rows for the same key, so a trial recorded twice is kept once (first write
wins).  :class:`CachedTrial` replays recorded trials before running new ones, which is what
lets a killed search resume with no lost and no repeated trials.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import polars as pl

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

TrialFn = Callable[[str, int], bool]
"""``trial(candidate, seed) -> failed``: one reproduction attempt; True means it failed."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trials (
    experiment  TEXT    NOT NULL,
    candidate   TEXT    NOT NULL,
    trial_index INTEGER NOT NULL,
    failed      INTEGER NOT NULL,
    seconds     REAL    NOT NULL,
    seed        INTEGER NOT NULL,
    detail      TEXT    NOT NULL DEFAULT '',
    recorded_at REAL    NOT NULL,
    PRIMARY KEY (experiment, candidate, trial_index)
)
"""
_COLUMNS = ("experiment", "candidate", "trial_index", "failed", "seconds", "seed", "detail")
_PL_SCHEMA = {
    "experiment": pl.Utf8,
    "candidate": pl.Utf8,
    "trial_index": pl.Int64,
    "failed": pl.Boolean,
    "seconds": pl.Float64,
    "seed": pl.Int64,
    "detail": pl.Utf8,
}


@dataclass(frozen=True)
class Trial:
    """One recorded trial.  ``trial_index`` counts from 0 per (experiment, candidate)."""

    experiment: str
    candidate: str
    trial_index: int
    failed: bool
    seconds: float
    seed: int
    detail: str = ""


@dataclass(frozen=True)
class Counts:
    """Failures and total trials of one candidate; invariant ``0 <= fails <= total``."""

    fails: int
    total: int

    @property
    def rate(self) -> float:
        """Observed failure rate (0.0 when no trials)."""
        return self.fails / self.total if self.total else 0.0


def derive_seed(namespace: str, candidate: str, index: int) -> int:
    """Deterministic 63-bit seed for trial ``index`` of ``candidate`` (same inputs, same seed)."""
    key = f"{namespace}\x1f{candidate}\x1f{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


class TrialStore:
    """Append-only SQLite trial log.  Safe to share between threads of one process.

    Every :meth:`record` is committed immediately, so a killed process loses at most the
    trial that was running.  Re-recording an existing key is a no-op (never a duplicate).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)

    def record(self, trial: Trial) -> bool:
        """Append ``trial``; returns False (and changes nothing) if its key already exists."""
        row = (*(getattr(trial, c) for c in _COLUMNS), time.time())
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO trials VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row
            )
        return cur.rowcount == 1

    def _rows(self, experiment: str) -> list[tuple]:
        sql = f"SELECT {', '.join(_COLUMNS)} FROM trials WHERE experiment = ?"
        sql += " ORDER BY candidate, trial_index"
        with self._lock:
            return self._db.execute(sql, (experiment,)).fetchall()

    def load(self, experiment: str) -> list[Trial]:
        """All trials of ``experiment`` as :class:`Trial` objects, by (candidate, index)."""
        rows = self._rows(experiment)
        return [Trial(e, c, i, bool(f), s, sd, d) for e, c, i, f, s, sd, d in rows]

    def trials(self, experiment: str) -> pl.DataFrame:
        """All trials of ``experiment``, one row each, sorted by (candidate, trial_index)."""
        rows = [(e, c, i, bool(f), s, sd, d) for e, c, i, f, s, sd, d in self._rows(experiment)]
        return pl.DataFrame(rows, schema=_PL_SCHEMA, orient="row")

    def counts(self, experiment: str) -> dict[str, Counts]:
        """Per-candidate :class:`Counts` for ``experiment`` (candidates with no trials absent)."""
        sql = "SELECT candidate, SUM(failed), COUNT(*) FROM trials WHERE experiment = ?"
        with self._lock:
            rows = self._db.execute(sql + " GROUP BY candidate", (experiment,)).fetchall()
        return {c: Counts(int(f), int(n)) for c, f, n in rows}

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> TrialStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CachedTrial:
    """Resumable trial runner: ``runner(candidate) -> failed``.

    The i-th call for a candidate is that candidate's trial ``i``.  If the store already holds
    trial ``i`` it is returned as recorded (a *replay*); otherwise ``trial(candidate, seed)``
    runs with ``seed = derive_seed(namespace, candidate, i)`` and the result is recorded
    before it is returned.  ``store=None`` gives the same seeding with nothing persisted.
    Invariant: for a given (store contents, call sequence) the results are identical whether
    the run is fresh, resumed, or uncached.
    """

    def __init__(
        self,
        store: TrialStore | None,
        experiment: str,
        trial: TrialFn,
        *,
        namespace: str | None = None,
    ):
        self.store, self.experiment, self.trial = store, experiment, trial
        self.namespace = experiment if namespace is None else namespace
        recorded = store.load(experiment) if store is not None else []
        self._recorded = {(t.candidate, t.trial_index): t.failed for t in recorded}
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()
        self.ran = 0
        self.replayed = 0

    @property
    def spent(self) -> int:
        """Trials consumed by this runner so far (replayed + newly run)."""
        return self.ran + self.replayed

    def _claim(self, candidate: str) -> int:
        with self._lock:
            index = self._next.get(candidate, 0)
            self._next[candidate] = index + 1
        return index

    def _run_index(self, candidate: str, index: int) -> bool:
        cached = self._recorded.get((candidate, index))
        if cached is not None:
            with self._lock:
                self.replayed += 1
            return cached
        seed = derive_seed(self.namespace, candidate, index)
        start = time.perf_counter()
        failed = bool(self.trial(candidate, seed))
        seconds = time.perf_counter() - start
        if self.store is not None:
            self.store.record(Trial(self.experiment, candidate, index, failed, seconds, seed))
        with self._lock:
            self._recorded[(candidate, index)] = failed
            self.ran += 1
        return failed

    def __call__(self, candidate: str) -> bool:
        """Run (or replay) the next trial of ``candidate``; True means it failed."""
        return self._run_index(candidate, self._claim(candidate))

    def run_many(self, candidate: str, count: int, workers: int = 1) -> list[bool]:
        """The next ``count`` trials of ``candidate``, new ones run on ``workers`` threads.

        Results are in trial-index order; all ``count`` trials are consumed (no early exit).
        """
        return self.run_batch([candidate] * count, workers)

    def run_batch(self, candidates: Sequence[str], workers: int = 1) -> list[bool]:
        """The next trial of each entry of ``candidates`` (repeats allowed), run on ``workers``
        threads; indices are claimed in list order, so results do not depend on timing."""
        indices = [(c, self._claim(c)) for c in candidates]
        return run_parallel(lambda ci: self._run_index(*ci), indices, workers)


def run_parallel(fn: Callable[[T], R], jobs: Iterable[T], workers: int) -> list[R]:
    """``[fn(j) for j in jobs]`` on a pool of ``workers`` threads; result order = job order.

    ``workers <= 1`` runs inline.  The first exception raised by any job is re-raised.
    """
    items: Sequence[T] = list(jobs)
    if workers <= 1 or len(items) <= 1:
        return [fn(j) for j in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))
