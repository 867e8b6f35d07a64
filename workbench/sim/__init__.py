"""Deterministic simulation: a seed is one interleaving of an engine under load, forever.

``run`` plays a ``Workload`` under one seeded schedule, ``explore`` tries many, ``replay`` checks
a run repeats bit for bit, ``trial`` makes deterministic bisection/ddmin trials, ``shrink``
reduces a failing run to the smallest workload that still fails (``workbench.sim.simulation``,
``workbench.sim.shrink``).
"""

from workbench.sim.shrink import ShrinkStep, Shrunk, shrink
from workbench.sim.simulation import (
    SIMULATED,
    Exploration,
    ReplayDiverged,
    SimRun,
    Workload,
    explore,
    replay,
    run,
    trial,
)

__all__ = ["SIMULATED", "Exploration", "ReplayDiverged", "ShrinkStep", "Shrunk", "SimRun",
           "Workload", "explore", "replay", "run", "shrink", "trial"]
