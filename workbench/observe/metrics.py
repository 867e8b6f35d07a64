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

from workbench.deploy import Capability, EngineDown, PDPair, lasting, require
from workbench.observe.sampler import PeriodicSampler

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


@dataclass(frozen=True)
class Snapshot:
    """One reading of every prefill and decode server: ``rows`` (``SCHEMA``) and the servers
    whose ``/metrics`` could not be read, each with its error."""

    rows: list[dict]
    unreadable: dict[str, str]


def read_all(pair: PDPair, t_s: float = 0.0, names: set[str] | None = None) -> Snapshot:
    """Every server's samples (only ``names`` when given); a dead server is ``unreadable``."""
    rows, bad = [], {}
    for role, url in _servers(pair):
        try:
            samples = scrape(url)
        except (httpx.HTTPError, ValueError) as exc:
            bad[url] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        rows += [{"t_s": t_s, "role": role, "server": url, "name": s.name,
                  "labels": json.dumps(s.labels, sort_keys=True), "value": s.value}
                 for s in samples if names is None or s.name in names]
    return Snapshot(rows, bad)


def snapshot(pair: PDPair, t_s: float = 0.0, names: set[str] | None = None) -> list[dict]:
    """One row per sample of every readable prefill and decode server."""
    return read_all(pair, t_s, names).rows


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
    """``settled`` only when every server was read and every gauge came back; a server that
    could not be read is in ``unreadable`` (url -> error) and the deployment's deaths and hangs
    are in ``down``."""

    settled: bool
    waited_s: float
    leftovers: tuple[Leftover, ...]
    last: pl.DataFrame  # the final snapshot of the drain gauges
    unreadable: dict[str, str] = field(default_factory=dict)
    down: tuple[EngineDown, ...] = ()


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
        snap = read_all(pair, 0.0, {n for n, _ in DRAIN_GAUGES})
        now = frame(snap.rows)
        left = []
        for r in now.iter_rows(named=True):
            want = dict(DRAIN_GAUGES)[r["name"]]
            want = base.get((r["server"], r["name"]), 0.0) if want is None else want
            if r["value"] - want > tolerance:
                left.append(Leftover(r["role"], r["server"], r["name"], r["value"], want))
        waited = time.monotonic() - t0
        down = pair.down()
        stop = bool(lasting(down))  # a dead or hung server will not drain: no point waiting
        if (not left and not snap.unreadable) or waited > timeout_s or stop:
            return DrainReport(not left and not snap.unreadable and not stop, round(waited, 2),
                               tuple(left), now, snap.unreadable, down)
        time.sleep(0.5)


@dataclass(frozen=True)
class TransferStats:
    """The decode's NIXL transfer count and time quantiles (vLLM's ``nixl_xfer_time_seconds``
    histogram); ``error`` says why they could not be read (then ``transfers`` is None)."""

    transfers: float | None
    quantiles: dict[float, float | None]
    error: str = ""


def transfer_stats(pair: PDPair, qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> TransferStats:
    """Reads the first decode's NIXL transfer histogram; a dead decode gives ``error``."""
    require(pair, Capability.METRICS, "transfer_stats")
    try:
        samples = scrape(pair.decode[0].url)
    except (httpx.HTTPError, ValueError) as exc:
        return TransferStats(None, {q: None for q in qs}, f"{type(exc).__name__}: {exc}"[:200])
    name = "vllm:nixl_xfer_time_seconds"
    count = sum(s.value for s in samples if s.name == name + "_count")
    return TransferStats(count, {q: histogram_quantile(samples, name, q) for q in qs})
