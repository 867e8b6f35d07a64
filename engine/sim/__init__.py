"""Deterministic simulation: the engine's threads under one seeded scheduler with virtual time
(``SimRuntime``, a ``engine.runtime.Runtime``), an in-process transfer layer with NIXL's ordering
(``Fabric``, ``SimEndpoint``) and control plane (``SimBootstrap``); ``workbench.sim`` runs
workloads on them."""

from engine.sim.bootstrap import SimBootstrap
from engine.sim.scheduler import STRATEGIES, Decision, Guided, SimDeadlock, SimRuntime, Strategy
from engine.sim.transfer import Fabric, SimEndpoint

__all__ = ["STRATEGIES", "Decision", "Fabric", "Guided", "SimBootstrap", "SimDeadlock",
           "SimEndpoint", "SimRuntime", "Strategy"]
