"""What a simulated run plays (``Workload``), what it found (``SimRun``, ``SimEvidence``), and
which patch variants the simulation can drive (``SIMULATED``, ``SIMULATED_PD``)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.patches import PATCHES, SIMULATED, SIMULATED_PD
from engine.sim import Decision
from workbench.drive import LoadResult
from workbench.drive.shapes import HICACHE, RACE_FAULTS, Shape, shape_of
from workbench.judge import JUDGED_ROOMS, unexpected_errors

DECODE_ARGS = {"--max-transfer-queue": "transfer_queue",
               "--waiting-timeout-s": "waiting_timeout_s"}  # decode flag -> Workload field


def check_simulated(patches: Iterable[str], pd: bool = False) -> tuple[str, ...]:
    """``patches`` sorted; ValueError naming any the simulation (of a PD pair when ``pd``)
    cannot run."""
    patches = tuple(sorted(patches))
    can = SIMULATED_PD if pd else SIMULATED
    missing = [p for p in patches if p not in can]
    if missing:
        unknown = [p for p in missing if p not in PATCHES]
        if unknown:
            raise ValueError(f"unknown patch variant(s): {', '.join(unknown)}; valid: "
                             f"{', '.join(PATCHES.names())}")
        where = ("only in a simulated PD pair" if set(missing) <= SIMULATED_PD
                 else "a real deployment only")
        raise ValueError(f"not simulated ({where}): {', '.join(missing)}; simulated "
                         f"{'PD ' if pd else ''}patch variants: {', '.join(sorted(can))}")
    return patches


@dataclass(frozen=True)
class Workload:
    """What a simulated run plays: ``sessions`` transcripts of ``inject_concurrency``'s load
    ``load_seed``, ``turns`` rounds each, ``max_tokens`` per response, on an engine configured by
    ``engine`` with seeded ``faults`` (their delays become virtual time).

    ``pd``: a prefill and a decode engine joined by the simulated transfer layer and bootstrap
    (``engine.sim.Fabric``, ``SimBootstrap``) instead of one engine; the decode has
    ``transfer_queue`` slots and fails a room whose KV has not come after ``waiting_timeout_s``.
    ``kill_fraction`` of the requests (chosen per session from
    ``load_seed``) are abandoned by their client ``[0, kill_window_s)`` virtual seconds after
    dispatch; a request unanswered after ``request_timeout_s`` is an error (a wedge); after the
    load, the pair gets ``drain_s`` to settle before what stayed is counted.
    ``time_quantum_us``: the scheduler's timing uncertainty (``SimRuntime(quantum=)``): a thread
    due that close to now may run first, so latencies that real jitter reorders are reordered by
    the strategy (0: exact virtual time). ``pct_horizon``: PCT's ``k``, best about the decisions
    of one schedule (``len(SimRun.trace)``): a bug of depth ``d`` is found with probability
    >= 1/(threads * k^(d-1)) per schedule."""

    sessions: int = 6
    turns: int = 2
    max_tokens: int = 64
    load_seed: int = 0
    engine: dict = field(default_factory=lambda: dict(HICACHE))
    faults: dict = field(default_factory=lambda: dict(RACE_FAULTS))
    layer_us: float = 250.0  # virtual cost of one layer of a forward: fixed part
    layer_us_per_token: float = 2.0  # and per token of the batch
    pd: bool = False
    transfer_queue: int = 8
    waiting_timeout_s: float = 30.0
    kill_fraction: float = 0.0
    kill_window_s: float = 0.05
    request_timeout_s: float = 45.0
    drain_s: float = 40.0
    expect_aborts: bool = False  # as ``Shape.expect_aborts``: KV timeouts are provoked
    judge: int = JUDGED_ROOMS  # rooms compared with the reference (needs debug_capture)
    time_quantum_us: float = 0.0  # timing jitter: events this close are ordered by the strategy
    pct_horizon: int = 4000  # PCT's change points fall in this many first decisions

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1 or self.max_tokens < 1:
            raise ValueError("sessions, turns and max_tokens must be >= 1")
        if not 0 <= self.kill_fraction <= 1 or self.transfer_queue < 1:
            raise ValueError("kill_fraction must be in [0, 1] and transfer_queue >= 1")
        if not 0 <= self.time_quantum_us < math.inf:
            raise ValueError("time_quantum_us must be a finite number >= 0")
        if self.kill_fraction and not self.pd:
            raise ValueError("kills are simulated in a PD pair only (pd=True)")

    @classmethod
    def of_shape(cls, shape: str | Shape, **overrides) -> Workload:
        """Real mode's load shape (``workbench.drive.shapes``) as a PD workload: its engine
        settings,
        faults (now virtual delays), decode arguments, sessions, turns, tokens and kills."""
        sh = shape_of(shape)
        decode = dict(zip(sh.decode_args[::2], sh.decode_args[1::2], strict=True))
        unknown = set(decode) - set(DECODE_ARGS)
        if unknown:
            raise ValueError(f"shape {sh.name}: decode arguments {sorted(unknown)} are not "
                             f"simulated; simulated: {sorted(DECODE_ARGS)}")
        fields = {DECODE_ARGS[k]: float(v) for k, v in decode.items()}
        if "transfer_queue" in fields:
            fields["transfer_queue"] = int(fields["transfer_queue"])
        return cls(**{"sessions": sh.sessions, "turns": sh.turns, "max_tokens": sh.max_tokens,
                      "engine": dict(sh.engine), "faults": dict(sh.faults), "pd": True,
                      "kill_fraction": sh.kill_fraction, "kill_window_s": sh.kill_window_s,
                      "request_timeout_s": sh.request_timeout_s,
                      "expect_aborts": sh.expect_aborts, **fields, **overrides})

    def config(self, patches: Iterable[str]) -> EngineConfig:
        return EngineConfig(**self.engine, patches=frozenset(patches), faults=self.faults)


DEFAULT_WORKLOAD = Workload()


@dataclass(frozen=True)
class SimEvidence:
    """What a simulated PD pair recorded, in real mode's terms (``workbench.observe.evidence``,
    ``Burst``): ``late_writes`` (decode notifications for rooms no live owner holds), ``left``,
    what stayed after the drain (``"role:what"`` -> count, as ``Drain.left``), and the buffer
    oracle's ``judged_rooms`` and ``buffer_flags``."""

    late_writes: int = 0
    left: dict = field(default_factory=dict)
    judged_rooms: int = 0
    buffer_flags: int = 0  # judged rooms whose buffers differed from the reference

    @property
    def leftover(self) -> int:
        return sum(self.left.values())


@dataclass(frozen=True)
class SimRun:
    """One simulated schedule: the judged load, every decision, what the servers recorded
    (``evidence``), and the forward share of wall time (``forward_s``: time inside engine
    steps)."""

    patches: tuple[str, ...]
    seed: int
    strategy: str
    workload: Workload
    stop_at_flag: bool
    result: LoadResult
    trace: tuple[Decision, ...]
    tokens: tuple[tuple[int, ...], ...]  # every response's token ids, in request order
    wall_s: float
    forward_s: float
    evidence: SimEvidence = SimEvidence()
    guide: tuple[str | None, ...] | None = None  # the schedule, when it was guided (shrunk)

    @property
    def preemptions(self) -> tuple[Decision, ...]:
        """The decisions that switched away from a thread that could have gone on."""
        return tuple(d for d in self.trace if d.preempted)

    @property
    def flagged(self) -> int:
        return self.result.summary.flagged

    @property
    def anomalies(self) -> int:
        """Real mode's burst anomalies (``Burst.anomalies``, counted by the same rules):
        flagged responses, errors of requests not killed, judged rooms whose buffers differ, a
        leftover after draining, late writes; a shape that provokes KV timeouts
        (``expect_aborts``) does not count them."""
        s, expect = self.result.summary, self.workload.expect_aborts
        flagged = s.flagged - (s.aborted if expect else 0)
        ev = self.evidence
        return (flagged + unexpected_errors(self.result.requests, expect) + ev.buffer_flags
                + (ev.leftover > 0) + (ev.late_writes > 0))

    @property
    def failed(self) -> bool:
        return self.anomalies > 0

    @property
    def fingerprint(self) -> str:
        """A digest of the decision trace and every token: equal fingerprints, equal runs."""
        h = hashlib.sha256()
        for d in self.trace:
            h.update(f"{d.step}|{d.thread}|{d.label}|{d.now:.9f}\n".encode())
        h.update(repr(self.tokens).encode())
        return h.hexdigest()[:16]
