"""Load on a deployment: seeded agentic sessions judged request by request, load shapes and
named workloads, client kill storms, the wedge probe and the solo (one-at-a-time) reference.

Invariant: a load is a pure function of its seed and shape up to the engine's answers; the same
seed plays the same sessions, the same kills and the same timings."""

from workbench.drive.concurrency import LoadResult, inject_concurrency, run_sync, wilson
from workbench.drive.kills import kill_storm, wedge_probe
from workbench.drive.load import LoadConfig, RequestRecord
from workbench.drive.modes import MODE_ORDER, MODES, Axis, Mode, cell_of, plan, with_modes
from workbench.drive.replay import Replay, replay_alone
from workbench.drive.shapes import SHAPES, SWEEP_ORDER, Shape, shape_of
from workbench.drive.solo import SoloReport, solo_reference
from workbench.drive.traffic import Traffic, TrafficRequest, play, traffic_of
from workbench.drive.workloads import list_workloads, run_workload

__all__ = ["MODES", "MODE_ORDER", "SHAPES", "SWEEP_ORDER", "Axis", "LoadConfig", "LoadResult",
           "Mode", "Replay", "RequestRecord", "Shape", "SoloReport", "Traffic", "TrafficRequest",
           "cell_of", "inject_concurrency", "kill_storm", "list_workloads", "plan", "play",
           "replay_alone", "run_sync", "run_workload", "shape_of", "solo_reference",
           "traffic_of", "wedge_probe", "wilson", "with_modes"]
