"""PD Workbench: reproduce, localize, bisect and record intermittent PD serving bugs.

The names a notebook starts from; everything else lives in documented submodules
(``workbench.launch``, ``.concurrency``, ``.buffers``, ``.bisect``, ``.trials``, ``.ddmin``,
``.kernels``, ``.findings``, ``.workloads``, ``.queues``). Two namespaces come along:
``plots`` (matplotlib figures for notebook cells), ``investigate`` (reproduction steps:
``rates_table``, ``flagged_requests``, ``kill_storm``, ``wedge_probe``, ``QueueSampler``) and
``sim`` (deterministic simulation: ``run``, ``explore``, ``replay``).
"""

from workbench import investigate, plots, sim
from workbench.bisect import bisect
from workbench.buffers import ReferenceBuffers, diff_against_reference, dump_buffers, load_dump
from workbench.concurrency import inject_concurrency
from workbench.findings import read_findings, record_finding
from workbench.investigate import StopOn, reproduce
from workbench.launch import PDPair, attach, launch_pd_pair
from workbench.series import PatchSeries, bisect_patch_series
from workbench.workloads import list_workloads, run_workload

__all__ = [
    "PDPair", "PatchSeries", "ReferenceBuffers", "StopOn", "attach", "bisect",
    "bisect_patch_series", "diff_against_reference", "dump_buffers", "inject_concurrency",
    "investigate", "launch_pd_pair", "list_workloads", "load_dump", "plots", "read_findings",
    "record_finding", "reproduce", "run_workload", "sim",
]
