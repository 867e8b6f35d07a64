"""Deterministic simulation: the engine's threads under one seeded scheduler with virtual time
(``SimRuntime``, a ``engine.runtime.Runtime``); ``workbench.sim`` runs workloads on it."""

from engine.sim.scheduler import STRATEGIES, Decision, SimDeadlock, SimRuntime

__all__ = ["STRATEGIES", "Decision", "SimDeadlock", "SimRuntime"]
