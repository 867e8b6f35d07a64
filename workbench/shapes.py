"""Load and fault shapes: the small grid a reproduction sweeps when the bug is unknown.

A ``Shape`` is everything but the code: engine settings, seeded faults, extra decode arguments and
the load (sessions, turns, kills). ``SHAPES`` is the registry ``reproduce(shape=...)`` and
``sweep`` read; its order (``SWEEP_ORDER``) goes from the plain production setting to the
specific stresses, so the first shape that fires is the least unusual one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.registry import Registry


@dataclass(frozen=True)
class Shape:
    """One load/fault shape. ``expect_aborts``: the shape times requests out on purpose (a
    paused peer), so server aborts are not anomalies there; leftovers and mismatches still are."""

    name: str
    description: str
    engine: dict = field(default_factory=dict)
    faults: dict = field(default_factory=dict)
    decode_args: tuple[str, ...] = ()
    sessions: int = 6
    turns: int = 2
    max_tokens: int = 120
    kill_fraction: float = 0.0
    kill_window_s: float = 1.5
    expect_aborts: bool = False

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1 or not 0 <= self.kill_fraction <= 1:
            raise ValueError(f"shape {self.name}: need sessions, turns >= 1, kill_fraction in "
                             f"[0, 1]")


HICACHE = {"hicache": True, "hicache_offload_on_finish": True, "num_pages": 512}
RACE_FAULTS = {"seed": 7, "hicache_ns_per_byte": 2000.0, "hicache_jitter": 0.3}
CAPTURE = {"debug_capture": 64}

SHAPES: Registry[Shape] = Registry("load shape")
for _s in (
    Shape("baseline", "the production setting: HiCache offload on finish (turn 2 loads its "
          "prefix back), prefix cache, prompts crossing chunk boundaries, 6 sessions x 2 turns, "
          "no faults", {**HICACHE, **CAPTURE}),
    Shape("slow_transfer", "NIXL writes held 30 ms per layer (+-50%) and the aux row posted "
          "20 ms after the last layer, so notifications and data interleave",
          {**HICACHE, **CAPTURE},
          {"seed": 11, "transfer_fixed_ms": 30.0, "transfer_jitter": 0.5, "aux_delay_ms": 20.0}),
    Shape("hicache_race", "HiCache load-back copies slowed in proportion to their bytes "
          "(2 us/byte, +-30%), so layer loads overlap the forwards that read them",
          {**HICACHE, **CAPTURE}, RACE_FAULTS),
    Shape("kills", "40% of requests killed within 1 s while transfers are held 40 ms per layer",
          {**HICACHE, **CAPTURE}, {"seed": 13, "transfer_fixed_ms": 40.0},
          sessions=8, kill_fraction=0.4, kill_window_s=1.0),
    Shape("peer_pause", "the prefill's senders pause 2.5 s every 3rd room and the decode times "
          "waiting rooms out after 1.5 s (timeouts are expected; what they leave is not)",
          {**HICACHE, **CAPTURE}, {"seed": 17, "peer_pause_every": 3, "peer_pause_ms": 2500.0},
          ("--waiting-timeout-s", "1.5"), expect_aborts=True),
):
    SHAPES.register(_s.name, _s)

SWEEP_ORDER: tuple[str, ...] = ("baseline", "slow_transfer", "hicache_race", "kills",
                                "peer_pause")


def shape_of(shape: str | Shape) -> Shape:
    """A registered shape by name (unknown names list the valid ones), or ``shape`` itself."""
    return shape if isinstance(shape, Shape) else SHAPES.get(shape)
