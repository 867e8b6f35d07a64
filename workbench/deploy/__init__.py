"""Deployments under test: launch a PD pair (ours, real vLLM, a third-party router) or attach to
one, its server processes, and the watch that turns a death or a hang into an observation.

Invariant: nothing here judges responses; a ``PDPair`` only says what runs and whether it lives.
"""

from workbench.deploy.backends import Capability, MissingCapability, require
from workbench.deploy.isa import IsaProbe, isa_probe
from workbench.deploy.launch import LaunchSpec, attach, launch_pd_pair
from workbench.deploy.pair import PDPair, client_headers
from workbench.deploy.process import LaunchError, ServerProcess, die_with_this_process
from workbench.deploy.vitals import EngineDied, EngineDown, EngineHung, EngineUnreachable, lasting
from workbench.deploy.watch import ProcessWatch

__all__ = ["Capability", "EngineDied", "EngineDown", "EngineHung", "EngineUnreachable",
           "IsaProbe", "LaunchError", "LaunchSpec", "MissingCapability", "PDPair", "ProcessWatch",
           "ServerProcess", "attach", "client_headers", "die_with_this_process", "isa_probe",
           "lasting", "launch_pd_pair", "require"]
