"""A deployment under agentic load, then a kill storm and a drain, as one call (notebook 06).

``run_storm(pair, cfg)`` runs the stages in order: load with metrics sampled, tool-call table,
solo reference, kill storm, drain check, fresh-request probe, NIXL transfer times. Before each
stage it asks the pair's watch; once a process has died (or hangs) the remaining stages are
skipped with the reason, and the report carries the observations instead of an exception.
``launch_and_run`` also turns a launch that failed into a report. ``findings(report)`` gives the
claims the measurements support, the deployment's health first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from workbench.deploy import EngineDied, EngineDown, LaunchError, PDPair, lasting, launch_pd_pair
from workbench.drive import (
    LoadResult,
    SoloReport,
    inject_concurrency,
    kill_storm,
    solo_reference,
    wedge_probe,
)
from workbench.judge import FindingDraft
from workbench.observe.metrics import (
    DrainReport,
    MetricsSampler,
    TransferStats,
    drain_check,
    frame,
    gauges,
    transfer_stats,
)

WATCH = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
         "vllm:nixl_xfer_time_seconds_count")
XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"
STALL_S = 1.0  # a transfer-time p90 above this is reported as a stall


@dataclass(frozen=True)
class StormConfig:
    sessions: int = 16
    turns: int = 2
    kill_fraction: float = 0.25
    storm: int = 24
    seed: int = 0


@dataclass
class StormReport:
    """What was measured; a stage that did not run is ``None`` and named in ``skipped`` with
    the reason. ``down`` holds every death and hang the watch saw; ``series_t0`` is the wall
    time (epoch) of the metrics series' ``t_s = 0``."""

    config: StormConfig
    startup_s: float | None = None
    launch_error: str = ""
    load: LoadResult | None = None
    series: pl.DataFrame = field(default_factory=lambda: frame([]))
    series_t0: float = 0.0
    tool_table: pl.DataFrame | None = None
    solo: SoloReport | None = None
    killed: int | None = None
    drain: DrainReport | None = None
    served_after: bool | None = None
    transfers: TransferStats | None = None
    down: tuple[EngineDown, ...] = ()
    processes: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)  # stage -> wall time it ended

    def clean(self, stage: str) -> bool:
        """True when ``stage`` ran and nothing died or hung before it ended."""
        return stage in self.ended and not any(o.since <= self.ended[stage]
                                               for o in lasting(self.down))

    def transfers_before(self, t: float) -> float | None:
        """NIXL transfers the decode had counted by wall time ``t`` (from the sampled series)."""
        return transfers_before(self.series, self.series_t0, t)


def transfers_before(series: pl.DataFrame, t0: float, t: float) -> float | None:
    """The decode's NIXL transfer count at wall time ``t`` in a ``MetricsSampler`` series whose
    ``t_s = 0`` is wall time ``t0``; None when nothing was sampled."""
    if not len(series):
        return None
    s = series.filter((pl.col("name") == XFER_COUNT) & (pl.col("role") == "decode")
                      & (pl.col("t_s") <= t - t0))
    return float(s.sort("t_s")["value"][-1]) if len(s) else 0.0


def launch_and_run(cfg: StormConfig, log_dir: str | Path, backend: str = "vllm") -> StormReport:
    """Launches a pair (``backend``), runs ``run_storm`` and closes it; a failed launch is a
    report with ``launch_error``."""
    t0 = time.monotonic()
    try:
        pair = launch_pd_pair(backend=backend, seed=cfg.seed, log_dir=log_dir)
    except LaunchError as exc:
        return StormReport(cfg, launch_error=str(exc)[-3000:],
                           skipped={"everything": "the deployment did not start"})
    startup_s = round(time.monotonic() - t0, 1)
    with pair:
        report = run_storm(pair, cfg)
    report.startup_s = startup_s
    return report


def run_storm(pair: PDPair, cfg: StormConfig) -> StormReport:
    """Runs every stage on ``pair`` while its processes live (see the module's docstring)."""
    report = StormReport(cfg, processes=len(pair.servers()))
    for stage in (_load, _solo, _storm, _transfers):
        name = stage.__name__.strip("_")
        reason = _down_reason(pair)
        if reason:
            report.skipped[name] = reason
            continue
        stage(pair, report)
        report.ended[name] = time.time()
    report.down = pair.down()
    return report


def _down_reason(pair: PDPair) -> str:
    down = lasting(pair.down())
    return "; ".join(o.describe() for o in down)


def _load(pair: PDPair, report: StormReport) -> None:
    cfg = report.config
    with MetricsSampler(pair, interval_s=0.5, names=set(WATCH)) as sampler:
        report.series_t0 = time.time()
        report.load = inject_concurrency(pair, sessions=cfg.sessions, turns=cfg.turns,
                                         kill_fraction=cfg.kill_fraction, seed=cfg.seed,
                                         progress=False)
    report.series = sampler.frame()
    calls = report.load.requests.filter((pl.col("kind") == "call")
                                        & pl.col("v_leaked").is_not_null())
    report.tool_table = calls.select(
        pl.len().alias("call_requests"), pl.col("v_well_formed").sum().alias("well_formed"),
        pl.col("v_tool_ok").sum().alias("right_tool"),
        pl.col("v_args_ok").sum().alias("right_args"),
        pl.col("v_leaked").sum().alias("dsml_leaked"), pl.col("v_dropped").sum().alias("dropped"))


def _solo(pair: PDPair, report: StormReport) -> None:
    report.solo = solo_reference(pair, report.load, repeats=2, progress=False)


def _storm(pair: PDPair, report: StormReport) -> None:
    before = gauges(pair)
    report.killed = kill_storm(pair, n=report.config.storm, kill_at_s=0.2,
                                           seed=report.config.seed, max_tokens=160)
    report.drain = drain_check(pair, before, timeout_s=30)
    report.served_after = wedge_probe(pair, timeout_s=60)


def _transfers(pair: PDPair, report: StormReport) -> None:
    report.transfers = transfer_stats(pair)


def findings(report: StormReport) -> list[FindingDraft]:
    """The claims ``report`` supports: the deployment's health, then each stage that ran with
    every process alive (a stage a death cut short supports no claim about the engine)."""
    out = [_health(report)]
    if report.clean("load") and report.tool_table is not None:
        out.append(_tool_calls(report))
    if report.clean("solo") and report.solo is not None:
        out.append(_solo_claim(report))
    if report.clean("storm") and report.drain is not None:
        out.append(_drain_claim(report))
    if report.clean("transfers") and report.transfers is not None \
            and report.transfers.transfers:
        out.append(_transfer_claim(report))
    return out


def _health(report: StormReport) -> FindingDraft:
    if report.launch_error:
        return FindingDraft("The deployment did not start", {"launch_failed_recorded": True},
                            {"error": report.launch_error})
    died = [o for o in report.down if isinstance(o, EngineDied)]
    if not report.down:
        return FindingDraft(f"Every process of the deployment stayed up and answered its health "
                            f"route through the run ({report.processes} servers watched)",
                            {"no_deaths_or_hangs": True}, {"processes": report.processes})
    first = died[0] if died else report.down[0]
    xfers = report.transfers_before(first.since)
    title = first.describe() + (f", after {xfers:.0f} NIXL transfers" if xfers is not None
                                else "")
    complete = all(o.process and o.at and (not isinstance(o, EngineDied)
                                           or o.signal or o.exit_code is not None)
                   for o in report.down)
    evidence = {"observations": [_evidence(o) for o in report.down],
                "transfers_before": xfers, "skipped": report.skipped}
    return FindingDraft(title, {"death_recorded_with_process_signal_and_time": complete},
                        evidence)


def _evidence(o: EngineDown) -> dict:
    out = {"kind": o.kind, "describe": o.describe(), "process": o.process, "at": o.at,
           "in_flight": o.in_flight}
    if isinstance(o, EngineDied):
        out.update(signal=o.signal, exit_code=o.exit_code, pid=o.pid, stack=o.stack[:2000],
                   log_tail=list(o.log_tail[-12:]), log=o.log_path)
    return out


def _tool_calls(report: StormReport) -> FindingDraft:
    t = report.tool_table.row(0, named=True)
    n, well, cfg = t["call_requests"], t["well_formed"], report.config
    evidence = {**t, "startup_s": report.startup_s}
    if well >= 0.95 * n:
        return FindingDraft(f"vLLM's DeepSeek-V3.2 parser returned well-formed tool calls for "
                            f"{well}/{n} call requests under {cfg.sessions} concurrent sessions "
                            f"with kills", {"well_formed_at_least_95pct": True}, evidence)
    return FindingDraft(f"vLLM returned malformed tool calls under load: {n - well}/{n}",
                        {"malformed_calls_seen": well < n}, evidence)


def _solo_claim(report: StormReport) -> FindingDraft:
    s = report.solo
    evidence = {"prompts": s.prompts, "judged": s.judged, "mismatches": s.mismatches,
                "baseline": [s.baseline_mismatches, s.baseline_runs], "failed": s.failed}
    if s.beyond_baseline:
        return FindingDraft(f"Responses under load differ from solo runs beyond the "
                            f"concurrency-1 baseline: {s.mismatches}/{s.judged}",
                            {"beyond_baseline": True}, evidence)
    return FindingDraft(f"Responses under load match solo runs within nondeterminism: "
                        f"{s.mismatches}/{s.judged} differ, baseline {s.baseline_mismatches}/"
                        f"{s.baseline_runs}", {"within_baseline": True, "judged_every_completion":
                                               s.judged == report.load.summary.completed},
                        evidence)


def _drain_claim(report: StormReport) -> FindingDraft:
    d = report.drain
    evidence = {"killed": report.killed, "waited_s": d.waited_s,
                "leftovers": [vars(x) for x in d.leftovers], "unreadable": d.unreadable}
    if d.settled and report.served_after:
        return FindingDraft(f"After a kill storm ({report.killed} clients cut) vLLM drained: "
                            f"running and waiting back to 0, KV usage at baseline within "
                            f"{d.waited_s} s, fresh requests served",
                            {"settled": True, "serves_after": True}, evidence)
    return FindingDraft(f"After a kill storm vLLM did not drain: {len(d.leftovers)} gauges "
                        f"stayed, fresh request served: {report.served_after}",
                        {"left_something": bool(d.leftovers) or not report.served_after
                         or bool(d.unreadable)}, evidence)


def _transfer_claim(report: StormReport) -> FindingDraft:
    x = report.transfers
    p50, p90 = x.quantiles.get(0.5), x.quantiles.get(0.9)
    evidence = {"xfer_time_s": {str(q): v for q, v in x.quantiles.items()},
                "transfers": x.transfers}
    if p90 is None:
        title = f"vLLM counted {x.transfers:.0f} NIXL transfers but no transfer times"
    elif p90 > STALL_S:
        title = (f"vLLM's NIXL transfers stall on loopback: p90 {p90:.1f} s per transfer "
                 f"(p50 {p50:.3f} s) over {x.transfers:.0f} transfers of < 1 MB")
    else:
        title = (f"vLLM's NIXL transfers are fast on loopback: p90 {p90:.3f} s over "
                 f"{x.transfers:.0f} transfers")
    return FindingDraft(title, {"transfers_measured": p90 is not None}, evidence)
