"""PD Workbench: reproduce, localize, bisect and record intermittent PD serving bugs.

The names a notebook starts from. The rest lives in packages by concern whose imports only
point down ``LAYERS`` (top first; ``tests/test_layout.py`` enforces it):

- ``report``       plots and views for notebook cells (``explore``, ``monitor``), rendering a
                   notebook with its static views and embedded font
- ``studies``      kill storms, vLLM crash studies, kernel comparisons, planted histories
- ``investigate``  reproduce, sweep, bisect (commits, patch series), ``investigate`` an
                   unknown bug end to end (the pipeline; it never calls a study)
- ``sim``          deterministic simulation of the real engine code in one process
- ``drive``        seeded agentic load, shapes and workloads, kill storms, the solo reference
- ``judge``        the independent oracle, verdict rules, symptoms, the findings ledger
- ``observe``      metrics and queue sampling, buffer dumps, evidence, localization
- ``deploy``       launch/attach (ours, real vLLM, SGLang's router), processes, the watch
- ``search``       bisection statistics and the trial store (pure math, no servers)
- ``scale``        where work runs: in process or on Ray (tasks, actors), progress

The engine is reached only through the seams ``ARCHITECTURE.md`` lists (also enforced).
"""

from workbench import investigate, sim
from workbench.deploy import PDPair, attach, launch_pd_pair
from workbench.drive import inject_concurrency, list_workloads, run_workload
from workbench.investigate import PatchSeries, StopOn, bisect_patch_series, reproduce
from workbench.judge import read_findings, record_finding
from workbench.observe import ReferenceBuffers, diff_against_reference, dump_buffers, load_dump
from workbench.report import Monitor, explore, monitor, plots
from workbench.search import bisect

LAYERS = ("cli", "report", "studies", "investigate", "sim", "drive", "judge", "observe", "deploy",
          "search", "scale")

__all__ = [
    "Monitor", "PDPair", "PatchSeries", "ReferenceBuffers", "StopOn", "attach", "bisect",
    "bisect_patch_series", "diff_against_reference", "dump_buffers", "explore",
    "inject_concurrency", "investigate", "launch_pd_pair", "list_workloads", "load_dump",
    "monitor", "plots", "read_findings", "record_finding", "reproduce", "run_workload", "sim",
    "LAYERS",
]
