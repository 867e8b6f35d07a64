"""One seeded burst of load on a pair, with the oracle's verdicts, the pair's evidence and its
drain, and the ``Reproduction`` that collects bursts on one variant."""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from engine.config import EngineConfig
from workbench.deploy import LaunchSpec, PDPair
from workbench.drive import Shape, inject_concurrency, traffic_of
from workbench.drive.traffic import traffic_name
from workbench.judge import JUDGED_ROOMS, judge_rooms, unexpected_errors
from workbench.observe import Drain, Localization, collect, localize, settle
from workbench.observe.buffers import capture_name

log = logging.getLogger(__name__)


class StopOn(enum.Enum):
    """Which count of a burst ends a reproduction. ``ANOMALIES``: flagged responses, requests
    that failed without being killed, writes into pages no live room owned, or anything left
    after the pair drained."""

    FLAGGED = "flagged"
    LEAKED = "leaked"
    MISMATCHED = "mismatched"
    DROPPED = "dropped"
    DRIFTED = "drifted"
    ANOMALIES = "anomalies"

    def count(self, burst: Burst) -> int:
        return getattr(burst, self.value)


@dataclass(frozen=True)
class Burst:
    """One seeded burst's totals (a row of ``Reproduction.bursts``). ``aborted``: responses the
    server ended with ``abort`` (not killed); ``errors``: requests that failed without being
    killed; ``stale_*``: HiCache layer accesses that raced their load (index-K reads and sends,
    K/V reads and sends); ``late_writes``: decode notifications for rooms with no live owner;
    ``failed_rooms``: rooms Failed on either side; ``leftover``: what stayed after draining;
    ``judged_rooms``: unflagged rooms whose buffers were compared with the reference on both
    sides (the buffer-level oracle), ``buffer_flags``: those that differed; ``drifted``:
    responses whose logprobs drifted from the reference's past the oracle's tolerance (also in
    ``flagged``: corruption below the token)."""

    seed: int
    requests: int
    flagged: int
    leaked: int
    mismatched: int
    dropped: int
    aborted: int = 0
    errors: int = 0
    stale_reads: int = 0
    stale_sends: int = 0
    stale_kv_reads: int = 0
    stale_kv_sends: int = 0
    late_writes: int = 0
    failed_rooms: int = 0
    leftover: int = 0
    judged_rooms: int = 0
    buffer_flags: int = 0
    drifted: int = 0
    t_s: float = 0.0

    @property
    def anomalies(self) -> int:
        return (self.flagged + self.errors + (self.leftover > 0) + self.buffer_flags
                + (self.late_writes > 0))


BURST_COLUMNS = {f.name: (pl.Float64 if f.type == "float" else pl.Int64)
                 for f in dataclasses.fields(Burst)}


@dataclass(frozen=True)
class BurstRun:
    """A burst with its per-request frame, captures, failure reasons and drain."""

    burst: Burst
    requests: pl.DataFrame
    captures: tuple[Path, ...]
    reasons: Counter
    drain: Drain
    localizations: tuple[Localization, ...] = ()  # one per judged room


def run_burst(pair: PDPair, seed: int, shape: Shape, capture_dir: Path | None,
              duration_s: float, max_tokens: int | None = None, judge: int | None = JUDGED_ROOMS,
              reference=None) -> BurstRun:
    """Runs ``shape``'s load once with ``seed`` and collects what it left as evidence; with
    ``judge > 0`` (``None``: every completed unflagged room) also localizes that many unflagged
    rooms against ``reference`` (a ``ReferenceBuffers``), each divergence a buffer flag."""
    before = collect(pair)
    res = inject_concurrency(pair, sessions=shape.sessions, turns=shape.turns, seed=seed,
                             max_tokens=max_tokens or shape.max_tokens,
                             kill_fraction=shape.kill_fraction, kill_window_s=shape.kill_window_s,
                             capture_dir=capture_dir, progress=False, duration_s=duration_s,
                             request_timeout_s=shape.request_timeout_s,
                             align_to=shape.align_to, dialect=shape.dialect)
    drain = settle(pair)
    ev = collect(pair).since(before)
    if capture_dir is not None:  # every burst replays elsewhere (wb load --traffic)
        traffic_of(res).write(capture_dir / traffic_name(shape.name, seed))
    df, s = res.requests, res.summary
    errors = unexpected_errors(df, shape.expect_aborts)
    flagged = s.flagged - (s.aborted if shape.expect_aborts else 0)
    row = Burst(seed, s.completed, flagged, s.leaked, s.ref_mismatch, s.dropped, s.aborted,
                errors, **ev.row(), leftover=drain.leftover, drifted=s.drifted)
    locs = _judge(pair, _rooms_to_judge(pair, df, judge), reference)
    row = dataclasses.replace(row, judged_rooms=len(locs),
                              buffer_flags=sum(loc.first is not None for loc in locs))
    log.info("burst seed=%d shape=%s: %s drain=%s", seed, shape.name, row, drain.left)
    frame = df.with_columns(pl.lit(seed).alias("seed")) if len(df) else df
    return BurstRun(row, frame, res.captures, ev.reasons(), drain, tuple(locs))


def _rooms_to_judge(pair: PDPair, df: pl.DataFrame, judge: int | None) -> list[int]:
    """``judge_rooms`` with the pair's page and chunk sizes (none read when ``judge`` is 0)."""
    if judge == 0:
        return []
    cfg = pair.spec.engine_config()
    return judge_rooms(df, judge, page_size=cfg.page_size, chunk_size=cfg.chunk_size)


def _judge(pair: PDPair, rooms: list[int], reference) -> list[Localization]:
    out = []
    for room in rooms:
        try:
            out.append(localize(pair, room, reference))
        except Exception as exc:  # noqa: BLE001 - a room no longer dumpable is skipped, logged
            log.warning("buffer check of room %d skipped: %s", room, exc)
    return out


@dataclass(frozen=True)
class Reproduction:
    """Bursts run on one variant. ``first_flag_s``: launch start to the first anomalous burst's
    end.

    Invariants: ``bursts`` has one row per seed in ``seeds`` (columns: ``Burst``'s fields);
    ``requests`` concatenates the per-request frames of every burst with a ``seed`` column;
    ``captures`` are dumps of flagged rooms (both sides); ``reasons`` counts Failed rooms per
    reason kind over all bursts; ``drains`` has one entry per burst.
    """

    variant: str
    patches: tuple[str, ...]
    seeds: tuple[int, ...]
    bursts: pl.DataFrame
    requests: pl.DataFrame
    captures: tuple[Path, ...]
    launch_s: float
    first_flag_s: float | None
    engine: dict
    faults: dict
    shape: str = "custom"
    reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    drains: tuple[Drain, ...] = ()
    source: str | None = None
    localizations: tuple[Localization, ...] = ()  # of the rooms the buffer oracle judged
    expect_aborts: bool = False  # the shape times requests out on purpose
    log_dir: str | None = None  # the pair's server and router logs

    def engine_config(self) -> EngineConfig:
        """The launched engine's configuration (for references and buffer diffs)."""
        return LaunchSpec(self.patches, self.engine, self.faults).engine_config()

    def capture_of(self, room: int, role: str = "prefill") -> Path:
        """The dump captured for a flagged ``room`` on ``role`` (raises KeyError if none)."""
        for path in self.captures:
            if path.name == capture_name(room, role):
                return path
        raise KeyError(f"no {role} capture for room {room}; captured: "
                       f"{sorted(p.name for p in self.captures)}")

    @property
    def flagged(self) -> int:
        return int(self.bursts["flagged"].sum())

    @property
    def anomalies(self) -> int:
        b = self.bursts
        return int(b["flagged"].sum() + b["errors"].sum() + (b["leftover"] > 0).sum()
                   + b["buffer_flags"].sum() + (b["late_writes"] > 0).sum())
