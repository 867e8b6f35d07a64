"""Studies built on the pipeline, which the pipeline never calls: what the API-feature oracles
measured on a deployment (``api``), kill storms against a
deployment (``storm``), simulated failures confirmed on a real pair (``confirm``), vLLM worker
deaths by condition and their claims (``crash_study``, ``crash_findings``), kernel-set
comparisons and planted kernel faults (``kernels``, ``kernel_faults``), the wedge of a kill
storm against the index-K race (``wedge``), and seeded commit
histories with a planted regression (``zoo``). Each is a module with its own public names;
notebooks and benchmarks import the module."""

from workbench.studies import (
    api,
    confirm,
    crash_findings,
    crash_study,
    kernel_faults,
    kernels,
    storm,
    wedge,
    zoo,
)

__all__ = ["api", "confirm", "crash_findings", "crash_study", "kernel_faults", "kernels", "storm",
           "wedge",
           "zoo"]
