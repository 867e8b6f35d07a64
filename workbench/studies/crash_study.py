"""How often does a deployment lose a process, and under what conditions? (notebook 08)

``run_study(["quiet", "busy"], pairs=12)`` launches fresh pairs one after another, each under a
named ``Condition`` (a busy neighbour process, NIXL's stock busy poll, a capped CPU ISA), plays
notebook 06's load (seeded by the pair's index) and records one ``PairOutcome`` per pair: whether
a process died or hung, which, with what signal, after how many NIXL transfers, and the host's
CPU model and ISA flags (machines differ: the death this study was built for was seen on an
AMX-capable Intel guest). Rows are appended to a JSON-lines file as they finish, so a study
stopped midway keeps what it measured; ``rates(rows)`` gives each condition's death rate with its
95% Wilson interval.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import polars as pl

from engine.registry import Registry
from workbench.deploy import EngineDied, LaunchError, lasting, launch_pd_pair
from workbench.deploy.isa import isa_probe, worker_amx
from workbench.deploy.vllm import VllmOptions
from workbench.drive import inject_concurrency, wilson
from workbench.observe import MetricsSampler, transfer_stats
from workbench.studies.storm import XFER_COUNT, transfers_before

log = logging.getLogger(__name__)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Condition:
    """One arm of the study: ``busy_cores`` neighbour processes spin while the pair lives;
    ``nixl_delay_us`` paces NIXL's progress thread (0: stock busy poll); ``env`` is added to
    the servers' environment (ISA caps); ``extra_args`` go to both vLLM servers;
    ``amx_grant``: the site hook asks for AMX tile state (off: the SIGILL can be studied)."""

    name: str
    description: str
    busy_cores: int = 0
    nixl_delay_us: int = 1000
    env: tuple[tuple[str, str], ...] = ()
    extra_args: tuple[str, ...] = ()
    amx_grant: bool = True


CONDITIONS: Registry[Condition] = Registry("condition")
CONDITIONS.register("quiet", Condition("quiet", "nothing else runs; NIXL paced (1000 us)"))
CONDITIONS.register("busy", Condition("busy", "a neighbour process keeps one core busy",
                                      busy_cores=1))
CONDITIONS.register("stock", Condition("stock", "NIXL's stock busy-polling progress thread",
                                       nixl_delay_us=0))
CONDITIONS.register("busy-stock", Condition("busy-stock", "a busy neighbour and stock NIXL",
                                            busy_cores=1, nixl_delay_us=0))
CONDITIONS.register("ungranted", Condition(
    "ungranted", "quiet, without the site hook's AMX tile-state request (vLLM as shipped)",
    amx_grant=False))
CONDITIONS.register("isa-capped", Condition(
    "isa-capped", "oneDNN and ATen capped at AVX2, float32 (vLLM's CPU attention picks its AMX "
    "kernel only for bf16)", env=(("ONEDNN_MAX_CPU_ISA", "AVX2"), ("ATEN_CPU_CAPABILITY", "avx2")),
    extra_args=("--dtype", "float32")))


@dataclass(frozen=True)
class Host:
    """The machine a pair ran on: CPU model, vendor, which ISA flags it reports, kernel."""

    cpu: str
    vendor: str
    flags: tuple[str, ...]
    kernel: str
    cores: int


def host() -> Host:
    """This machine, read from ``/proc/cpuinfo`` (only the ``ISA_FLAGS`` it has are kept)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(info.get("flags", "").split())
    return Host(info.get("model name", platform.processor()), info.get("vendor_id", ""),
                tuple(f for f in ISA_FLAGS if f in flags), platform.release(),
                len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class PairOutcome:
    """One fresh pair: ``died`` when a process of it died (``process``, ``signal``,
    ``after_launch_s``, ``transfers_before``: the decode's NIXL transfers before the death,
    ``in_flight``); ``hung`` when one stopped answering; ``launch_error`` when it never came
    up; ``requests``/``errors`` of its load. ``amx_grant``: the site hook asked for AMX tile
    state; ``workers_permitted``: each worker's permission read inside it after launch (None:
    unknown); ``predicted_sigill``: the host's bf16 attention kernel is AMX and some worker does
    not hold the permission (``isa.WorkerAmx``)."""

    condition: str
    index: int
    seed: int
    host: Host
    started_at: float
    startup_s: float | None = None
    launch_error: str = ""
    died: bool = False
    hung: bool = False
    process: str = ""
    signal: str | None = None
    after_launch_s: float | None = None
    transfers_before: float | None = None
    in_flight: int | None = None
    requests: int = 0
    errors: int = 0
    transfers: float | None = None
    xfer_p50_s: float | None = None
    xfer_p90_s: float | None = None
    stack: str = ""
    log_tail: tuple[str, ...] = field(default_factory=tuple)
    amx_grant: bool = True
    attn_isa: str = ""
    workers_permitted: tuple[bool | None, ...] = ()
    predicted_sigill: bool | None = None

    @property
    def sigill(self) -> bool:
        return self.died and self.signal == "SIGILL"


@contextmanager
def neighbours(cores: int) -> Iterator[None]:
    """``cores`` processes spinning a core each for the duration (the busy neighbour)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run_pair(cond: Condition, index: int, log_dir: Path, sessions: int = 8,
             attn_isa: str = "") -> PairOutcome:
    """Launches one fresh vLLM pair under ``cond``, reads each worker's AMX permission, plays
    the load, records what happened. ``attn_isa``: the bf16 attention kernel vLLM picks on this
    host (``IsaProbe.attn_isa_bf16``; empty: no prediction)."""
    seed, t0 = index, time.time()
    opts = VllmOptions(nixl_progress_delay_us=cond.nixl_delay_us, extra_args=cond.extra_args,
                       amx_grant=cond.amx_grant)
    base = PairOutcome(cond.name, index, seed, host(), t0, amx_grant=cond.amx_grant,
                       attn_isa=attn_isa)
    with neighbours(cond.busy_cores), _env(dict(cond.env)):
        try:
            pair = launch_pd_pair(backend="vllm", seed=seed, log_dir=log_dir, vllm_options=opts)
        except LaunchError as exc:
            return replace(base, launch_error=str(exc)[-2000:])
        with pair:
            startup = round(time.time() - t0, 1)
            base = _with_prediction(base, pair)
            with MetricsSampler(pair, interval_s=0.5, names={XFER_COUNT}) as sampler:
                series_t0 = time.time()
                load = inject_concurrency(pair, sessions=sessions, turns=2, kill_fraction=0.25,
                                          seed=seed, progress=False, request_timeout_s=120)
            xfers = transfer_stats(pair)
            down = lasting(pair.down())
    out = replace(base, startup_s=startup, requests=load.summary.requests,
                  errors=load.summary.errors, transfers=xfers.transfers,
                  xfer_p50_s=xfers.quantiles.get(0.5), xfer_p90_s=xfers.quantiles.get(0.9))
    died = [o for o in down if isinstance(o, EngineDied)]
    if not down:
        return out
    first = died[0] if died else down[0]
    return replace(out, died=bool(died), hung=not died, process=first.process,
                    signal=getattr(first, "signal", None), after_launch_s=first.after_launch_s,
                    transfers_before=transfers_before(sampler.frame(), series_t0, first.since),
                    in_flight=first.in_flight, stack=getattr(first, "stack", "")[:3000],
                    log_tail=tuple(getattr(first, "log_tail", ())[-15:]))


def _with_prediction(base: PairOutcome, pair) -> PairOutcome:
    servers = {s.name: s.url for s in (*pair.prefill, *pair.decode)}
    permitted = tuple(w.permitted for w in worker_amx(servers))
    if not base.attn_isa:
        return replace(base, workers_permitted=permitted)
    at_risk = base.attn_isa == "amx" and (not permitted or any(p is not True for p in permitted))
    return replace(base, workers_permitted=permitted, predicted_sigill=at_risk)


OUTCOMES = "outcomes.jsonl"  # one PairOutcome per line (``read_outcomes``)


def outcomes_path(log_dir: str | Path) -> Path:
    """Where a study run under ``log_dir`` appends its outcomes."""
    return Path(log_dir) / OUTCOMES


def run_study(conditions: list[str], pairs: int, out: str | Path, log_root: str | Path,
              start: int = 0) -> list[PairOutcome]:
    """Runs ``pairs`` fresh pairs per condition, interleaving the conditions (pair ``i`` of
    every condition before pair ``i + 1``, so drift over time hits every arm alike); appends
    each outcome to ``out`` as it finishes."""
    conds = [CONDITIONS.get(c) for c in conditions]  # unknown names list the valid ones
    isa = isa_probe().attn_isa_bf16
    rows = []
    for i in range(start, start + pairs):
        for cond in conds:
            row = run_pair(cond, i, Path(log_root) / f"{cond.name}-{i}", attn_isa=isa)
            log.info("%s pair %d: died=%s %s %s", cond.name, i, row.died, row.process, row.signal)
            with open(out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(asdict(row)) + "\n")
            rows.append(row)
    return rows


def read_outcomes(path: str | Path) -> pl.DataFrame:
    """The outcomes recorded in ``path`` (one row per pair; ``host`` flattened to columns)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        h = r.pop("host")
        r.pop("log_tail", None)
        permitted = r.pop("workers_permitted", None)
        if permitted is not None:
            r["workers_unpermitted"] = sum(p is not True for p in permitted)
        rows.append({**r, "cpu": h["cpu"], "vendor": h["vendor"], "flags": " ".join(h["flags"]),
                     "cores": h["cores"]})
    return pl.DataFrame(rows, infer_schema_length=None)


def rates(outcomes: pl.DataFrame) -> pl.DataFrame:
    """Per condition and host CPU: pairs, deaths, hangs, launch failures, and the death ``rate``
    with its 95% Wilson interval (``lo``, ``hi``: the columns of every rates table)."""
    out = []
    for (cond, cpu), g in outcomes.group_by(["condition", "cpu"], maintain_order=True):
        n, k = len(g), int(g["died"].sum())
        lo, hi = wilson(k, n)
        out.append({"condition": cond, "cpu": cpu, "pairs": n, "died": k,
                    "hung": int(g["hung"].sum()),
                    "launch_failed": int((g["launch_error"] != "").sum()),
                    "rate": k / n if n else 0.0, "lo": lo, "hi": hi})
    return pl.DataFrame(out)


@contextmanager
def _env(extra: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m workbench.studies.crash_study")
    ap.add_argument("--conditions", nargs="+", default=["quiet", "busy", "busy-stock"],
                    help=f"any of {CONDITIONS.names()}")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--start", type=int, default=0, help="first pair index (resume)")
    ap.add_argument("--out", default="runs/crash_study.jsonl")
    ap.add_argument("--logs", default="runs/crash_study")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_study(args.conditions, args.pairs, args.out, args.logs, args.start)
    print(rates(read_outcomes(args.out)))


if __name__ == "__main__":
    main()
