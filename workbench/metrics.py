"""Observation from Prometheus ``/metrics``: for engines without our debug routes (vLLM).

``scrape(url)`` parses one exposition with ``prometheus_client``'s parser into ``Sample`` rows.
``MetricsSampler(pair)`` samples every server of a pair on a thread into a polars time series
(``t_s, role, server, name, labels, value``). ``drain_check(pair, baseline)`` waits for the
servers to settle after load and reports every gauge that did not return to its baseline: running
and waiting requests to 0, KV-cache usage to where it started.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import httpx
import polars as pl
from prometheus_client.parser import text_string_to_metric_families

from workbench.backends import Capability, require
from workbench.pair import PDPair
from workbench.sampler import PeriodicSampler

log = logging.getLogger(__name__)
SCHEMA = {"t_s": pl.Float64, "role": pl.Utf8, "server": pl.Utf8, "name": pl.Utf8,
          "labels": pl.Utf8, "value": pl.Float64}

# Gauges that must come back after a drain: (metric name, value it must return to; None: to the
# baseline sampled before the load). vLLM 0.32 names, per server.
DRAIN_GAUGES: tuple[tuple[str, float | None], ...] = (
    ("vllm:num_requests_running", 0.0),
    ("vllm:num_requests_waiting", 0.0),
    ("vllm:kv_cache_usage_perc", None),
)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def scrape(url: str, timeout_s: float = 5.0) -> list[Sample]:
    """Every sample of ``url``/metrics (histogram buckets included), parsed by prometheus_client."""
    text = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout_s).text
    return [Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def histogram_quantile(samples: list[Sample], name: str, q: float) -> float | None:
    """Prometheus' ``histogram_quantile``: the ``q`` quantile of histogram ``name`` from its
    cumulative ``name_bucket`` samples (summed over other labels), interpolated linearly inside
    the bucket; None when it has no observations. The +Inf bucket answers its lower bound."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    cum: dict[float, float] = {}
    for s in samples:
        if s.name == name + "_bucket":
            le = float(s.labels["le"])
            cum[le] = cum.get(le, 0.0) + s.value
    bounds = sorted(cum)
    if not bounds or cum[bounds[-1]] == 0:
        return None
    rank, lo, below = q * cum[bounds[-1]], 0.0, 0.0
    for le in bounds:
        if cum[le] >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * ((rank - below) / (cum[le] - below) if cum[le] > below
                                     else 0.0)
        lo, below = le, cum[le]
    return lo


def _servers(pair: PDPair) -> list[tuple[str, str]]:
    return [*(("prefill", s.url) for s in pair.prefill), *(("decode", s.url) for s in pair.decode)]


def snapshot(pair: PDPair, t_s: float = 0.0, names: set[str] | None = None) -> list[dict]:
    """One row per sample of every prefill and decode server (only ``names`` when given)."""
    rows = []
    for role, url in _servers(pair):
        try:
            samples = scrape(url)
        except httpx.HTTPError as exc:
            log.warning("metrics of %s %s unreadable: %s", role, url, exc)
            continue
        rows += [{"t_s": t_s, "role": role, "server": url, "name": s.name,
                  "labels": json.dumps(s.labels, sort_keys=True), "value": s.value}
                 for s in samples if names is None or s.name in names]
    return rows


def frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=SCHEMA)


@dataclass(eq=False)
class MetricsSampler(PeriodicSampler):
    """Samples ``pair``'s metrics every ``interval_s`` on a thread (``with MetricsSampler(pair)``);
    ``frame()`` returns the series. ``names`` limits what is kept (default: everything)."""

    pair: PDPair
    interval_s: float = field(default=0.5, kw_only=True)
    names: set[str] | None = field(default=None, kw_only=True)

    def start(self) -> None:
        require(self.pair, Capability.METRICS, "MetricsSampler")

    def sample(self, t_s: float) -> list[dict]:
        return snapshot(self.pair, t_s, self.names)

    def frame(self) -> pl.DataFrame:
        return frame(list(self.rows))


@dataclass(frozen=True)
class Leftover:
    """A gauge that did not settle: where it stood, where it had to return."""

    role: str
    server: str
    name: str
    value: float
    expected: float


@dataclass(frozen=True)
class DrainReport:
    settled: bool
    waited_s: float
    leftovers: tuple[Leftover, ...]
    last: pl.DataFrame  # the final snapshot of the drain gauges


def gauges(pair: PDPair) -> pl.DataFrame:
    """The drain gauges of every server now (``baseline`` for ``drain_check``)."""
    require(pair, Capability.METRICS, "gauges")
    return frame(snapshot(pair, 0.0, {n for n, _ in DRAIN_GAUGES}))


def drain_check(pair: PDPair, baseline: pl.DataFrame, timeout_s: float = 30.0,
                tolerance: float = 1e-9) -> DrainReport:
    """Polls until every drain gauge is back (running/waiting 0, KV usage at or below
    ``baseline``) or ``timeout_s`` passes; reports each gauge that stayed above. Usage below the
    baseline is settled: blocks held at baseline (a prefill's KV kept for a decode's pull) may be
    freed meanwhile."""
    require(pair, Capability.METRICS, "drain_check")
    base = {(r["server"], r["name"]): r["value"] for r in baseline.iter_rows(named=True)}
    t0 = time.monotonic()
    while True:
        now = gauges(pair)
        left = []
        for r in now.iter_rows(named=True):
            want = dict(DRAIN_GAUGES)[r["name"]]
            want = base.get((r["server"], r["name"]), 0.0) if want is None else want
            if r["value"] - want > tolerance:
                left.append(Leftover(r["role"], r["server"], r["name"], r["value"], want))
        waited = time.monotonic() - t0
        if not left or waited > timeout_s:
            return DrainReport(not left, round(waited, 2), tuple(left), now)
        time.sleep(0.5)
