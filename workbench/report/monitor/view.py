"""The pair monitor: ``monitor(pair)`` shows, about once a second while a load or storm runs, per
role: queue depths, rooms by state, pages free/cached/quarantined, tokens/s and the requests
flagged so far (a vLLM pair: the ``/metrics`` it exposes).

``Monitor`` is also what ``reproduce(..., watch=Monitor())`` takes: it attaches to the pair the
reproduction launches (``watching``) and counts each burst's flags (``record``). ``stop()`` ends
the sampling thread and, in a notebook, replaces the live view by a static figure that stays in
the saved notebook. Its cost on the engine is measured by ``python -m bench.monitor_overhead``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from workbench.deploy import Capability, PDPair
from workbench.observe.sampler import PeriodicSampler
from workbench.report.monitor.data import (
    GENERATED,
    VLLM_GAUGES,
    VLLM_KV,
    Panel,
    RoleSample,
    embedded_sample,
    metrics_sample,
    panel,
    with_rate,
)
from workbench.report.static import View, wrap

log = logging.getLogger(__name__)
_WANTED = {*GENERATED, *VLLM_GAUGES, VLLM_KV}


def wanted_metrics(text: str) -> dict[str, float]:
    """The monitor's few series from a Prometheus exposition, summed over labels (a line scan:
    parsing every histogram would cost the sampling thread more than the reads)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _WANTED:
            try:
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return values


def read_server(client: httpx.Client, pair: PDPair, role: str, srv, t_s: float,
                flagged: int) -> RoleSample:
    """One server's sample over ``client`` (kept alive across ticks): debug routes where the
    backend has them, ``/metrics`` for tokens (and for everything on a vLLM pair)."""
    caps = pair.backend.capabilities
    values = (wanted_metrics(_get(client, srv.url + "/metrics").text)
              if Capability.METRICS in caps else {})
    if Capability.DEBUG_QUEUES not in caps:
        return metrics_sample(t_s, role, srv.url, values, flagged)
    tokens = next((values[n] for n in GENERATED if n in values), None)
    return embedded_sample(t_s, role, srv.url, _get(client, srv.url + "/debug/queues").json(),
                           _get(client, srv.url + "/debug/transfers").json()["rooms"], tokens,
                           flagged)


def _get(client: httpx.Client, url: str) -> httpx.Response:
    r = client.get(url)
    r.raise_for_status()
    return r


@dataclass(eq=False, kw_only=True)
class _Ticks(PeriodicSampler):
    """The monitor's sampling thread: ``observe``'s one sampler implementation; the samples
    themselves are the monitor's (``Monitor.tick``)."""

    monitor: Monitor
    pair: PDPair

    def sample(self, t_s: float) -> list[dict]:
        self.monitor.tick(self.pair, round(t_s, 2))
        self.monitor._refresh()
        return []

    def full(self) -> bool:
        return len(self.monitor.samples) >= self.monitor.max_samples


class Monitor(View):
    """Samples a pair every ``interval_s`` on one thread (``watching(pair)`` or ``start``) and
    draws ``panel()``. ``flagged`` counts what ``record`` was told (the loads' verdicts)."""

    kind = "monitor"

    def __init__(self, interval_s: float = 1.0, max_samples: int = 3600) -> None:
        self.interval_s, self.max_samples = interval_s, max_samples
        self.samples: list[RoleSample] = []
        self.flagged = 0
        self.errors = 0
        self._ticks: _Ticks | None = None
        self._last: dict[str, RoleSample] = {}
        self._live = None
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    def __repr__(self) -> str:
        return f"Monitor({self.panel().ticks} ticks, {self.flagged} flagged)"

    def record(self, burst) -> None:
        """Counts a finished burst's (or load summary's) ``flagged`` requests."""
        self.flagged += int(getattr(burst, "flagged", 0))

    def tick(self, pair: PDPair, t_s: float) -> list[RoleSample]:
        """One sample of every server (an unreadable server is skipped and counted)."""
        servers = [(r, s) for r, group in (("prefill", pair.prefill), ("decode", pair.decode))
                   for s in group]
        with ThreadPoolExecutor(max(1, len(servers))) as pool:  # one slow server delays none
            read = list(pool.map(lambda rs: self._read(pair, *rs, t_s), servers))
        out = []
        for (_, srv), s in zip(servers, read, strict=True):
            if s is not None:
                out.append(with_rate(s, self._last.get(srv.url)))
                self._last[srv.url] = out[-1]
        with self._lock:
            self.samples += out
        return out

    def _read(self, pair: PDPair, role: str, srv, t_s: float) -> RoleSample | None:
        try:
            return read_server(self._client_for(pair), pair, role, srv, t_s, self.flagged)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self.errors += 1
            log.debug("monitor: %s unreadable: %s", srv.url, exc)
            return None

    def _client_for(self, pair: PDPair) -> httpx.Client:
        if self._client is None:
            token = getattr(pair.spec, "debug_token", None)
            self._client = httpx.Client(timeout=10.0, headers={"x-debug-token": token}
                                        if token else {})
        return self._client

    def panel(self) -> Panel:
        with self._lock:
            return panel(list(self.samples))

    def start(self, pair: PDPair) -> Monitor:
        """Starts sampling ``pair`` afresh (and, in a notebook, shows the live view)."""
        if self._ticks is not None:
            raise RuntimeError("this monitor is already running; stop() it first")
        with self._lock:  # one monitor draws one run: a restart starts a fresh picture
            self.samples, self._last, self.flagged, self.errors = [], {}, 0, 0
        self._live = self._show_live()
        self._ticks = _Ticks(interval_s=self.interval_s, monitor=self, pair=pair).__enter__()
        return self

    def stop(self) -> None:
        """Ends sampling; in a notebook the live view gives way to the static figure."""
        ticks, self._ticks = self._ticks, None
        if ticks is not None:
            ticks.__exit__(None, None, None)
            # the last tick after the load: the flags recorded at its end, the drained state
            self.tick(ticks.pair, round(ticks.elapsed(), 2))
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._live is not None:
            from IPython.display import display

            self._live.close()
            self._live = None
            display(self)

    @contextlib.contextmanager
    def watching(self, pair: PDPair):
        """Samples ``pair`` for the duration of the ``with`` block."""
        self.start(pair)
        try:
            yield self
        finally:
            self.stop()

    def _show_live(self):
        from workbench.scale import in_notebook

        if not in_notebook():
            return None
        import ipywidgets as w
        from IPython.display import display

        live = w.HTML(value=self.live_html())
        display(live)
        return live

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.value = self.live_html()

    def live_html(self) -> str:
        from workbench.report.monitor.html import panel_html

        return panel_html(self.panel(), live=True)

    def static_html(self) -> str:
        from workbench.report.monitor.html import panel_html, panel_png
        from workbench.report.static import png_img

        p = self.panel()
        fig = png_img(panel_png(p), "pair monitor") if p.ticks else ""
        return wrap(panel_html(p, live=False) + fig, self.kind)


def monitor(pair: PDPair, interval_s: float = 1.0) -> Monitor:
    """A started ``Monitor`` on a live ``pair``; call ``stop()`` when the load is done."""
    return Monitor(interval_s).start(pair)


__all__ = ["Monitor", "monitor"]
