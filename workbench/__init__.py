"""PD Workbench probes: launch PD pairs, inject concurrency, dump and diff buffers, bisect."""

from workbench.bisect import BisectResult, bisect, default_repeats, fixed_repeat_bisect
from workbench.buffers import (
    BufferDiff,
    BufferDump,
    ReferenceBuffers,
    diff_against_reference,
    dump_buffers,
    load_dump,
)
from workbench.concurrency import LoadResult, LoadSummary, inject_concurrency, wilson
from workbench.ddmin import DdminResult, ddmin
from workbench.findings import Finding, FindingNotSupported, read_findings, record_finding
from workbench.kernel_faults import perturb_op
from workbench.kernels import (
    OPS,
    KernelCase,
    KernelComparison,
    compare_kernels,
    kernel_trial,
    make_case,
    mixed_kernel_set,
    model_divergence,
    temporary_kernel_sets,
)
from workbench.launch import (
    EMBEDDED,
    SGLANG,
    VLLM,
    LaunchSpec,
    PDPair,
    TemplateBackend,
    launch_pd_pair,
)
from workbench.process import LaunchError
from workbench.queues import QueueSampler, snapshot_queues
from workbench.series import DEFAULT_SERIES, bisect_patch_series, series_candidates
from workbench.trials import CachedTrial, Trial, TrialStore
from workbench.workloads import Workload, list_workloads, load_workload, run_workload

__all__ = [
    "DEFAULT_SERIES", "EMBEDDED", "SGLANG", "VLLM", "BisectResult", "BufferDiff", "BufferDump",
    "CachedTrial", "DdminResult", "LaunchError", "LaunchSpec", "LoadResult", "LoadSummary",
    "PDPair", "QueueSampler", "ReferenceBuffers", "TemplateBackend", "Trial", "TrialStore",
    "bisect", "bisect_patch_series", "ddmin", "default_repeats", "diff_against_reference",
    "dump_buffers",
    "fixed_repeat_bisect", "inject_concurrency", "launch_pd_pair", "load_dump",
    "series_candidates", "snapshot_queues", "wilson",
    "OPS", "KernelCase", "KernelComparison", "compare_kernels", "kernel_trial", "make_case",
    "mixed_kernel_set", "model_divergence", "perturb_op", "temporary_kernel_sets",
    "Finding", "FindingNotSupported", "read_findings", "record_finding",
    "Workload", "list_workloads", "load_workload", "run_workload",
]
