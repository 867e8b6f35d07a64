"""Load and fault shapes: the small grid a reproduction sweeps when the bug is unknown.

A ``Shape`` is everything but the code: engine settings, seeded faults, extra decode arguments and
the load (sessions, turns, kills). ``SHAPES`` is the registry ``reproduce(shape=...)`` and
``sweep`` read; its order (``SWEEP_ORDER``) starts from the plain production setting, then the
stresses, cheapest first, so the first shape that fires is the least unusual one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.registry import Registry


@dataclass(frozen=True)
class Shape:
    """One load/fault shape. ``expect_aborts``: the shape times requests out on purpose (a
    paused peer), so server aborts are not anomalies there; leftovers and mismatches still are.
    ``patches``, ``align_to`` and ``modes`` are set by ``workbench.drive.modes.with_modes``."""

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
    request_timeout_s: float = 45.0  # a request not answered by then is an error (a wedge)
    patches: tuple[str, ...] = ()  # modifier patches of its modes (workbench.drive.modes)
    align_to: int | None = None  # prompts padded to end on a multiple of this many tokens
    modes: tuple[str, ...] = ()  # the engine modes this shape runs in (names)
    dialect: str = "greedy"  # how its requests call the API (workbench.drive.dialects)

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1 or not 0 <= self.kill_fraction <= 1:
            raise ValueError(f"shape {self.name}: need sessions, turns >= 1, kill_fraction in "
                             f"[0, 1]")


# The seed investigation's HiCache setting and its slowed load-back, defined once: real shapes,
# the patch-series bisection and the simulator's workloads all start from them.
HICACHE = {"hicache": True, "hicache_offload_on_finish": True, "num_pages": 512}
RACE_FAULTS = {"seed": 7, "hicache_ns_per_byte": 2000.0, "hicache_jitter": 0.3}
CAPTURE = {"debug_capture": 64}
SMALL_QUEUE = ("--max-transfer-queue", "8")

SHAPES: Registry[Shape] = Registry("load shape")
for _s in (
    Shape("baseline", "the production setting: HiCache offload on finish (turn 2 loads its "
          "prefix back), prefix cache, prompts crossing chunk boundaries, 6 sessions x 2 turns, "
          "no faults; the decode has 8 transfer slots, so slots are reused within a burst",
          {**HICACHE, **CAPTURE}, decode_args=SMALL_QUEUE, max_tokens=64),
    Shape("slow_transfer", "NIXL writes held 30 ms per layer (+-50%), the aux row posted 20 ms "
          "after the last layer and the done 50 ms after the writes completed, so notifications "
          "and data interleave",
          {**HICACHE, **CAPTURE},
          {"seed": 11, "transfer_fixed_ms": 30.0, "transfer_jitter": 0.5, "aux_delay_ms": 20.0,
           "done_delay_ms": 50.0},
          max_tokens=64),
    Shape("hicache_race", "HiCache load-back copies slowed in proportion to their bytes "
          "(2 us/byte, +-30%), so layer loads overlap the forwards that read them",
          {**HICACHE, **CAPTURE}, RACE_FAULTS),
    Shape("kills", "40% of requests killed within 1 s while transfers are held 100 ms per "
          "layer, so some kills land mid-transfer (8 transfer slots on the decode)",
          {**HICACHE, **CAPTURE}, {"seed": 13, "transfer_fixed_ms": 100.0}, SMALL_QUEUE,
          sessions=8, max_tokens=64, kill_fraction=0.4, kill_window_s=1.0),
    Shape("peer_pause", "the prefill's senders pause 2 s every 4th room and the decode times "
          "waiting rooms out after 1.2 s (timeouts are expected; what they leave is not)",
          {**HICACHE, **CAPTURE}, {"seed": 17, "peer_pause_every": 4, "peer_pause_ms": 2000.0},
          ("--waiting-timeout-s", "1.2"), max_tokens=64, expect_aborts=True),
    Shape("agentic", "baseline's engine under agentic clients: seeded sampling with top_p, "
          "stop sequences that fire, max_tokens that cuts answers, streamed and unstreamed, "
          "tool_choice required or named (workbench.drive.dialects)",
          {**HICACHE, **CAPTURE}, decode_args=SMALL_QUEUE, sessions=8, max_tokens=64,
          dialect="agentic"),
    Shape("clients", "agentic plus top_logprobs, include_usage, parallel_tool_calls, "
          "response_format and ignore_eos", {**HICACHE, **CAPTURE}, decode_args=SMALL_QUEUE,
          sessions=8, max_tokens=64, dialect="clients"),
):
    SHAPES.register(_s.name, _s)

SWEEP_ORDER: tuple[str, ...] = ("baseline", "kills", "slow_transfer", "hicache_race",
                                "peer_pause", "agentic", "clients")


def shape_of(shape: str | Shape) -> Shape:
    """A registered shape by name (unknown names list the valid ones), or ``shape`` itself."""
    return shape if isinstance(shape, Shape) else SHAPES.get(shape)
