"""Prometheus metrics for the servers and the router, valid for both exposition parsers.

Built on ``prometheus_client`` with one registry per server: every family has HELP and TYPE
once, counters are counters (``*_total``), and a scrape asking for OpenMetrics
(``Accept: application/openmetrics-text``) gets OpenMetrics. Families are declared in
``FAMILIES``; gauges are read from the engine at scrape time (``EngineCollector``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client import exposition as text_format
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics

disable_created_metrics()  # no per-series *_created gauges: one family per metric in both formats
# the text format our bodies follow (every name is a legacy Prometheus name, so 0.0.4 holds)
TEXT_CONTENT_TYPE = text_format.CONTENT_TYPE_PLAIN_0_0_4
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Family:
    help: str
    labels: tuple[str, ...] = ()
    histogram: bool = False


FAMILIES: dict[str, Family] = {
    "requests": Family("requests ended, by status (200 served; 4xx refused; 499 the client "
                       "left; 5xx failed, also when the stream had started)", ("status",)),
    "responses": Family("chat responses, by whether DSML reached content", ("dsml_leaked",)),
    "upstream_errors": Family("router upstream failures", ("role", "server", "reason")),
    "internal_errors": Family("router internal errors"),
    "transfer_bytes": Family("KV bytes the prefill wrote to decodes"),
    "time_to_first_token_seconds": Family("request arrival to first token", histogram=True),
    "inter_token_latency_seconds": Family("mean gap between output tokens, per request",
                                          histogram=True),
    "e2e_request_latency_seconds": Family("request arrival to last token", histogram=True),
    "transfer_seconds": Family("one room's KV transfer, first WRITE posted to all done",
                               histogram=True),
}
SERVER = ("requests", "responses", "transfer_bytes", "time_to_first_token_seconds",
          "inter_token_latency_seconds", "e2e_request_latency_seconds", "transfer_seconds")
ROUTER = ("requests", "upstream_errors", "internal_errors")


class Metrics:
    """A server's metric families (``prefix`` + name); thread-safe."""

    def __init__(self, prefix: str = "pdwb", families: tuple[str, ...] = SERVER,
                 gauges: Callable[[], dict[str, tuple[str, float]]] | None = None) -> None:
        """``families``: names in ``FAMILIES``; ``gauges()``: name -> (help, value), read at
        every scrape."""
        self.prefix = prefix
        self.registry = CollectorRegistry(auto_describe=True)
        self._families: dict[str, Counter | Histogram] = {}
        for name in families:
            fam = FAMILIES[name]
            full = f"{prefix}_{name}"
            self._families[name] = (
                Histogram(full, fam.help, fam.labels, registry=self.registry,
                          buckets=LATENCY_BUCKETS) if fam.histogram
                else Counter(full, fam.help, fam.labels, registry=self.registry))
        if gauges is not None:
            self.registry.register(_GaugeCollector(prefix, gauges))

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Adds ``value`` to counter ``name`` (``KeyError`` for an undeclared family)."""
        fam = self._families[name.removesuffix("_total")]
        (fam.labels(**labels) if labels else fam).inc(value)

    def observe(self, name: str, value: float) -> None:
        self._families[name].observe(value)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """(body, content type) for a scrape with ``Accept: accept``."""
        if "application/openmetrics-text" in accept:
            return openmetrics.generate_latest(self.registry), openmetrics.CONTENT_TYPE_LATEST
        return text_format.generate_latest(self.registry), TEXT_CONTENT_TYPE


class _GaugeCollector:
    def __init__(self, prefix: str, read: Callable[[], dict[str, tuple[str, float]]]) -> None:
        self.prefix, self.read = prefix, read

    def describe(self) -> list:
        return []

    def collect(self):
        for name, (help_, value) in sorted(self.read().items()):
            full = f"{self.prefix}_{name}"
            if name.endswith("_total"):
                yield CounterMetricFamily(full.removesuffix("_total"), help_, value=value)
            else:
                yield GaugeMetricFamily(full, help_, value=value)


def engine_gauges(engine) -> dict[str, tuple[str, float]]:
    """The engine's gauges and monotone counts (``*_total``), read without the engine lock."""
    sched, stats = engine.scheduler, engine.stats
    out = {
        "running_requests": ("requests decoding", len(sched.running)),
        "waiting_requests": ("requests waiting for a prefill slot", len(sched.waiting)),
        "free_pages": ("KV pages free", engine.allocator.num_free),
        "total_pages": ("KV pages in the pool", engine.allocator.num_pages),
        "prefix_cache_pages": ("KV pages held by the prefix cache",
                               engine.cache.num_pages if engine.cache else 0),
        "engine_steps_total": ("engine steps run", stats.steps),
        "prompt_tokens_total": ("prompt tokens admitted", stats.prompt_tokens),
        "generated_tokens_total": ("tokens generated", stats.generated_tokens),
        "cached_prompt_tokens_total": ("prompt tokens served from the prefix cache",
                                       stats.cached_tokens),
        "engine_busy_seconds_total": ("seconds the engine spent in steps",
                                      round(stats.busy_seconds, 6)),
    }
    for queue, size in getattr(engine, "queue_sizes", dict)().items():
        out[f"{queue}_queue_size"] = (f"rooms in the {queue} queue", size)
    return out
