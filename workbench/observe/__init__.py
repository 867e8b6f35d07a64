"""What a deployment shows from outside: Prometheus metrics and queue gauges sampled over time,
debug buffer dumps compared with the reference, the evidence a burst leaves (leftover pages,
stale HiCache accesses, drain) and the localization of a divergence to a stage.

Invariant: observing never changes what the engine computes; a probe of a dead engine returns a
result that says so (``EngineDownError`` is the one exception, for dumps that cannot exist)."""

from workbench.observe.buffers import (
    BufferDump,
    EngineDownError,
    ReferenceBuffers,
    diff_against_reference,
    dump_buffers,
    load_dump,
)
from workbench.observe.evidence import Drain, Evidence, collect, settle
from workbench.observe.localize import Localization, Stage, localize
from workbench.observe.metrics import (
    DrainReport,
    MetricsSampler,
    TransferStats,
    drain_check,
    gauges,
    scrape,
    transfer_stats,
)
from workbench.observe.queues import QueueSampler

__all__ = ["BufferDump", "Drain", "DrainReport", "EngineDownError", "Evidence", "Localization",
           "MetricsSampler", "QueueSampler", "ReferenceBuffers", "Stage", "TransferStats",
           "collect", "diff_against_reference", "drain_check", "dump_buffers", "gauges",
           "load_dump", "localize", "scrape", "settle", "transfer_stats"]
