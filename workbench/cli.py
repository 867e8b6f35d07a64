"""``wb``: the workbench probes for scripted runs; results are written as Parquet.

  wb up    --state runs/pair.json [--patches a,b] [--engine k=v ...] [--faults JSON]
           [--router embedded|sglang]
  wb load  (--state runs/pair.json | --url URL) [--workload race_burst] [--sessions 16 ...]
           --out runs/load.parquet
  wb workloads
  wb dump  --state runs/pair.json --room R --out runs/room.safetensors [--diff]
  wb bisect --series hicache_index_k_no_wait,bf16_index_k,... --store runs/bisect.sqlite
  wb report NOTEBOOK -p key value ...
  wb kernels --a torch --b triton --out runs/kernels.parquet [--seed 0 --cases 8]
  wb findings [--ledger runs/findings.jsonl] [--out runs/findings.parquet]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from engine.cli import parse_overrides

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


LOAD_DEFAULTS = {"sessions": 16, "turns": 2, "seed": 0, "kill_fraction": 0.0,
                 "duration_s": 300.0, "max_tokens": 160}


def load_kwargs(args) -> dict:
    """The load's options: the workload's (or ``LOAD_DEFAULTS``), then the flags given."""
    from workbench.drive.workloads import load_workload

    base = load_workload(args.workload).kwargs() if args.workload else dict(LOAD_DEFAULTS)
    given = {k: getattr(args, k) for k in LOAD_DEFAULTS if getattr(args, k) is not None}
    return {**base, **given}


def cmd_load(args) -> None:
    from workbench.drive import inject_concurrency

    target = _pair_from_state(args.state) if args.state else args.url
    res = inject_concurrency(target, **load_kwargs(args), oracle=not args.no_oracle,
                             capture_dir=args.capture_dir)
    res.requests.write_parquet(args.out)
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
    if bool(args.series) == bool(args.commits):
        raise SystemExit("wb bisect: give exactly one of --series A,B,... or --commits GOOD..BAD")
    if args.commits:
        from workbench.investigate import bisect_commits

        good, bad = _commit_range(args.commits, "wb bisect")
        res = bisect_commits(args.repo, good, bad, shape=args.shape, store=args.store,
                             confidence=args.confidence, seed=args.seed,
                             max_trials=args.max_trials)
    else:
        from workbench.investigate import bisect_patch_series

        res = bisect_patch_series(_names(args.series), store=args.store, sessions=args.sessions,
                                  confidence=args.confidence, seed=args.seed)
    res.history.write_parquet(Path(args.store).with_suffix(".history.parquet"))
    log.info("culprit %s (confidence %.3f, %d trials)", res.culprit, res.confidence,
             res.trials_spent)


def cmd_investigate(args) -> None:
    from workbench.investigate import investigate
    from workbench.judge import record_drafts

    if args.report:
        from workbench.report import require_report_extra

        require_report_extra("wb investigate --report")
    good_bad = _commit_range(args.commits, "wb investigate") if args.commits else None
    inv = investigate(args.source, patches=_names(args.patches), seed=args.seed,
                      cap_s=args.cap_s, commits=good_bad, out_dir=args.runs_dir,
                      shapes=_names(args.shapes) or None)
    for f in record_drafts(inv.findings(), replay=inv.replay(), tree=inv.tree,
                           source="wb investigate", ledger=args.ledger):
        log.info("%s", f)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "investigation.txt").write_text(inv.report() + "\n")
    log.info("%s\nwritten to %s", inv.report(), out / "investigation.txt")
    if args.report:
        _notebook_report(args, out)


def _notebook_report(args, out: Path) -> None:
    """Notebook 05 on the same parameters, executed to HTML (it runs the investigation again:
    the same seeds give the same sweep)."""
    from workbench.report.render import NOTEBOOKS, run_report

    params = {"source": args.source, "patches": _names(args.patches), "seed": args.seed,
              "cap_s": args.cap_s, "commits": args.commits, "out_dir": args.runs_dir,
              "findings_ledger": None}
    if args.shapes:
        params["shapes"] = _names(args.shapes)
    nb = NOTEBOOKS / "05_investigation_template.py"
    log.info("investigation report written to %s", run_report(nb, params, out))


def _commit_range(spec: str, cmd: str) -> tuple[str, str]:
    good, _, bad = spec.partition("..")
    if not good or not bad:
        raise SystemExit(f"{cmd}: --commits wants GOOD..BAD, not {spec!r}")
    return good, bad


def cmd_kernels(args) -> None:
    from engine.registry import UnknownVariantError
    from workbench.investigate.kernels import compare_kernels

    try:
        cmp = compare_kernels(args.a, args.b, seed=args.seed, cases=args.cases)
    except UnknownVariantError as e:
        raise SystemExit(f"wb kernels: {e}") from None
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    cmp.table.write_parquet(args.out)
    log.info("%s vs %s: identical=%s within_tolerance=%s max_abs=%s -> %s", cmp.a, cmp.b,
             cmp.identical, cmp.within_tolerance, cmp.max_abs, args.out)


def cmd_report(args) -> None:
    from workbench.report import run_report

    params = {k: _value(v) for k, v in args.param}
    log.info("report written to %s", run_report(args.notebook, params, args.out_dir))


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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="wb", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--state", default="runs/pair.json")
    up.add_argument("--patches", default="")
    up.add_argument("--engine", nargs="*", default=[], metavar="KEY=VALUE")
    up.add_argument("--faults", default="{}")
    up.add_argument("--seed", type=int, default=0)
    up.add_argument("--router", default="embedded", help="embedded (ours) or sglang")
    up.add_argument("--backend", default="embedded",
                    help="embedded (our engine) or vllm (real vLLM over NIXL, make vllm-env)")
    up.add_argument("--hold-s", type=float, default=0.0, help="stop after this long (0: never)")
    load = sub.add_parser("load")
    load.add_argument("--state")
    load.add_argument("--url")
    load.add_argument("--workload", help="a shipped workload name (wb workloads) or a file; "
                                          "the flags below override its fields")
    for name, default in LOAD_DEFAULTS.items():
        load.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=None,
                          help=f"default {default} (without --workload)")
    load.add_argument("--no-oracle", action="store_true")
    load.add_argument("--capture-dir")
    load.add_argument("--out", default="runs/load.parquet")
    dump = sub.add_parser("dump")
    dump.add_argument("--state", required=True)
    dump.add_argument("--room", type=int, required=True)
    dump.add_argument("--role", choices=["decode", "prefill"], default="decode")
    dump.add_argument("--out", default="runs/dump.safetensors")
    dump.add_argument("--diff", action="store_true")
    bis = sub.add_parser("bisect", help="bisect a patch series or a commit range")
    bis.add_argument("--series", help="patch names, comma separated (candidate i enables i)")
    bis.add_argument("--commits", metavar="GOOD..BAD", help="commits of --repo to bisect")
    bis.add_argument("--repo", default=".")
    bis.add_argument("--shape", default="baseline", help="the load shape of each trial")
    bis.add_argument("--max-trials", type=int, default=40)
    bis.add_argument("--store", default="runs/bisect.sqlite")
    bis.add_argument("--sessions", type=int, default=6)
    bis.add_argument("--confidence", type=float, default=0.9)
    bis.add_argument("--seed", type=int, default=0)
    rep = sub.add_parser("report")
    rep.add_argument("notebook")
    rep.add_argument("-p", "--param", nargs=2, action="append", default=[],
                     metavar=("KEY", "VALUE"))
    rep.add_argument("--out-dir", default="reports")
    inv = sub.add_parser("investigate", help="sweep, localize, optionally bisect; records the "
                                             "findings and writes investigation.txt")
    inv.add_argument("--source", help="checkout to investigate (default: this one)")
    inv.add_argument("--patches", default="", help="patch variants to enable, comma separated")
    inv.add_argument("--shapes", default="", help="shapes to sweep (default: all, in order)")
    inv.add_argument("--seed", type=int, default=0)
    inv.add_argument("--cap-s", type=float)
    inv.add_argument("--commits", metavar="GOOD..BAD", help="bisect this range after a hit")
    inv.add_argument("--runs-dir", default="runs/investigate")
    inv.add_argument("--out-dir", default="reports")
    inv.add_argument("--ledger", default="runs/findings.jsonl")
    inv.add_argument("--report", action="store_true",
                     help="also execute notebook 05 to HTML (needs the report extra)")
    ker = sub.add_parser("kernels", help="compare two kernel sets on seeded inputs")
    ker.add_argument("--a", default="torch")
    ker.add_argument("--b", default="triton")
    ker.add_argument("--seed", type=int, default=0)
    ker.add_argument("--cases", type=int, default=8)
    ker.add_argument("--out", default="runs/kernels.parquet")
    sub.add_parser("workloads", help="list the shipped workloads")
    fin = sub.add_parser("findings", help="list the recorded findings (which held, where)")
    fin.add_argument("--ledger", default="runs/findings.jsonl")
    fin.add_argument("--out", help="also write the table as Parquet")
    return ap


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "load" and not (args.state or args.url):
        raise SystemExit("wb load: give --state or --url")
    from workbench.report import ReportUnavailable

    try:
        {"up": cmd_up, "load": cmd_load, "dump": cmd_dump, "bisect": cmd_bisect,
         "report": cmd_report, "kernels": cmd_kernels, "findings": cmd_findings,
         "workloads": cmd_workloads, "investigate": cmd_investigate}[args.cmd](args)
    except ReportUnavailable as exc:
        raise SystemExit(f"wb {args.cmd}: {exc}") from None


if __name__ == "__main__":
    main()
