"""``wb``: the workbench probes for scripted runs; results are written as Parquet.

  wb up    --state runs/pair.json [--patches a,b] [--engine k=v ...] [--faults JSON]
           [--router embedded|sglang]
  wb load  (--state runs/pair.json | --url URL) [--workload race_burst] [--sessions 16 ...]
           --out runs/load.parquet
  wb workloads
  wb dump  --state runs/pair.json --room R --out runs/room.safetensors [--diff]
  wb bisect --series hicache_index_k_no_wait,bf16_index_k,... --store runs/bisect.sqlite
  wb bisect --commits GOOD..BAD [--shape S --patches a,b --judge N|all --ends-budget 8]
            [--deployments K --workers N --address HOST:PORT]
  wb investigate [--source DIR --commits GOOD..BAD --judge N|all --report ...]
  wb report NOTEBOOK -p key value ...
  wb kernels --a torch --b triton --out runs/kernels.parquet [--seed 0 --cases 8]
  wb findings [--ledger runs/findings.jsonl] [--out runs/findings.parquet]
"""

from __future__ import annotations

import argparse

from workbench.cli.flags import add_spec_flags, defaults_of, judge_arg
from workbench.drive import LoadConfig
from workbench.investigate import bisect_commits, bisect_patch_series
from workbench.investigate.spec import InvestigationSpec
from workbench.judge import JUDGED_ROOMS

REPORTS_DIR = "reports"
LOAD_DEFAULTS = {name: getattr(LoadConfig, name) for name in
                 ("sessions", "turns", "seed", "kill_fraction", "duration_s", "max_tokens")}
"""``wb load``'s flags and their defaults: ``LoadConfig``'s (spelled there only)."""


def _search_flags(p: argparse.ArgumentParser, max_trials: int | None, helps: str) -> None:
    """``--judge`` and ``--max-trials`` of ``wb bisect`` (``wb investigate``'s come from its
    spec)."""
    p.add_argument("--judge", type=judge_arg, default=JUDGED_ROOMS, help="rooms per burst the "
                   "buffer oracle compares with the reference (a count, or all)")
    p.add_argument("--max-trials", type=int, default=max_trials, help=helps)


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
    bis.add_argument("--commits", metavar="GOOD..BAD", help="commits of --source to bisect")
    bis.add_argument("--source", "--repo", dest="source", default=".",
                     help="the checkout whose commits are bisected (--repo: its old name)")
    bis.add_argument("--shape", help="the load shape of each trial; "
                     + defaults_of(bisect_commits, name="shape"))
    bis.add_argument("--patches", default="",
                     help="patch variants enabled on every candidate commit, comma separated")
    _search_flags(bis, None, "trial budget; "
                  + defaults_of(bisect_commits, bisect_patch_series, name="max_trials"))
    bis.add_argument("--ends-budget", type=int,
                     help="trials the bad end gets to fail once before bisecting (0: no check); "
                     + defaults_of(bisect_commits, bisect_patch_series, name="ends_budget"))
    bis.add_argument("--deployments", type=int, default=1,
                     help="--commits: deployments at once, each round's probes chosen together")
    _where_flags(bis)
    bis.add_argument("--store", default="runs/bisect.sqlite")
    bis.add_argument("--sessions", type=int, help="--series: sessions per burst; "
                     + defaults_of(bisect_patch_series, name="sessions"))
    bis.add_argument("--confidence", type=float,
                     help="posterior a culprit must reach; " + defaults_of(bisect_commits,
                                                                          name="confidence"))
    bis.add_argument("--seed", type=int, help=defaults_of(bisect_commits, name="seed"))
    demo = sub.add_parser("demo", help="the flagship investigation (notebooks 01 and 02) to HTML")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--reports-dir", default=REPORTS_DIR)
    demo.add_argument("--conversation", action="store_true",
                      help="play one agentic tool-call conversation on one server instead")
    demo.add_argument("--log-dir", help="server logs of --conversation (default: a temp dir)")
    rep = sub.add_parser("report")
    rep.add_argument("notebook")
    rep.add_argument("-p", "--param", nargs=2, action="append", default=[],
                     metavar=("KEY", "VALUE"))
    rep.add_argument("--reports-dir", default=REPORTS_DIR)
    inv = sub.add_parser("investigate", help="sweep, localize, optionally bisect; records the "
                                             "findings and writes investigation.txt")
    add_spec_flags(inv, InvestigationSpec)
    inv.add_argument("--reports-dir", default=REPORTS_DIR,
                     help="where investigation.txt and the HTML report go")
    inv.add_argument("--ledger", default="runs/findings.jsonl")
    inv.add_argument("--report", action="store_true",
                     help="also render this result with notebook 05 to HTML (needs the report "
                          "extra; the sweep is not run again)")
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




def _where_flags(p: argparse.ArgumentParser) -> None:
    """Where the work runs (``workbench.scale``)."""
    p.add_argument("--workers", type=int, default=None,
                   help="1: in this process; default: a local Ray cluster of this machine's cores")
    p.add_argument("--address", default=None, help="a Ray cluster's address (or $RAY_ADDRESS)")
