"""Deterministic simulation: a seed is one interleaving of an engine under load, forever.

``run`` plays a ``Workload`` under one seeded schedule, ``explore`` tries many, ``replay`` checks
a run repeats bit for bit, ``trial`` makes deterministic bisection/ddmin trials, ``shrink``
reduces a failing run to the smallest workload and the fewest preemptions that still fail
(``shrink_schedule``: the schedule alone) (``workbench.sim.simulation``,
``workbench.sim.shrink``). ``Workload(pd=True)`` simulates a PD pair (``workbench.sim.pd``).
"""

from workbench.sim.shrink import ShrinkStep, Shrunk, shrink, shrink_schedule
from workbench.sim.simulation import (
    Exploration,
    ReplayDiverged,
    explore,
    replay,
    run,
    trial,
)
from workbench.sim.workload import SIMULATED, SIMULATED_PD, SimEvidence, SimRun, Workload

__all__ = ["SIMULATED", "SIMULATED_PD", "Exploration", "ReplayDiverged", "ShrinkStep", "Shrunk",
           "SimEvidence", "SimRun", "Workload", "explore", "replay", "run", "shrink",
           "shrink_schedule", "trial"]
