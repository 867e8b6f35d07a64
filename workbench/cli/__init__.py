"""``wb``: the workbench probes for scripted runs, a thin shell over the library calls; results
are written as Parquet. The commands and their flags: ``workbench.cli.parser``."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from engine.cli import parse_overrides
from workbench.cli.flags import given, spec_from_args
from workbench.cli.parser import LOAD_DEFAULTS, build_parser

log = logging.getLogger("wb")


def _pair_from_state(path: str):
    from workbench.deploy import attach

    st = json.loads(Path(path).read_text())
    return attach(st["router"], prefill=st["prefill"], decode=st["decode"],
                  patches=st["patches"], engine=st["engine"], faults=st["faults"],
                  log_dir=st["log_dir"], backend=st.get("backend", "embedded"),
                  model=st.get("model"), debug_token=st.get("debug_token"),
                  client_token=st.get("client_token", ""))


def cmd_up(args) -> None:
    from workbench.deploy import launch_pd_pair

    pair = launch_pd_pair(patches=_names(args.patches), engine=parse_overrides(args.engine),
                          faults=json.loads(args.faults), seed=args.seed, router=args.router,
                          backend=args.backend)
    state = {"router": pair.url, "prefill": [s.url for s in pair.prefill],
             "decode": [s.url for s in pair.decode], "patches": list(pair.spec.patches),
             "engine": pair.spec.engine, "faults": pair.spec.faults, "log_dir": str(pair.log_dir),
             "backend": pair.backend.name, "model": pair.model,
             "debug_token": pair.spec.debug_token, "client_token": pair.client_token}
    Path(args.state).parent.mkdir(parents=True, exist_ok=True)
    # the pair's tokens are in it: readable by its owner only
    fd = os.open(args.state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(state, indent=1))
    log.info("PD pair up at %s; state in %s; Ctrl-C stops it", pair.url, args.state)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait(args.hold_s if args.hold_s > 0 else None)
    except KeyboardInterrupt:
        pass
    finally:
        pair.close()


def load_kwargs(args) -> dict:
    """The load's options: the workload's (or ``LOAD_DEFAULTS``), then the flags given."""
    from workbench.drive.workloads import load_workload

    base = load_workload(args.workload).kwargs() if args.workload else dict(LOAD_DEFAULTS)
    given = {k: getattr(args, k) for k in LOAD_DEFAULTS if getattr(args, k) is not None}
    return {**base, **given}


def cmd_load(args) -> None:
    from workbench.drive import Traffic, inject_concurrency, play, traffic_of

    target = _pair_from_state(args.state) if args.state else args.url
    if args.traffic:
        try:
            traffic = Traffic.read(args.traffic)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"wb load: {exc}") from None
        res = play(target, traffic, oracle=not args.no_oracle)
    else:
        res = inject_concurrency(target, **load_kwargs(args), oracle=not args.no_oracle,
                                 capture_dir=args.capture_dir)
    res.requests.write_parquet(args.out)
    if args.record:
        traffic_of(res).write(args.record)
    log.info("%s -> %s", res.summary, args.out)


def cmd_dump(args) -> None:
    from workbench.observe import diff_against_reference, dump_buffers

    pair = _pair_from_state(args.state)
    dump = dump_buffers(pair, room=args.room, role=args.role)
    dump.save(args.out)
    log.info("dumped %d tensors of %s to %s", len(dump.tensors), dump.source, args.out)
    if args.diff:
        diff = diff_against_reference(dump, pair.spec.engine_config())
        out = Path(args.out).with_suffix(".diff.parquet")
        diff.summary.write_parquet(out)
        log.info("first bad layer %s position %s; diff in %s", diff.first_bad_layer,
                 diff.first_bad_position, out)


def cmd_bisect(args) -> None:
    from workbench.cli.parser import SERIES_SHARED
    from workbench.investigate import BisectSpec, bisect_commits, bisect_patch_series

    if bool(args.series) == hasattr(args, "commits"):
        raise SystemExit("wb bisect: give exactly one of --series A,B,... or --commits GOOD..BAD")
    if args.series:
        series_only = set(vars(args)) & ({f.name for f in dataclasses.fields(BisectSpec)}
                                         - set(SERIES_SHARED))
        if series_only:
            raise SystemExit(f"wb bisect: {', '.join(sorted(series_only))} are for --commits")
        kw = given(args, bisect_patch_series, (*SERIES_SHARED, "sessions"))
        res = bisect_patch_series(_names(args.series), **{"store": BisectSpec.store, **kw})
    else:
        res = bisect_commits(spec_from_args(BisectSpec, args))
    store = res.spec.store if res.spec is not None else getattr(args, "store", BisectSpec.store)
    if store:
        res.history.write_parquet(Path(store).with_suffix(".history.parquet"))
    log.info("%s", res.headline())


def cmd_investigate(args) -> None:
    from workbench.investigate import investigate
    from workbench.investigate.spec import InvestigationSpec
    from workbench.judge import record_drafts

    if args.report:
        from workbench.report import require_report_extra

        require_report_extra("wb investigate --report")
    inv = investigate(spec_from_args(InvestigationSpec, args))
    for f in record_drafts(inv.findings(), replay=inv.replay(), tree=inv.tree,
                           source="wb investigate", ledger=args.ledger):
        log.info("%s", f)
    out = Path(args.reports_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "investigation.txt").write_text(inv.report() + "\n")
    log.info("%s\nwritten to %s", inv.report(), out / "investigation.txt")
    if args.report:
        _notebook_report(inv.save(Path(inv.spec.runs_dir) / RESULT_FILE), out)


RESULT_FILE = "investigation.pickle"


def _notebook_report(result: Path, out: Path) -> None:
    """Notebook 05 rendering the investigation saved at ``result`` (it does not run it again)."""
    from workbench.report.render import NOTEBOOKS, run_report

    params = {"investigation_file": str(result), "findings_ledger": None}
    nb = NOTEBOOKS / "05_investigation_template.py"
    log.info("investigation report written to %s", run_report(nb, params, out))


def _commit_range(spec: str, cmd: str) -> tuple[str, str]:
    good, _, bad = spec.partition("..")
    if not good or not bad:
        raise SystemExit(f"{cmd}: --commits wants GOOD..BAD, not {spec!r}")
    return good, bad


def cmd_kernels(args) -> None:
    from engine.registry import UnknownVariantError
    from workbench.studies.kernels import compare_kernels

    try:
        cmp = compare_kernels(args.a, args.b, seed=args.seed, cases=args.cases)
    except UnknownVariantError as e:
        raise SystemExit(f"wb kernels: {e}") from None
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    cmp.table.write_parquet(args.out)
    log.info("%s vs %s: identical=%s within_tolerance=%s max_abs=%s -> %s", cmp.a, cmp.b,
             cmp.identical, cmp.within_tolerance, cmp.max_abs, args.out)


def cmd_demo(args) -> None:
    from workbench.cli import demo

    if args.conversation:
        demo.conversation(args.seed + 3, Path(args.log_dir or tempfile.mkdtemp(prefix="pdwb-demo")))
        return
    for html in demo.investigation(Path(args.reports_dir), args.seed):
        log.info("report: %s", html.resolve())


def cmd_report(args) -> None:
    from workbench.report import run_report

    params = {k: _value(v) for k, v in args.param}
    log.info("report written to %s", run_report(args.notebook, params, args.reports_dir))


def cmd_workloads(args) -> None:
    import polars as pl

    from workbench.drive import list_workloads

    with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=120, tbl_width_chars=200):
        log.info("\n%s", list_workloads())


def cmd_findings(args) -> None:
    import polars as pl

    from workbench.judge import read_findings

    df = read_findings(args.ledger)
    with pl.Config(tbl_rows=-1, fmt_str_lengths=90, tbl_width_chars=220):
        log.info("\n%s", df.select("recorded_at", "title", "held", "failed", "commit", "source"))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        df.write_parquet(args.out)
    held = int(df["held"].sum())
    log.info("%d findings recorded, %d held, %d not supported", df.height, held, df.height - held)


def _names(spec: str) -> list[str]:
    return [n for n in spec.split(",") if n] if spec else []


def _value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "load" and not (args.state or args.url):
        raise SystemExit("wb load: give --state or --url")
    from workbench.report import ReportUnavailable

    try:
        {"up": cmd_up, "load": cmd_load, "dump": cmd_dump, "bisect": cmd_bisect,
         "report": cmd_report, "kernels": cmd_kernels, "findings": cmd_findings,
         "workloads": cmd_workloads, "investigate": cmd_investigate,
         "demo": cmd_demo}[args.cmd](args)
    except ReportUnavailable as exc:
        raise SystemExit(f"wb {args.cmd}: {exc}") from None

